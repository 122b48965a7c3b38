"""Attention through a page table: the keys and values of a sequence live in fixed-size pages
of one pool per layer, and row `b` of the page table lists the pages of sequence `b` in order
(token at position `p` sits in page `table[b, p // page_size]` at offset `p % page_size`).

Pools are head-major (`pool_shapes`): keys and values `[kv_heads, num_pages, page_size,
head_size]`, the layout the paged kernels take (JAX's Pallas GPU and TPU `paged_attention`,
vLLM's): gathering a row's pages gives each head's keys and values as one `[slots,
head_size]` block, and both products of attention batch over `(kv_heads, batch)` with no
transpose of the gathered block (8 rows, 12 heads of 64, 128 slots in pages of 16, on the CPU:
0.72 ms per layer for the reference, against 1.19 ms with the position-major pools
`[num_pages, page_size, kv_heads, head_size]` of the first engine and 0.54 with the values
offset-innermost, a layout no paged kernel takes).

Backends are functions `(q, k_pool, v_pool, page_table, q_positions, *, window, softcap,
scale) -> out` in `PAGED_BACKENDS`:

* `"reference"` gathers each sequence's pages and runs plain masked softmax attention (every
  platform; it computes what `haliax.nn.dot_product_attention` computes over a dense cache, in
  the same order of operations);
* `"native"`: the CPU kernel `_native.paged_attention` (reads the pages in place; float32);
* `"pallas_gpu"`: JAX's Pallas GPU paged attention for decoding rows (one query per row, no
  sliding window; everything else runs the reference), in Pallas' interpreter off the GPU;
* `"pallas_tpu"`: JAX's Pallas TPU paged attention for decoding rows of bfloat16 pools (it
  rounds what it loads to bfloat16; everything else runs the reference), in Pallas' TPU
  interpreter off the TPU.

`"auto"` (`resolve_paged_backend`) picks `"pallas_gpu"` on one GPU, `"pallas_tpu"` on one TPU,
`"native"` on one CPU device where it builds, else the reference.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import jax
import jax.numpy as jnp

import meltemi.haliax as hax
from meltemi.models import _native
from meltemi.models._axes import (
    BATCH,
    HEAD_SIZE,
    KEY_POSITION,
    KV_HEADS,
    POSITION,
    Q_HEADS_PER_GROUP,
)
from meltemi.models.engine._config import EngineError

Q_ORDER = (BATCH, POSITION, KV_HEADS, Q_HEADS_PER_GROUP, HEAD_SIZE)
"""The query axes' order every paged kernel and `_forward` exchange arrays in."""


def in_q_order(q: hax.NamedArray) -> tuple[jax.Array, tuple[hax.Axis, ...]]:
    """`q`'s array in `Q_ORDER`, and its axes in that order (for `like_q`)."""
    axes = tuple(q.resolve_axis(n) for n in Q_ORDER)
    return q.rearrange(axes).array, axes


def like_q(out: jax.Array, axes: tuple[hax.Axis, ...], q: hax.NamedArray) -> hax.NamedArray:
    """`out` (over `axes`, as `in_q_order` gave them) named and ordered as `q`."""
    return hax.named(out, axes).rearrange([a.name for a in q.axes])


