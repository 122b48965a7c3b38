"""Attention backends: one mask description, three kernels (`ModelConfig.attention_backend`).

| backend | kernel | where | notes |
|---|---|---|---|
| `xla` | `softmax(q.k * scale) . v` by name | everywhere | query blocks |
| `dot_product_attention` | `jax.nn.dot_product_attention` | everywhere | cuDNN on GPU (bf16/fp16) |
| `splash` | Pallas TPU splash attention | TPU only | sequences a multiple of 128 |
| `auto` | splash on TPU, cuDNN on GPU, xla on CPU | | |

Every backend computes the same function: causal attention within a segment (packed
documents), optionally restricted to a sliding window (a query at slot `i` sees the keys at
slots `j` with `i - j < window`, as in Hugging Face), with optional logit soft-capping
(`cap * tanh(logits / cap)`) and a logit scale. `MaskSpec` describes the mask without
materialising it, so each kernel builds only what it needs (a dense mask, `is_causal` plus a
window, or a splash mask object). Where a kernel cannot express a case it defers to `xla`:
`jax.nn.dot_product_attention` has no soft-cap argument, and splash needs whole query blocks,
so a decoding step (one query against a KV cache) runs on `xla` under both.

A layer's window is either static (every layer alike) or, for models that alternate local
and global layers inside one scanned stack (Gemma 2/3), a traced per-layer flag `sliding`;
the fused kernels then run under `jax.lax.cond` between their two static variants.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

import meltemi.haliax as hax
from meltemi.haliax import partitioning
from meltemi.haliax.nn.attention import dot_product_attention
from meltemi.models._axes import (
    BATCH,
    HEAD_SIZE,
    KEY_POSITION,
    KV_HEADS,
    POSITION,
    Q_HEADS_PER_GROUP,
)
from meltemi.models._config import ConfigError
from meltemi.models._context_parallel import sequence_split, split_attention

SPLASH_BLOCK = 128
"""Splash's query/key block: sequences must be a multiple of it (`auto` falls back to xla)."""

_SPLASH_INTERPRET = False
"""Run the splash kernel in Pallas' interpreter (tests on CPU only; never on a TPU)."""


def _platform() -> str:
    """The platform the computation runs on (`cpu`, `gpu`, `tpu`); patched by tests."""
    return jax.default_backend()


class MaskSpec(eqx.Module):
    """What each query may attend to, before any window is applied.

    Attributes:
        q_index: slot of each query, over `(batch?, position)` (the training path: `arange`;
            a decoding step: `cache_index + arange`).
        k_index: slot of each key, over `key_position`.
        segment_ids: query segment ids over `(batch, position)` (packed documents), or None.
        kv_segment_ids: key segment ids over `(batch, key_position)`, or None.
        kv_valid: `(batch, key_position)` bool, cache slots holding real tokens, or None.
        aligned: queries and keys are the same positions (`q_index == k_index == arange`),
            so fused kernels may use their own causal mask.
        sequence_parallel: `ModelConfig.sequence_parallel`: with `position` split over a mesh
            axis, self-attention runs `_context_parallel.split_attention` (the slots may then
            be in load-balanced order; `q_index` / `k_index` hold their global positions).
    """

    q_index: hax.NamedArray
    k_index: hax.NamedArray
    segment_ids: hax.NamedArray | None = None
    kv_segment_ids: hax.NamedArray | None = None
    kv_valid: hax.NamedArray | None = None
    aligned: bool = eqx.field(static=True, default=True)
    sequence_parallel: str = eqx.field(static=True, default="none")

    @staticmethod
    def self_attention(
        Pos: hax.Axis,
        segment_ids: hax.NamedArray | None = None,  # noqa: N803
    ) -> MaskSpec:
        """Causal self-attention over `Pos` (training, prefill), optionally within segments."""
        kv_seg = None if segment_ids is None else segment_ids.rename({POSITION: KEY_POSITION})
        return MaskSpec(
            hax.arange(Pos), hax.arange(Pos.alias(KEY_POSITION)), segment_ids, kv_seg, None, True
        )

    @staticmethod
    def cached(
        Pos: hax.Axis,  # noqa: N803
        KPos: hax.Axis,  # noqa: N803
        cache_index: jax.Array,
        kv_valid: hax.NamedArray,
    ) -> MaskSpec:
        """New queries at slots `cache_index ...` against a KV cache of `KPos` slots."""
        q = hax.arange(Pos) + jnp.asarray(cache_index, jnp.int32)
        return MaskSpec(q, hax.arange(KPos), None, None, kv_valid, False)

    def materialize(self, window: int | None, sliding: Any = True) -> hax.NamedArray:
        """The bool mask over `(batch?, position, key_position)` (True = attend).

        `window` applies where `sliding` is true (a bool, or a traced per-layer flag).

        >>> import meltemi.haliax as hax
        >>> spec = MaskSpec.self_attention(hax.Axis("position", 4))
        >>> spec.materialize(2).rearrange(("position", "key_position")).array.astype(int).tolist()
        [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
        """
        q = self.q_index.broadcast_axis(self.k_index.axes)
        mask = q >= self.k_index
        if window is not None and sliding is not False:
            near = (q - self.k_index) < window
            mask = mask & (near if sliding is True else near | ~jnp.asarray(sliding))
        if self.segment_ids is not None and self.kv_segment_ids is not None:
            seg, kv_seg = hax.broadcast_arrays(
                self.segment_ids, self.kv_segment_ids, require_subset=False
            )
            mask = mask & (seg == kv_seg)
        if self.kv_valid is not None:
            mask, kv_valid = hax.broadcast_arrays(mask, self.kv_valid, require_subset=False)
            mask = mask & kv_valid
        return mask


