"""Autoregressive generation as one compiled program: prefill, then the whole decode loop.

Prompts are left-padded to a common length; each row keeps its own position ids (its first
real token is position 0) and padded cache slots are masked out, so a prompt's continuation
does not depend on what it was batched with. The prefill and a `jax.lax.while_loop` over the
new tokens (sampling included, stopping when every row has emitted an eos id) run inside one
`jit`; the host sees only the finished `(batch, new tokens)` array.

Shapes are bucketed so a handful of compiles serve every request: the padded prompt length
and the new-token budget are rounded up to powers of two (at least `MIN_BUCKET`), the batch to
a power of two that the mesh's batch split divides. The budget itself is a traced value, so
`max_new_tokens=37` and `=64` run the same program.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import meltemi.haliax as hax
import meltemi.haliax.nn as hnn
from meltemi.haliax import partitioning
from meltemi.haliax.quantization import DefaultDotGeneralOp
from meltemi.models import _native
from meltemi.models._axes import BATCH, HEAD_SIZE, KEY_POSITION, KV_HEADS, POSITION
from meltemi.models._config import ConfigError
from meltemi.models._layers import LayerCache, constrain
from meltemi.models._sampling import SamplingConfig, sample_rows
from meltemi.models._transformer import Transformer

GREEDY = SamplingConfig()
MIN_BUCKET = 16
"""Smallest padded prompt length and new-token budget (shorter ones share its program)."""

_CACHE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def bucket(n: int, minimum: int = MIN_BUCKET, multiple: int = 1) -> int:
    """The bucket `n` is padded to: the next power of two >= `max(n, minimum)`, rounded up
    to a multiple of `multiple`.

    >>> [bucket(n) for n in (1, 16, 17, 100)], bucket(3, 1, multiple=8)
    ([16, 16, 32, 128], 8)
    """
    size = 1 << (max(n, minimum) - 1).bit_length()
    return -(-size // multiple) * multiple


def _is_named(x: Any) -> bool:
    return isinstance(x, hax.NamedArray)


def _named(arr: jax.Array) -> hax.NamedArray:
    return hax.named(arr, (hax.Axis(BATCH, arr.shape[0]), hax.Axis(POSITION, arr.shape[1])))


SMALL_ROWS = 32
"""Products with at most this many activation rows (decoding steps) run weight-first."""


class _WeightFirstDot(eqx.Module):
    """`jax.lax.dot_general(x, w, ...)` computed as `dot_general(w, x, ...)`, transposed back,
    when `x` has at most `SMALL_ROWS` rows (a decoding step); otherwise as given.

    XLA:CPU runs `x[M, K] @ w[K, N]` with few rows `M` far from the weights' read bound:
    the products of a 162M model's 12 layers and head, timed in one process under load, took
    80 ms at 8 rows in that order, 41 ms as `w[N, K] @ x.T` with the weight stored `Out + In`,
    and 31 ms either way at one row. The barrier keeps XLA from folding the transpose back
    into the product (which restores the slow order). Same products, summed in another
    order: results agree to float32 rounding.
    """

    def __call__(
        self,
        lhs: jax.Array,
        rhs: jax.Array,
        dimension_numbers: Any,
        precision: Any = None,
        preferred_element_type: Any = None,
        **kwargs: Any,
    ) -> jax.Array:
        (lc, rc), (lb, rb) = dimension_numbers
        free = [d for d in range(lhs.ndim) if d not in lc and d not in lb]
        if lb or int(np.prod([lhs.shape[d] for d in free])) > SMALL_ROWS:
            return jax.lax.dot_general(
                lhs, rhs, dimension_numbers, precision, preferred_element_type, **kwargs
            )
        out = jax.lax.dot_general(rhs, lhs, ((rc, lc), (rb, lb)), precision, preferred_element_type)
        out = jax.lax.optimization_barrier(out)
        n_rhs = out.ndim - len(free)
        return out.transpose((*range(n_rhs, out.ndim), *range(n_rhs)))


def _weights_out_first(model: Transformer) -> Transformer:
    """Every float32 `Linear` as a `_native.PackedLinear` (panel layout, the native kernel)
    when `_native_products()`; otherwise its weight stored `Out + In` (PyTorch's layout) and
    multiplied weight-first by `_WeightFirstDot`. Once, before the loop.

    A decoding step multiplies a few rows by every weight, so it is bound by reading them.
    At 162M (12 layers' products, one process, nothing else running) XLA's dot read them at
    25 GB/s at 1 row and 18.4 at 8 rows, the native kernel at 29 and 26.6, beside a
    `jnp.sum` at 25-27. Without the kernel, XLA:CPU reads the weights best in the order
    `_WeightFirstDot` uses (the contracted `In` innermost). Linear contracts by axis name, so
    only the memory order changes. Only on the CPU: GPU and TPU matmul libraries pick their
    own order, and the barrier would only stop XLA from fusing around the product there.
    """
    if jax.default_backend() != "cpu":
        return model
    native = _native_products()

    def fix(layer):
        if not isinstance(layer, hnn.Linear):
            return layer
        default_product = isinstance(layer.dot_general, DefaultDotGeneralOp)
        if native and default_product and layer.weight.dtype == jnp.float32:
            return _native.PackedLinear.from_linear(layer)
        names = [a.name for a in hax.concat_axes(layer.Out, layer.In)]
        if [a.name for a in layer.weight.axes] != names:  # else keep the array (no copy)
            layer = eqx.tree_at(lambda m: m.weight, layer, layer.weight.rearrange(names))
        if not default_product:
            return layer  # a quantized or otherwise custom product keeps its own
        return eqx.tree_at(lambda m: m.dot_general, layer, _WeightFirstDot())

    return jax.tree.map(fix, model, is_leaf=lambda x: isinstance(x, hnn.Linear))


def _native_products() -> bool:
    """Whether decoding copies multiply with `_native.PackedLinear` (`_native.usable`; a
    function of its own so tests can turn it off)."""
    return _native.usable()


def _values_position_last(cache: LayerCache) -> LayerCache:
    """The layer's value cache stored `(batch, kv_heads, head_size, key_position)`.

    Attention contracts the values over `key_position`; with it innermost XLA:CPU runs the
    product on its library matmul kernel, where `(..., key_position, head_size)` falls back to a
    plain loop (in a profile at batch 8: ~2.7x slower, and the 4 layers' products were the
    largest ops of the step). Attention works by axis name, so only the memory order changes;
    the keys keep `head_size` innermost (contracted with the queries).
    """
    order = (BATCH, KV_HEADS, HEAD_SIZE, KEY_POSITION)
    return LayerCache(cache.k, cache.v.rearrange(order))


def _blocks_for_decoding(blocks: Any) -> Any:
    """The layers unstacked (each step then reads every layer's weights where they are;
    slicing a stacked layer inside the loop copies it at every step on CPU), weights `Out + In`
    (`_weights_out_first`)."""
    if isinstance(blocks, hnn.Stacked):
        blocks = hnn.BlockSeq(blocks.unstacked(), blocks.Block, blocks.gradient_checkpointing)
    return _weights_out_first(blocks)


_prepare_blocks = eqx.filter_jit(_blocks_for_decoding)


def _for_decoding(model: Transformer) -> Transformer:
    """The model as a decoding step reads it: `_blocks_for_decoding`, and on the CPU a tied
    head as a `Linear` over the embedding table (`vocab, embed`: already `Out + In`), so the
    head too multiplies weight-first (with the native kernel: a packed copy of the table).
    Only the memory order changes, so the tokens are the same; on a model already in this
    form it changes nothing."""
    model = eqx.tree_at(lambda m: m.blocks, model, _blocks_for_decoding(model.blocks))
    if model.lm_head is None and jax.default_backend() == "cpu":
        embed = model.embed  # `Embedding.unembed` is the same product, in the plain order
        head = hnn.Linear(embed.weight, None, embed.Embed, embed.Vocab)
        model = eqx.tree_at(lambda m: m.lm_head, model, head, is_leaf=lambda x: x is None)
    return _weights_out_first(model)


_PREPARED: list[tuple[weakref.ref, Transformer]] = []
"""`_decoding_model`'s one entry: (the source model, its `_for_decoding` copy)."""


def _decoding_model(model: Transformer) -> Transformer:
    """`_for_decoding(model)`, computed once per model object and kept while that object lives.

    Rearranging inside the compiled loop redid it at every call: at 162M (12 layers, bs1, 32
    new tokens) the unstacking copies took ~0.3 s of a 1.6 s call, ~10 ms per token. The
    blocks are copied, and with the native kernel the head too (packed; a tied table then has
    a packed copy); the embedding table keeps the model's array. The copy is held until
    `model` is garbage-collected or `generate` is called with another model, so a model that
    generates keeps a second copy of its weights in that time (each call held one before,
    too). Models are immutable, so the object's identity is a safe key while it lives.
    """
    if _PREPARED and _PREPARED[0][0]() is model:
        return _PREPARED[0][1]
    # The rest (embedding table, head, norms) keeps the model's own arrays: `_for_decoding`
    # then only wraps a tied table as a head and rearranges or packs the head.
    blocks = _prepare_blocks(model.blocks)
    prepared = _for_decoding(eqx.tree_at(lambda m: m.blocks, model, blocks))

    def forget(ref: weakref.ref) -> None:
        if _PREPARED and _PREPARED[0][0] is ref:
            _PREPARED.clear()

    _PREPARED[:] = [(weakref.ref(model, forget), prepared)]
    return prepared


def _decode_step(model, cache, token, t, key, valid, lengths, prompt_len, sampling):
    """New token `t` of every row (sampled from the logits of `token`, the previous one) and
    the cache with `token`'s keys and values written at slot `prompt_len + t - 1`."""
    logits, cache = model.decode(
        _named(token[:, None]),
        cache,
        positions=_named((lengths + t - 1)[:, None]),
        cache_index=prompt_len + t - 1,
        kv_valid=valid,
    )
    nxt = sample_rows(logits.rearrange((BATCH, POSITION, "vocab")).array[:, 0], key, t, sampling)
    return nxt, cache


class _CacheCarry(eqx.Module):
    """The KV cache as the flat arrays a decoding loop carries (or a step is given, donated):
    at batch 1 without the batch axis.

    With it, XLA:CPU gives each cache update two consumers of different shapes (the attention
    product drops the size-1 axis), duplicates the update into both and copies the whole
    cache ~4 times a step: 22% of a 512-token call at 162M. Without it, both see one shape.
    """

    treedef: Any = eqx.field(static=True)
    axes: tuple = eqx.field(static=True)
    squeeze: bool = eqx.field(static=True)

    @staticmethod
    def of(cache: Any) -> _CacheCarry:
        leaves, treedef = jax.tree.flatten(cache, is_leaf=_is_named)
        axes = tuple(leaf.axes for leaf in leaves)
        return _CacheCarry(treedef, axes, leaves[0].axis_size(BATCH) == 1)

    def arrays(self, cache: Any) -> list[jax.Array]:
        arrays = [leaf.array for leaf in jax.tree.leaves(cache, is_leaf=_is_named)]
        return [a[0] for a in arrays] if self.squeeze else arrays

    def cache(self, arrays: Sequence[jax.Array]) -> Any:
        arrays = [a[None] for a in arrays] if self.squeeze else list(arrays)
        named = [hax.named(a, ax) for a, ax in zip(arrays, self.axes)]
        return jax.tree.unflatten(self.treedef, named)


def _decode_loop(
    model: Transformer,
    tokens: jax.Array,
    pads: jax.Array,
    max_new: jax.Array,
    eos: jax.Array,
    key: jax.Array,
    pad_token_id: jax.Array,
    sampling: SamplingConfig,
    new_bucket: int,
    cache_dtype: Any,
) -> tuple[jax.Array, jax.Array]:
    """Prefill `tokens` (left-padded by `pads`), then decode up to `max_new` tokens per row.

    Returns the `(batch, new_bucket)` new tokens (`pad_token_id` after a row's eos and past
    `max_new`) and the number of decode steps run.
    """
    batch, prompt_len = tokens.shape
    model = _for_decoding(model)  # a no-op on `_decoding_model`'s output (`generate` passes it)
    slots = prompt_len + new_bucket
    KPos = hax.Axis(KEY_POSITION, slots)  # noqa: N806
    # Padded slots never hold a real key; slots after the current one are masked by causality,
    # so this mask is the same for every step.
    valid = hax.named(jnp.arange(slots)[None, :] >= pads[:, None], (hax.Axis(BATCH, batch), KPos))
    cache = tuple(
        _values_position_last(c)
        for c in model.init_cache(batch, slots, cache_dtype, per_layer=True)
    )
    cache = jax.tree.map(constrain, cache, is_leaf=lambda x: isinstance(x, hax.NamedArray))
    positions = jnp.maximum(jnp.arange(prompt_len)[None, :] - pads[:, None], 0)
    logits, cache = model.decode(
        _named(tokens), cache, positions=_named(positions), cache_index=0, kv_valid=valid
    )
    last = logits.rearrange((BATCH, POSITION, "vocab")).array[:, -1, :]
    first = sample_rows(last, key, 0, sampling)
    out = jnp.full((batch, new_bucket), pad_token_id, jnp.int32).at[:, 0].set(first)
    done = jnp.isin(first, eos)
    lengths = prompt_len - pads

    def cond(state):
        t, _, _, done, _ = state
        return (t < max_new) & ~jnp.all(done)

    carry = _CacheCarry.of(cache)

    def body(state):
        t, arrays, token, done, out = state
        nxt, cache = _decode_step(
            model, carry.cache(arrays), token, t, key, valid, lengths, prompt_len, sampling
        )
        nxt = jnp.where(done, pad_token_id, nxt)
        out = jax.lax.dynamic_update_slice(out, nxt[:, None], (0, t))
        return t + 1, carry.arrays(cache), nxt, done | jnp.isin(nxt, eos), out

    state = (jnp.asarray(1, jnp.int32), carry.arrays(cache), first, done, out)
    steps, _, _, _, out = jax.lax.while_loop(cond, body, state)
    return out, steps


@eqx.filter_jit
def _compiled(model, tokens, pads, max_new, eos, key, pad_token_id, static):
    sampling, new_bucket, cache_dtype, mapping = static
    # The axis mapping is read at trace time; it is part of `static`, hence of the jit key.
    context = contextlib.nullcontext() if mapping is None else hax.axis_mapping(dict(mapping))
    with context:
        return _decode_loop(
            model, tokens, pads, max_new, eos, key, pad_token_id, sampling, new_bucket, cache_dtype
        )


@eqx.filter_jit
def _recompute(model, tokens, segment_ids, positions, index, key, step, sampling):
    logits = model(tokens, segment_ids=segment_ids, positions=positions)
    row = jax.lax.dynamic_index_in_dim(
        logits.rearrange((BATCH, POSITION, "vocab")).array, index, axis=1, keepdims=False
    )
    return sample_rows(row, key, step, sampling)


def _eos_ids(eos: int | Sequence[int] | None) -> np.ndarray:
    ids = [] if eos is None else [eos] if isinstance(eos, int | np.integer) else list(eos)
    # Padded with -1 (never emitted) to a power of two, so lists of 1-4 ids share a program.
    return np.array(ids + [-1] * (bucket(len(ids), 4) - len(ids)), np.int32)


def _batch_multiple() -> int:
    """How many ways the active axis mapping splits `batch` on the current mesh."""
    if partitioning.current_thread_local_mapping() is None:
        return 1
    return partitioning.physical_axis_size(BATCH)


def _frozen_mapping() -> tuple | None:
    mapping = partitioning.current_thread_local_mapping()
    if mapping is None:
        return None
    return tuple(
        sorted((k, v if v is None or isinstance(v, str) else tuple(v)) for k, v in mapping.items())
    )


def _cut(row: np.ndarray, n: int, eos: np.ndarray) -> list[int]:
    out = row[:n].tolist()
    for i, tok in enumerate(out):
        if tok in eos:
            return out[: i + 1]
    return out


def generate(
    model: Transformer,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    sampling: SamplingConfig = GREEDY,
    eos_token_id: int | Sequence[int] | None | Literal["config"] = "config",
    key: jax.Array | None = None,
    pad_token_id: int = 0,
    use_cache: bool = True,
    cache_dtype: Any = None,
) -> list[list[int]]:
    """Continues each prompt by up to `max_new_tokens` tokens.

    With the cache (default), prefill and the whole decode loop are one compiled program;
    lengths are bucketed (see the module docstring), so new lengths rarely compile. Under
    `jax.set_mesh(mesh)` and `hax.axis_mapping(...)` a sharded model generates sharded: the
    KV cache and activations follow the mapping (`batch` over the data axes, `kv_heads` over
    the tensor axis, ...).

    Args:
        model: the model.
        prompts: token id lists (at least one token each; lengths may differ).
        max_new_tokens: length bound of each continuation.
        sampling: greedy (default), or temperature / top-k / top-p sampling.
        eos_token_id: stop a row after it emits this id (or any of these ids); `"config"`
            (default): `model.config.eos_token_id`; `None`: never stop early. The eos token
            is included in the output.
        key: PRNG key, required unless greedy. Row `b`'s token `t` is drawn with
            `fold_in(fold_in(key, t), b)`, so a fixed key reproduces the output whatever the
            batch is padded to.
        pad_token_id: filler for padding and finished rows (never attended to).
        use_cache: decode with the KV cache (default), or recompute the whole sequence at each
            step in a Python loop (slow; a reference for tests and benchmarks).
        cache_dtype: dtype of the KV cache (`jnp.bfloat16` or `"bfloat16"` halves its memory);
            default: the embeddings' dtype.

    Returns:
        The generated tokens of each prompt (without the prompt).

    >>> import jax, numpy as np
    >>> import meltemi.models as mm
    >>> cfg = mm.get_preset("tiny-llama")
    >>> shapes = jax.eval_shape(lambda k: mm.init(cfg, key=k), jax.random.key(0))
    >>> rng = np.random.default_rng(0)  # random weights without compiling an initialiser
    >>> model = jax.tree.map(lambda s: rng.normal(0, 0.2, s.shape).astype(s.dtype), shapes)
    >>> out = mm.generate(model, [[5, 6, 7], [8]], max_new_tokens=4, eos_token_id=None)
    >>> [len(o) for o in out]
    [4, 4]
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ConfigError("generate: every prompt needs at least one token (got an empty one)")
    if max_new_tokens < 1:
        raise ConfigError(f"generate: max_new_tokens={max_new_tokens} must be >= 1")
    config = model.config
    eos = _eos_ids(config.eos_token_id if eos_token_id == "config" else eos_token_id)
    if not sampling.greedy and key is None:
        raise ConfigError(
            f"generate: sampling with temperature={sampling.temperature} needs key=..., e.g. "
            "key=jax.random.key(0)"
        )
    if isinstance(cache_dtype, str):
        if cache_dtype not in _CACHE_DTYPES:
            raise ConfigError(
                f"generate: cache_dtype={cache_dtype!r} is not one of {sorted(_CACHE_DTYPES)}; "
                "e.g. cache_dtype='bfloat16'"
            )
        cache_dtype = _CACHE_DTYPES[cache_dtype]
    key = jax.random.key(0) if key is None else key
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens > config.max_seq_len:
        raise ConfigError(
            f"generate: prompt length + max_new_tokens = {longest + max_new_tokens} exceeds the "
            f"model's max_seq_len={config.max_seq_len}; shorten the prompt or lower "
            "max_new_tokens"
        )
    if not use_cache:
        return _generate_recompute(model, prompts, max_new_tokens, sampling, eos, key, pad_token_id)
    batch = bucket(len(prompts), 1, multiple=_batch_multiple())
    width = bucket(longest)
    tokens = np.full((batch, width), pad_token_id, np.int32)
    pads = np.full(batch, width - 1, np.int32)  # filler rows: one pad token as the prompt
    for b, p in enumerate(prompts):
        tokens[b, width - len(p) :] = np.asarray(p, np.int32)
        pads[b] = width - len(p)
    static = (sampling, bucket(max_new_tokens), cache_dtype, _frozen_mapping())
    out, _ = _compiled(
        _decoding_model(model),
        tokens,
        pads,
        np.asarray(max_new_tokens, np.int32),
        eos,
        key,
        np.asarray(pad_token_id, np.int32),
        static,
    )
    out = np.asarray(out)
    return [_cut(out[b], max_new_tokens, eos) for b in range(len(prompts))]


def _generate_recompute(model, prompts, max_new_tokens, sampling, eos, key, pad_token_id):
    """The reference path: the full sequence through the model at every step (no cache)."""
    batch = len(prompts)
    longest = max(len(p) for p in prompts)
    total = longest + max_new_tokens
    pads = np.array([longest - len(p) for p in prompts])
    tokens = np.full((batch, total), pad_token_id, np.int32)
    for b, p in enumerate(prompts):
        tokens[b, pads[b] : longest] = np.asarray(p, np.int32)
    slots = np.arange(total)[None, :]
    positions = np.maximum(slots - pads[:, None], 0).astype(np.int32)
    segment_ids = np.where(slots >= pads[:, None], 0, -1).astype(np.int32)
    out: list[list[int]] = [[] for _ in prompts]
    done = np.zeros(batch, bool)
    for t in range(max_new_tokens):
        nxt = np.asarray(
            _recompute(
                model,
                jnp.asarray(tokens),
                jnp.asarray(segment_ids),
                jnp.asarray(positions),
                jnp.asarray(longest - 1 + t, jnp.int32),
                key,
                jnp.asarray(t, jnp.int32),
                sampling,
            )
        )
        for b in range(batch):
            if not done[b]:
                out[b].append(int(nxt[b]))
                done[b] = int(nxt[b]) in eos
        if done.all():
            break
        tokens[:, longest + t] = np.where(done, pad_token_id, nxt)
    return out


# -- streaming: the same prefill and decoding step, one compiled step per token -------------------


@eqx.filter_jit
def _stream_prefill(model, tokens, pads, key, static):
    sampling, new_bucket, cache_dtype = static
    batch, prompt_len = tokens.shape
    KPos = hax.Axis(KEY_POSITION, prompt_len + new_bucket)  # noqa: N806
    valid = hax.named(
        jnp.arange(KPos.size)[None, :] >= pads[:, None], (hax.Axis(BATCH, batch), KPos)
    )
    cache = tuple(
        _values_position_last(c)
        for c in model.init_cache(batch, KPos.size, cache_dtype, per_layer=True)
    )
    cache = jax.tree.map(constrain, cache, is_leaf=lambda x: isinstance(x, hax.NamedArray))
    positions = jnp.maximum(jnp.arange(prompt_len)[None, :] - pads[:, None], 0)
    logits, cache = model.decode(
        _named(tokens), cache, positions=_named(positions), cache_index=0, kv_valid=valid
    )
    last = logits.rearrange((BATCH, POSITION, "vocab")).array[:, -1, :]
    return sample_rows(last, key, 0, sampling), cache, valid


# The cache and the step counter are donated: each step updates the cache in place. The
# previous token is not (the host still reads it while this step runs). The cache travels as
# `_CacheCarry` arrays (at batch 1 without the batch axis: no whole-cache copies per step).
@eqx.filter_jit(donate="all-except-first")
def _stream_step(consts, arrays, t):
    model, key, valid, lengths, sampling, prompt_len, carry, token = consts
    nxt, cache = _decode_step(
        model, carry.cache(arrays), token, t, key, valid, lengths, prompt_len, sampling
    )
    return nxt, carry.arrays(cache)


class TokenStream:
    """Generation one token at a time, for printing tokens as they are produced.

    The prompt is prefilled once (one compiled program per prompt-length bucket), then each
    new token is one compiled decoding step with the KV cache (one program per cache size:
    prompt bucket + `bucket(max_new_tokens)`), so new lengths in a bucket never compile. The
    steps are `generate`'s own (same padding, positions, cache layout and sampling keys): with
    the same arguments the tokens are those of `generate`, greedy or sampled. Step `t + 1` is
    queued before token `t` is read, so the device works while the host yields; what remains
    is about 1 ms of dispatch per token on CPU, which the while-loop of `generate` does not pay.

    Args:
        model: the model (rearranged for decoding once, here, not at every call).
        cache_dtype: dtype of the KV cache (see `generate`).

    >>> import jax, numpy as np
    >>> import meltemi.models as mm
    >>> cfg = mm.get_preset("tiny-llama")
    >>> shapes = jax.eval_shape(lambda k: mm.init(cfg, key=k), jax.random.key(0))
    >>> rng = np.random.default_rng(0)
    >>> model = jax.tree.map(lambda s: rng.normal(0, 0.2, s.shape).astype(s.dtype), shapes)
    >>> from meltemi.models.chat import TokenStream
    >>> stream = TokenStream(model)
    >>> toks = list(stream([5, 6, 7], max_new_tokens=4, eos_token_id=None))
    >>> toks == mm.generate(model, [[5, 6, 7]], max_new_tokens=4, eos_token_id=None)[0]
    True
    """

    def __init__(self, model: Transformer, *, cache_dtype: Any = None):
        if isinstance(cache_dtype, str):
            if cache_dtype not in _CACHE_DTYPES:
                raise ConfigError(
                    f"TokenStream: cache_dtype={cache_dtype!r} is not one of "
                    f"{sorted(_CACHE_DTYPES)}; e.g. cache_dtype='bfloat16'"
                )
            cache_dtype = _CACHE_DTYPES[cache_dtype]
        self.config = model.config
        self._model = _decoding_model(model)
        self._cache_dtype = cache_dtype

    def __call__(
        self,
        prompt: Sequence[int],
        *,
        max_new_tokens: int,
        sampling: SamplingConfig = GREEDY,
        eos_token_id: int | Sequence[int] | None | Literal["config"] = "config",
        key: jax.Array | None = None,
    ) -> Iterator[int]:
        """Yields the continuation of `prompt` token by token, the eos token included (as
        `generate` returns it), stopping after an eos id or `max_new_tokens` tokens.

        Arguments as in `generate` (one prompt). Raises `ConfigError` up front, before the
        first token, for an empty prompt, a budget below one, a missing key or a prompt plus
        budget longer than `max_seq_len`.
        """
        if len(prompt) == 0:
            raise ConfigError("TokenStream: the prompt needs at least one token (got none)")
        if max_new_tokens < 1:
            raise ConfigError(f"TokenStream: max_new_tokens={max_new_tokens} must be >= 1")
        if not sampling.greedy and key is None:
            raise ConfigError(
                f"TokenStream: sampling with temperature={sampling.temperature} needs key=..., "
                "e.g. key=jax.random.key(0)"
            )
        if len(prompt) + max_new_tokens > self.config.max_seq_len:
            raise ConfigError(
                f"TokenStream: prompt length + max_new_tokens = {len(prompt) + max_new_tokens} "
                f"exceeds the model's max_seq_len={self.config.max_seq_len}; shorten the "
                "conversation or lower max_new_tokens"
            )
        eos = set(_eos_ids(self.config.eos_token_id if eos_token_id == "config" else eos_token_id))
        return self._tokens(list(prompt), max_new_tokens, sampling, eos, key)

    def _tokens(self, prompt, max_new_tokens, sampling, eos, key) -> Iterator[int]:
        key = jax.random.key(0) if key is None else key
        width = bucket(len(prompt))
        tokens = np.zeros((1, width), np.int32)
        tokens[0, width - len(prompt) :] = prompt
        pads = np.array([width - len(prompt)], np.int32)
        static = (sampling, bucket(max_new_tokens), self._cache_dtype)
        token, cache, valid = _stream_prefill(self._model, tokens, pads, key, static)
        lengths = jnp.asarray([len(prompt)], jnp.int32)
        carry = _CacheCarry.of(cache)
        cache = carry.arrays(cache)
        consts = (self._model, key, valid, lengths, sampling, width, carry)
        for t in range(1, max_new_tokens + 1):
            # Queue the next step before reading this token: the device computes token t + 1
            # while the host converts and yields token t (one step past an eos is wasted).
            if t < max_new_tokens:
                nxt, cache = _stream_step((*consts, token), cache, jnp.asarray(t, jnp.int32))
            tok = int(np.asarray(token)[0])
            yield tok
            if tok in eos or t == max_new_tokens:
                return
            token = nxt


def generate_stream(
    model: Transformer, prompt: Sequence[int], *, max_new_tokens: int, **kwargs: Any
) -> Iterator[int]:
    """`TokenStream(model)(prompt, ...)`: the continuation of one prompt, token by token.

    Keyword arguments as in `generate` (`sampling`, `eos_token_id`, `key`, `cache_dtype`).
    """
    cache_dtype = kwargs.pop("cache_dtype", None)
    return TokenStream(model, cache_dtype=cache_dtype)(
        prompt, max_new_tokens=max_new_tokens, **kwargs
    )