def pool_shapes(
    num_pages: int, page_size: int, kv_heads: int, head_size: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of one layer's `(keys, values)` pools (head-major, see the module)."""
    shape = (kv_heads, num_pages, page_size, head_size)
    return shape, shape


def write_pages(
    k_pool: jax.Array,
    v_pool: jax.Array,
    k: hax.NamedArray,
    v: hax.NamedArray,
    pages: jax.Array,
    offsets: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """The pools with `k` and `v` (over `batch, key_position, kv_heads, head_size`) written at
    `(pages[b, t], offsets[b, t])` for each token `t` of row `b`."""
    order = (KV_HEADS, BATCH, KEY_POSITION, HEAD_SIZE)
    k_pool = k_pool.at[:, pages, offsets].set(k.rearrange(order).array.astype(k_pool.dtype))
    v_pool = v_pool.at[:, pages, offsets].set(v.rearrange(order).array.astype(v_pool.dtype))
    return k_pool, v_pool


def copy_pages(pool: jax.Array, src: jax.Array, dst: jax.Array) -> jax.Array:
    """`pool` with page `src[i]` copied to page `dst[i]` for each `i`."""
    return pool.at[:, dst].set(pool[:, src])


def reference_paged_attention(
    q: hax.NamedArray,
    k_pool: jax.Array,
    v_pool: jax.Array,
    page_table: jax.Array,
    q_positions: jax.Array,
    *,
    window: int | None,
    softcap: float | None,
    scale: float | None,
) -> hax.NamedArray:
    """Causal attention of `q` over the pages `page_table` lists, in plain JAX.

    Args:
        q: queries over `(batch, position, kv_heads, q_heads_per_group, head_size)`.
        k_pool: keys of every page, `[kv_heads, num_pages, page_size, head_size]`.
        v_pool: values of every page, `[kv_heads, num_pages, page_size, head_size]`.
        page_table: `[batch, pages]` int, each row's pages in order.
        q_positions: `[batch, position]` int, each query's position; it sees the keys at
            positions `<=` its own (and `> pos - window` with a window).
        window: sliding window, or None.
        softcap: logit soft cap, or None.
        scale: logit scale (default `head_size**-0.5`).

    Returns:
        The output with `q`'s axes.
    """
    qa, axes = in_q_order(q)
    batch, pages = page_table.shape
    kv, _, page_size, head = k_pool.shape
    slots = pages * page_size
    t, group = qa.shape[1], qa.shape[3]
    k = k_pool[:, page_table].reshape(kv, batch, slots, head)
    v = v_pool[:, page_table].reshape(kv, batch, slots, head)
    if scale is None:
        scale = head**-0.5
    k_pos = jnp.arange(slots, dtype=jnp.int32)
    mask = k_pos[None, None, :] <= q_positions[:, :, None]
    if window is not None:
        mask = mask & (q_positions[:, :, None] - k_pos[None, None, :] < window)
    orig = qa.dtype
    # Queries as [kv, batch, t * group, head]: the products batch over (kv, batch) in the
    # pools' order, so the gathered blocks are used as they are.
    qk = (qa * jnp.asarray(scale, orig)).transpose(2, 0, 1, 3, 4).reshape(kv, batch, -1, head)
    logits = jnp.einsum("kbqd,kbsd->kbqs", qk, k.astype(orig))
    if softcap is not None:
        logits = jnp.tanh(logits / softcap) * softcap
    logits = logits.reshape(kv, batch, t, group, slots)
    logits = jnp.where(mask[None, :, :, None, :], logits, jnp.finfo(logits.dtype).min)
    weights = jax.nn.softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), -1)
    weights = weights.astype(orig).reshape(kv, batch, t * group, slots)
    out = jnp.einsum("kbqs,kbsd->kbqd", weights, v.astype(orig))
    return like_q(out.reshape(kv, batch, t, group, head).transpose(1, 2, 0, 3, 4), axes, q)


def native_paged_attention(
    q: hax.NamedArray,
    k_pool: jax.Array,
    v_pool: jax.Array,
    page_table: jax.Array,
    q_positions: jax.Array,
    *,
    window: int | None,
    softcap: float | None,
    scale: float | None,
) -> hax.NamedArray:
    """`reference_paged_attention` on the native CPU kernel (`_native.paged_attention`): each
    row reads only its pages up to its position, in place. Float32 pools only; other dtypes,
    or a machine where the kernel does not build, run the reference."""
    if not (_native.usable() and k_pool.dtype == v_pool.dtype == q.dtype == jnp.float32):
        return reference_paged_attention(
            q, k_pool, v_pool, page_table, q_positions, window=window, softcap=softcap, scale=scale
        )
    qa, axes = in_q_order(q)
    out = _native.paged_attention(
        qa,
        k_pool,
        v_pool,
        page_table,
        q_positions,
        scale=k_pool.shape[-1] ** -0.5 if scale is None else scale,
        softcap=softcap,
        window=window,
    )
    return like_q(out, axes, q)


def _on_decoding_rows(
    kernel: Callable[[jax.Array, jax.Array, jax.Array], jax.Array],
    q: hax.NamedArray,
    k_pool: jax.Array,
    v_pool: jax.Array,
    page_table: jax.Array,
    q_positions: jax.Array,
    *,
    window: int | None,
    softcap: float | None,
    scale: float | None,
    usable: bool = True,
) -> hax.NamedArray:
    """A Pallas paged kernel on decoding rows (one query per row, no window; `usable`: the
    pools suit it), the reference on everything else. `kernel(q, lengths, table)` takes the
    scaled queries `[batch, q_heads, head]` (the kernels do not scale), each row's key count
    `[batch]` (position + 1) and the page table, both int32."""
    if not usable or q.resolve_axis(POSITION).size != 1 or window is not None:
        return reference_paged_attention(
            q, k_pool, v_pool, page_table, q_positions, window=window, softcap=softcap, scale=scale
        )
    qa, axes = in_q_order(q)  # [batch, 1, kv_heads, group, head]
    head = qa.shape[-1]
    if scale is None:
        scale = head**-0.5
    out = kernel(
        (qa * jnp.asarray(scale, qa.dtype)).reshape(qa.shape[0], -1, head),
        (q_positions[:, 0] + 1).astype(jnp.int32),
        page_table.astype(jnp.int32),
    )
    return like_q(out.reshape(qa.shape), axes, q)