def resolve_backend(backend: str, *, aligned: bool, q_len: int, kv_len: int) -> str:
    """The kernel that runs: `backend` with `"auto"` resolved for this platform and shape.

    `"splash"` on a machine without a TPU is an error naming the field and the fix. Splash
    needs whole blocks of queries and keys, so `"auto"` picks it only for aligned sequences
    that are a multiple of `SPLASH_BLOCK`; an explicit `"splash"` runs a decoding step (or
    an unaligned mask) on `xla`.
    """
    platform = _platform()
    if backend == "splash" and platform != "tpu" and not _SPLASH_INTERPRET:
        raise ConfigError(
            f"ModelConfig.attention_backend='splash': the Pallas splash kernel needs a TPU, "
            f"but this process runs on {platform!r}. Fix: attention_backend='auto' (picks the "
            "best kernel of each platform) or 'xla'"
        )
    fits_splash = aligned and q_len % SPLASH_BLOCK == 0 and kv_len % SPLASH_BLOCK == 0
    if backend == "auto":
        if platform == "tpu" and fits_splash:
            return "splash"
        return "dot_product_attention" if platform == "gpu" else "xla"
    if backend == "splash" and not fits_splash:
        return "xla"
    return backend


def attention(
    q: hax.NamedArray,
    k: hax.NamedArray,
    v: hax.NamedArray,
    mask: MaskSpec,
    *,
    backend: str = "xla",
    window: int | None = None,
    sliding: Any = True,
    softcap: float | None = None,
    scale: float | None = None,
    query_block: int | None = None,
) -> hax.NamedArray:
    """Attention of `q` over `k`/`v` with the chosen backend (see the module docstring).

    Self-attention whose `position` axis the active mapping splits over devices, with
    `mask.sequence_parallel` set, runs `_context_parallel.split_attention` instead.

    Args:
        q: queries over `(batch, position, kv_heads, q_heads_per_group, head_size)` (any order).
        k: keys over `(batch, key_position, kv_heads, head_size)`.
        v: values, like `k`.
        mask: which keys each query may see (`MaskSpec`).
        backend: a `ModelConfig.attention_backend` value.
        window: sliding-window size (`None`: no window).
        sliding: whether `window` applies: a bool, or a traced scalar flag (per layer).
        softcap: attention-logit soft cap, or None.
        scale: logit scale (default `head_size**-0.5`).
        query_block: `xla` only: queries per block (see `blockwise_attention`).

    Returns:
        The attention output, with `q`'s axes.
    """
    if scale is None:
        scale = q.axis_size(HEAD_SIZE) ** -0.5
    strategy = mask.sequence_parallel
    if mask.kv_valid is None and sequence_split(strategy, q.axis_size(POSITION)) > 1:
        return split_attention(
            q,
            k,
            v,
            mask.q_index,
            mask.k_index,
            mask.segment_ids,
            strategy=strategy,
            window=window,
            sliding=sliding,
            softcap=softcap,
            scale=scale,
            query_block=query_block,
        )
    kind = resolve_backend(
        backend,
        aligned=mask.aligned and mask.kv_valid is None,
        q_len=q.axis_size(POSITION),
        kv_len=k.axis_size(KEY_POSITION),
    )
    if kind == "dot_product_attention" and softcap is not None:
        kind = "xla"  # jax.nn.dot_product_attention has no soft-cap argument
    if kind == "xla":
        m = mask.materialize(window, sliding)
        return blockwise_attention(q, k, v, m, query_block, scale=scale, softcap=softcap)
    kernel = _dpa if kind == "dot_product_attention" else _splash
    if window is None or sliding is False:
        return kernel(q, k, v, mask, None, softcap, scale)
    if sliding is True:
        return kernel(q, k, v, mask, window, softcap, scale)
    return jax.lax.cond(
        jnp.asarray(sliding),
        lambda: kernel(q, k, v, mask, window, softcap, scale),
        lambda: kernel(q, k, v, mask, None, softcap, scale),
    )


