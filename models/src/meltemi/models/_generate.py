"""Autoregressive generation with a KV cache: batched prompts of different lengths, eos stop.

Prompts are left-padded to a common length; each row keeps its own position ids (its first
real token is position 0) and padded cache slots are masked out, so a prompt's continuation
does not depend on what it was batched with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import meltemi.haliax as hax
from meltemi.models._axes import BATCH, KEY_POSITION, POSITION
from meltemi.models._config import ConfigError
from meltemi.models._sampling import SamplingConfig, sample
from meltemi.models._transformer import Transformer

GREEDY = SamplingConfig()


def _named(arr: jax.Array) -> hax.NamedArray:
    return hax.named(arr, (hax.Axis(BATCH, arr.shape[0]), hax.Axis(POSITION, arr.shape[1])))


@eqx.filter_jit
def _prefill(model, tokens, positions, kv_valid, cache, key, sampling):
    valid = hax.named(
        kv_valid, (hax.Axis(BATCH, kv_valid.shape[0]), cache.k.resolve_axis(KEY_POSITION))
    )
    logits, cache = model.decode(
        _named(tokens), cache, positions=_named(positions), cache_index=0, kv_valid=valid
    )
    last = logits.rearrange((BATCH, POSITION, "vocab")).array[:, -1, :]
    return sample(last, key, sampling), cache


@eqx.filter_jit
def _step(model, token, position, index, kv_valid, cache, key, sampling):
    kv_valid = kv_valid.at[:, index].set(True)
    valid = hax.named(
        kv_valid, (hax.Axis(BATCH, kv_valid.shape[0]), cache.k.resolve_axis(KEY_POSITION))
    )
    logits, cache = model.decode(
        _named(token[:, None]),
        cache,
        positions=_named(position[:, None]),
        cache_index=index,
        kv_valid=valid,
    )
    return (
        sample(logits.rearrange((BATCH, POSITION, "vocab")).array[:, 0, :], key, sampling),
        cache,
        kv_valid,
    )


@eqx.filter_jit
def _recompute(model, tokens, segment_ids, positions, index, key, sampling):
    logits = model(tokens, segment_ids=segment_ids, positions=positions)
    row = jax.lax.dynamic_index_in_dim(
        logits.rearrange((BATCH, POSITION, "vocab")).array, index, axis=1, keepdims=False
    )
    return sample(row, key, sampling)


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
) -> list[list[int]]:
    """Continues each prompt by up to `max_new_tokens` tokens.

    Args:
        model: the model.
        prompts: token id lists (at least one token each; lengths may differ).
        max_new_tokens: length bound of each continuation.
        sampling: greedy (default), or temperature / top-k / top-p sampling.
        eos_token_id: stop a row after it emits this id (or any of these ids); `"config"`
            (default): `model.config.eos_token_id`; `None`: never stop early. The eos token
            is included in the output.
        key: PRNG key, required unless greedy.
        pad_token_id: filler for padding and finished rows (never attended to).
        use_cache: decode with the KV cache (default), or recompute the whole sequence at each
            step (slow; a reference for tests and benchmarks).

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
    eos = config.eos_token_id if eos_token_id == "config" else eos_token_id
    eos_ids = set() if eos is None else ({eos} if isinstance(eos, int) else set(eos))
    if not sampling.greedy and key is None:
        raise ConfigError(
            f"generate: sampling with temperature={sampling.temperature} needs key=..., e.g. "
            "key=jax.random.key(0)"
        )
    key = jax.random.key(0) if key is None else key
    batch = len(prompts)
    longest = max(len(p) for p in prompts)
    total = longest + max_new_tokens
    if total > config.max_seq_len:
        raise ConfigError(
            f"generate: prompt length + max_new_tokens = {total} exceeds the model's "
            f"max_seq_len={config.max_seq_len}; shorten the prompt or lower max_new_tokens"
        )
    pads = np.array([longest - len(p) for p in prompts])
    tokens = np.full((batch, total), pad_token_id, np.int32)
    for b, p in enumerate(prompts):
        tokens[b, pads[b] : longest] = np.asarray(p, np.int32)
    slots = np.arange(total)[None, :]
    positions = np.maximum(slots - pads[:, None], 0).astype(np.int32)
    real = slots >= pads[:, None]

    out: list[list[int]] = [[] for _ in prompts]
    done = np.zeros(batch, bool)

    def record(next_tokens: np.ndarray) -> None:
        for b in range(batch):
            if not done[b]:
                out[b].append(int(next_tokens[b]))
                done[b] = int(next_tokens[b]) in eos_ids

    keys = jax.random.split(key, max_new_tokens)
    if use_cache:
        cache = model.init_cache(batch, total)
        kv_valid = jnp.asarray(real & (slots < longest))
        nxt, cache = _prefill(
            model,
            jnp.asarray(tokens[:, :longest]),
            jnp.asarray(positions[:, :longest]),
            kv_valid,
            cache,
            keys[0],
            sampling,
        )
        for t in range(max_new_tokens):
            nxt_np = np.asarray(nxt)
            record(nxt_np)
            if done.all() or t == max_new_tokens - 1:
                break
            tok = np.where(done, pad_token_id, nxt_np).astype(np.int32)
            nxt, cache, kv_valid = _step(
                model,
                jnp.asarray(tok),
                jnp.asarray(positions[:, longest + t]),
                jnp.asarray(longest + t, jnp.int32),
                kv_valid,
                cache,
                keys[t + 1],
                sampling,
            )
        return out
    segment_ids = np.where(real, 0, -1).astype(np.int32)
    for t in range(max_new_tokens):
        nxt = np.asarray(
            _recompute(
                model,
                jnp.asarray(tokens),
                jnp.asarray(segment_ids),
                jnp.asarray(positions),
                jnp.asarray(longest - 1 + t, jnp.int32),
                keys[t],
                sampling,
            )
        )
        record(nxt)
        if done.all() or t == max_new_tokens - 1:
            break
        tokens[:, longest + t] = np.where(done, pad_token_id, nxt)
    return out