def pallas_gpu_paged_attention(
    q: hax.NamedArray,
    k_pool: jax.Array,
    v_pool: jax.Array,
    page_table: jax.Array,
    q_positions: jax.Array,
    *,
    window: int | None,
    softcap: float | None,
    scale: float | None,
) -> hax.NamedArray:
    """`reference_paged_attention` on JAX's Pallas GPU paged attention kernel
    (`jax.experimental.pallas.ops.gpu.paged_attention`) for decoding rows: one query per row,
    no sliding window (the kernel attends to the first `length` keys of each row); prompt
    chunks and windowed layers run the reference. Off the GPU the kernel runs in Pallas'
    interpreter (for tests)."""
    from jax.experimental.pallas.ops.gpu import paged_attention as pallas_gpu

    pages = page_table.shape[1]
    splits = min(16, pages & -pages)  # a power of two dividing the table's width
    per_block = min(8, (pages // splits) & -(pages // splits))

    def kernel(queries, lengths, table):
        return pallas_gpu.paged_attention(
            queries,
            k_pool,
            v_pool,
            table,
            lengths,
            k_splits=splits,
            pages_per_compute_block=per_block,
            interpret=jax.default_backend() != "gpu",
            attn_logits_soft_cap=softcap,
        )

    return _on_decoding_rows(
        kernel, q, k_pool, v_pool, page_table, q_positions, window=window, softcap=softcap,
        scale=scale,
    )  # fmt: skip


def pallas_tpu_paged_attention(
    q: hax.NamedArray,
    k_pool: jax.Array,
    v_pool: jax.Array,
    page_table: jax.Array,
    q_positions: jax.Array,
    *,
    window: int | None,
    softcap: float | None,
    scale: float | None,
) -> hax.NamedArray:
    """`reference_paged_attention` on JAX's Pallas TPU paged attention kernel
    (`jax.experimental.pallas.ops.tpu.paged_attention`) for decoding rows of bfloat16 pools:
    one query per row, no sliding window. The kernel rounds the keys and values it loads to
    bfloat16 (then computes in float32), which is exact only for bfloat16 pools: float32 pools
    (up to 1e-2 off here), prompt chunks and windowed layers run the reference. Off the TPU the
    kernel runs in Pallas' TPU interpreter (for tests)."""
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas.ops.tpu import paged_attention as pallas_tpu

    pages = page_table.shape[1]

    def kernel(queries, lengths, table):
        interpret = jax.default_backend() != "tpu"
        with pltpu.force_tpu_interpret_mode() if interpret else contextlib.nullcontext():
            return pallas_tpu.paged_attention(
                queries,
                k_pool,
                v_pool,
                lengths,
                table,
                pages_per_compute_block=min(8, pages & -pages),  # a power of two dividing it
                attn_logits_soft_cap=softcap,
            )

    return _on_decoding_rows(
        kernel, q, k_pool, v_pool, page_table, q_positions, window=window, softcap=softcap,
        scale=scale, usable=k_pool.dtype == v_pool.dtype == jnp.bfloat16,
    )  # fmt: skip


PagedAttention = Callable[..., hax.NamedArray]

PAGED_BACKENDS: dict[str, PagedAttention] = {
    "reference": reference_paged_attention,
    "native": native_paged_attention,
    "pallas_gpu": pallas_gpu_paged_attention,
    "pallas_tpu": pallas_tpu_paged_attention,
}
"""Paged attention kernels by name (`EngineConfig.attention_backend`)."""

_PLATFORM_BACKENDS: dict[str, str] = {"gpu": "pallas_gpu", "tpu": "pallas_tpu"}
"""The kernel `"auto"` picks per platform on one device; elsewhere the native CPU kernel where
it builds, else the reference."""


def resolve_paged_backend(name: str) -> PagedAttention:
    """The kernel `EngineConfig.attention_backend=name` runs on this platform."""
    if name == "auto":
        name = "reference"  # sharded pools: the kernels are opaque to SPMD partitioning
        if jax.device_count() == 1:
            name = _PLATFORM_BACKENDS.get(jax.default_backend(), "reference")
            if name == "reference" and _native.usable():
                name = "native"
    if name not in PAGED_BACKENDS:
        raise EngineError(
            f"EngineConfig.attention_backend={name!r}: no such paged attention kernel; "
            f"available: {sorted(PAGED_BACKENDS)} or 'auto'. Fix: attention_backend='auto'"
        )
    return PAGED_BACKENDS[name]