def _heads_last(q: hax.NamedArray, k: hax.NamedArray, v: hax.NamedArray):
    """Raw arrays: q `(batch, position, kv_heads * group, head)`, k/v `(batch, kpos, kv, head)`.

    Query head `h` is `(h // group, h % group)`, the grouping `jax.nn.dot_product_attention`
    and Hugging Face's `repeat_kv` use.
    """
    qa = q.rearrange((BATCH, POSITION, KV_HEADS, Q_HEADS_PER_GROUP, HEAD_SIZE)).array
    qa = qa.reshape(qa.shape[0], qa.shape[1], -1, qa.shape[-1])
    kv_order = (BATCH, KEY_POSITION, KV_HEADS, HEAD_SIZE)
    return qa, k.rearrange(kv_order).array, v.rearrange(kv_order).array


def _from_heads_last(out: jax.Array, q: hax.NamedArray) -> hax.NamedArray:
    order = (BATCH, POSITION, KV_HEADS, Q_HEADS_PER_GROUP, HEAD_SIZE)
    axes = tuple(q.resolve_axis(n) for n in order)
    named = hax.named(out.reshape(tuple(a.size for a in axes)), axes)
    return named.rearrange([a.name for a in q.axes])


def _dpa(q, k, v, mask: MaskSpec, window, softcap, scale) -> hax.NamedArray:
    """`jax.nn.dot_product_attention` (cuDNN on GPU for half precision, else its XLA path)."""
    del softcap  # `attention` routes soft-capped layers to xla
    qa, ka, va = _heads_last(q, k, v)
    fused = mask.aligned and mask.kv_valid is None
    half = qa.dtype in (jnp.bfloat16, jnp.float16)
    implementation = "cudnn" if fused and half and _platform() == "gpu" else "xla"
    if fused:
        dense = None
        if mask.segment_ids is not None and mask.kv_segment_ids is not None:
            seg = mask.segment_ids.broadcast_axis(mask.kv_segment_ids.axes)
            same = seg == mask.kv_segment_ids
            dense = same.rearrange((BATCH, POSITION, KEY_POSITION)).array[:, None]
        out = jax.nn.dot_product_attention(
            qa,
            ka,
            va,
            mask=dense,
            scale=scale,
            is_causal=True,
            local_window_size=None if window is None else (window - 1, 0),
            implementation=implementation,
        )
    else:
        m = mask.materialize(window).broadcast_axis(q.resolve_axis(BATCH))
        dense = m.rearrange((BATCH, POSITION, KEY_POSITION)).array[:, None]
        out = jax.nn.dot_product_attention(qa, ka, va, mask=dense, scale=scale)
    return _from_heads_last(out, q)


