"""Attention through a page table: the keys and values of a sequence live in fixed-size pages
of one pool per layer, `[num_pages, page_size, kv_heads, head_size]`, and row `b` of the page
table lists the pages of sequence `b` in order (token at position `p` sits in page
`table[b, p // page_size]` at offset `p % page_size`).

Backends are functions `(q, k_pool, v_pool, page_table, q_positions, *, window, softcap,
scale) -> out` in `PAGED_BACKENDS`; `"reference"` gathers each sequence's pages into a dense
`(batch, pages * page_size, kv_heads, head_size)` block and runs plain masked softmax
attention (every platform; it computes what `haliax.nn.dot_product_attention` computes over
a dense cache, in the same order of operations). A Pallas ragged/paged kernel for TPU or GPU
is added as another entry and picked by `resolve_paged_backend` where its platform runs.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

import meltemi.haliax as hax
from meltemi.models._axes import (
    BATCH,
    HEAD_SIZE,
    KEY_POSITION,
    KV_HEADS,
    POSITION,
    Q_HEADS_PER_GROUP,
)
from meltemi.models.engine._config import EngineError

_Q_ORDER = (BATCH, POSITION, KV_HEADS, Q_HEADS_PER_GROUP, HEAD_SIZE)


def write_pages(
    pool: jax.Array, new: hax.NamedArray, pages: jax.Array, offsets: jax.Array
) -> jax.Array:
    """`pool` with `new` (over `batch, key_position, kv_heads, head_size`) written at
    `(pages[b, t], offsets[b, t])` for each token `t` of row `b`."""
    values = new.rearrange((BATCH, KEY_POSITION, KV_HEADS, HEAD_SIZE)).array
    return pool.at[pages, offsets].set(values.astype(pool.dtype))


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
        k_pool: keys of every page, `[num_pages, page_size, kv_heads, head_size]`.
        v_pool: values, like `k_pool`.
        page_table: `[batch, pages]` int, each row's pages in order.
        q_positions: `[batch, position]` int, each query's position; it sees the keys at
            positions `<=` its own (and `> pos - window` with a window).
        window: sliding window, or None.
        softcap: logit soft cap, or None.
        scale: logit scale (default `head_size**-0.5`).

    Returns:
        The output with `q`'s axes.
    """
    qa = q.rearrange(_Q_ORDER).array
    batch, pages = page_table.shape
    slots = pages * k_pool.shape[1]
    k = k_pool[page_table].reshape(batch, slots, *k_pool.shape[2:])
    v = v_pool[page_table].reshape(batch, slots, *v_pool.shape[2:])
    if scale is None:
        scale = qa.shape[-1] ** -0.5
    k_pos = jnp.arange(slots, dtype=jnp.int32)
    mask = k_pos[None, None, :] <= q_positions[:, :, None]
    if window is not None:
        mask = mask & (q_positions[:, :, None] - k_pos[None, None, :] < window)
    orig = qa.dtype
    qa = qa * jnp.asarray(scale, orig)
    logits = jnp.einsum("btkgd,bskd->btkgs", qa, k.astype(orig))
    if softcap is not None:
        logits = jnp.tanh(logits / softcap) * softcap
    logits = jnp.where(mask[:, :, None, None, :], logits, jnp.finfo(logits.dtype).min)
    weights = jax.nn.softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), -1)
    out = jnp.einsum("btkgs,bskd->btkgd", weights.astype(orig), v.astype(orig))
    axes = tuple(q.resolve_axis(n) for n in _Q_ORDER)
    return hax.named(out, axes).rearrange([a.name for a in q.axes])


PagedAttention = Callable[..., hax.NamedArray]

PAGED_BACKENDS: dict[str, PagedAttention] = {"reference": reference_paged_attention}
"""Paged attention kernels by name (`EngineConfig.attention_backend`)."""

_PLATFORM_BACKENDS: dict[str, str] = {}
"""The kernel `"auto"` picks per platform (`"tpu"`, `"gpu"`) where one is registered;
elsewhere the reference."""


def resolve_paged_backend(name: str) -> PagedAttention:
    """The kernel `EngineConfig.attention_backend=name` runs on this platform."""
    if name == "auto":
        name = _PLATFORM_BACKENDS.get(jax.default_backend(), "reference")
    if name not in PAGED_BACKENDS:
        raise EngineError(
            f"EngineConfig.attention_backend={name!r}: no such paged attention kernel; "
            f"available: {sorted(PAGED_BACKENDS)} or 'auto'. Fix: attention_backend='auto'"
        )
    return PAGED_BACKENDS[name]