def _splash(q, k, v, mask: MaskSpec, window, softcap, scale) -> hax.NamedArray:
    """Pallas TPU splash attention: one MQA kernel per KV head (its query group as heads)."""
    # Imported here: the TPU kernels are loaded only where they run.
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as sk,
    )
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_mask as sm,
    )

    order = (BATCH, KV_HEADS, Q_HEADS_PER_GROUP, POSITION, HEAD_SIZE)
    qa = q.rearrange(order).array * jnp.asarray(scale, q.dtype)
    kv_order = (BATCH, KV_HEADS, KEY_POSITION, HEAD_SIZE)
    ka, va = k.rearrange(kv_order).array, v.rearrange(kv_order).array
    groups, q_len, kv_len = qa.shape[2], qa.shape[3], ka.shape[2]
    if window is None:
        one = sm.CausalMask((q_len, kv_len))
    else:
        one = sm.LocalMask((q_len, kv_len), window_size=(window - 1, 0), offset=0)
    block = min(512, q_len, kv_len)
    while q_len % block or kv_len % block:
        block //= 2
    sizes = sk.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        block_q_dq=block,
        block_kv_dq=block,
    )
    kernel = sk.make_splash_mqa_single_device(
        sm.MultiHeadMask([one] * groups),
        block_sizes=sizes,
        attn_logits_soft_cap=softcap,
        interpret=_SPLASH_INTERPRET,
    )
    segs = None
    if mask.segment_ids is not None and mask.kv_segment_ids is not None:
        segs = (
            mask.segment_ids.rearrange((BATCH, POSITION)).array.astype(jnp.int32),
            mask.kv_segment_ids.rearrange((BATCH, KEY_POSITION)).array.astype(jnp.int32),
        )

    def one_head(qh, kh, vh, seg):
        ids = None if seg is None else sk.SegmentIds(q=seg[0], kv=seg[1])
        return kernel(qh, kh, vh, segment_ids=ids)

    per_kv = jax.vmap(one_head, in_axes=(0, 0, 0, None))
    out = jax.vmap(per_kv, in_axes=(0, 0, 0, 0 if segs is not None else None))(qa, ka, va, segs)
    axes = tuple(q.resolve_axis(n) for n in order)
    return hax.named(out.astype(q.dtype), axes).rearrange([a.name for a in q.axes])


def blockwise_attention(
    q: hax.NamedArray,
    k: hax.NamedArray,
    v: hax.NamedArray,
    mask: hax.NamedArray | None,
    query_block: int | None,
    *,
    scale: float | None = None,
    softcap: float | None = None,
) -> hax.NamedArray:
    """`softmax(q.k * scale) . v` over `key_position`, one block of queries at a time.

    Each block of `query_block` positions attends to every key (the softmax is over whole
    rows, so this is exact) inside a `jax.checkpoint`, so the backward pass recomputes one
    block's scores instead of keeping the `(position, key_position)` matrix of every head:
    at marin-32b's shapes (40 heads, 4096 positions, 4 sequences per device) that matrix is
    10 GiB in float32. Without `query_block`, or when it does not divide the number of
    positions, or the sequence is no longer than it, attention runs in one piece.

    Args:
        q: queries (with `position` and `head_size`).
        k: keys (with `key_position` and `head_size`).
        v: values (with `key_position`).
        mask: bool mask (True = attend), aligned by name, or None.
        query_block: queries per block, or None.
        scale: logit scale (default `head_size**-0.5`).
        softcap: logits become `softcap * tanh(logits / softcap)` before masking.

    >>> import jax.numpy as jnp
    >>> import meltemi.haliax as hax
    >>> P, K, D = hax.Axis("position", 6), hax.Axis("key_position", 6), hax.Axis("head_size", 4)
    >>> q = hax.named(jnp.arange(24.0).reshape(6, 4) / 24, (P, D))
    >>> kv = q.rename({"position": "key_position"})
    >>> whole = blockwise_attention(q, kv, kv, None, None)
    >>> bool(jnp.allclose(blockwise_attention(q, kv, kv, None, 2).array, whole.array))
    True
    """
    Pos = q.resolve_axis(POSITION)  # noqa: N806

    def run(q_part: hax.NamedArray, m_part: hax.NamedArray | None) -> hax.NamedArray:
        return dot_product_attention(
            KEY_POSITION, HEAD_SIZE, q_part, k, v, mask=m_part, scale=scale, logits_soft_cap=softcap
        )

    if query_block is None or Pos.size <= query_block or Pos.size % query_block:
        return run(q, mask)
    Blocks = hax.Axis("query_block", Pos.size // query_block)  # noqa: N806
    InBlock = Pos.resize(query_block)  # noqa: N806
    q_blocks = q.unflatten_axis(POSITION, (Blocks, InBlock))
    blocked_mask = mask is not None and mask.has_axis(POSITION)
    m_blocks = mask.unflatten_axis(POSITION, (Blocks, InBlock)) if blocked_mask else mask

    def one(q_block: hax.NamedArray, m_block: hax.NamedArray | None) -> hax.NamedArray:
        out = run(q_block, m_block)
        if partitioning.current_thread_local_mapping() is None:
            return out
        return hax.shard(out)

    # `hax.map` slices what has the `query_block` axis; k, v (and an unblocked mask) are
    # passed whole to every block.
    out = hax.map(jax.checkpoint(one), Blocks)(q_blocks, m_blocks)
    return out.flatten_axes((Blocks.name, POSITION), POSITION).rearrange([a.name for a in q.axes])
