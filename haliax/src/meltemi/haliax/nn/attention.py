"""Dot-product attention by axis name: masks, grouped-query attention, q/k-norm and RoPE hooks.

Grouped-query attention needs no special code: give the query an extra axis (e.g.
`(KVHeads, QHeadsPerGroup, HeadSize)`) and the key/value `(KVHeads, HeadSize)`; `KVHeads` is then
a batch axis of the contraction and each group of query heads shares one key/value head.

>>> import meltemi.haliax as hax
>>> Pos, KPos, Head = hax.Axis("pos", 3), hax.Axis("key_pos", 3), hax.Axis("head_size", 4)
>>> q, k, v = hax.ones((Pos, Head)), hax.ones((KPos, Head)), hax.ones((KPos, Head))
>>> mask = causal_mask(Pos, KPos)
>>> dot_product_attention(KPos, Head, q, k, v, mask=mask).axes
(Axis(name='pos', size=3), Axis(name='head_size', size=4))
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from meltemi.haliax._core import (
    Axis,
    AxisSelection,
    AxisSelector,
    AxisSpec,
    NamedArray,
    axis_name,
    axis_size,
    rename,
)
from meltemi.haliax._dot import dot
from meltemi.haliax._ops import arange, where
from meltemi.haliax.nn._activations import softmax
from meltemi.haliax.nn._linear import Linear
from meltemi.haliax.nn._normalization import RmsNorm
from meltemi.haliax.nn.rotary import RotaryConfig

__all__ = [
    "causal_mask",
    "segment_mask",
    "combine_masks_and",
    "combine_masks_or",
    "mask_to_bias",
    "AttentionMask",
    "dot_product_attention_weights",
    "dot_product_attention",
    "Attention",
]


def causal_mask(QPos: Axis, KPos: Axis, q_start: Any = 0, k_start: Any = 0) -> NamedArray:  # noqa: N803
    """True where key position <= query position (positions offset by the starts)."""
    q = (arange(QPos) + q_start).broadcast_axis(KPos).rearrange((QPos.name, KPos.name))
    return q >= (arange(KPos) + k_start)


def segment_mask(q_segment_ids: NamedArray, kv_segment_ids: NamedArray) -> NamedArray:
    """True where query and key belong to the same segment (packed sequences).

    The two id arrays must use different position axis names (e.g. `pos` and `key_pos`).
    """
    return q_segment_ids == kv_segment_ids


def combine_masks_and(a: NamedArray | None, b: NamedArray | None) -> NamedArray | None:
    if a is None:
        return b
    if b is None:
        return a
    return a & b


def combine_masks_or(a: NamedArray | None, b: NamedArray | None) -> NamedArray | None:
    if a is None:
        return b
    if b is None:
        return a
    return a | b


def mask_to_bias(mask: NamedArray, mask_value: float = -1e9) -> NamedArray:
    return where(mask, 0.0, mask_value)


class AttentionMask(eqx.Module):
    """A lazy mask: causal and/or segment ids, materialised for given position axes.

    >>> import meltemi.haliax as hax
    >>> Pos = hax.Axis("pos", 3)
    >>> seg = hax.named([0, 0, 1], Pos)
    >>> m = AttentionMask.causal().with_segment_ids(seg).materialize(Pos, Pos.alias("key_pos"))
    >>> m.array.astype(int)
    Array([[1, 0, 0],
           [1, 1, 0],
           [0, 0, 1]], dtype=int32)
    """

    is_causal: bool = eqx.field(static=True, default=False)
    segment_ids: NamedArray | None = None
    kv_segment_ids: NamedArray | None = None

    @staticmethod
    def causal() -> AttentionMask:
        return AttentionMask(is_causal=True)

    def with_segment_ids(
        self, segment_ids: NamedArray, kv_segment_ids: NamedArray | None = None
    ) -> AttentionMask:
        return AttentionMask(self.is_causal, segment_ids, kv_segment_ids)

    def materialize(self, QPos: Axis, KPos: Axis, q_start: Any = 0, k_start: Any = 0):  # noqa: N803
        """A bool NamedArray over `(QPos, KPos)` (plus any batch axes of the segment ids)."""
        mask = causal_mask(QPos, KPos, q_start, k_start) if self.is_causal else None
        if self.segment_ids is not None:
            q_ids = self.segment_ids
            kv = self.kv_segment_ids if self.kv_segment_ids is not None else q_ids
            if kv.has_axis(QPos.name) and QPos.name != KPos.name:
                kv = rename(kv, {QPos.name: KPos.name})
            mask = combine_masks_and(mask, segment_mask(q_ids, kv))
        return mask


def dot_product_attention_weights(
    Key: AxisSelector,  # noqa: N803
    KPos: AxisSelection,  # noqa: N803
    query: NamedArray,
    key: NamedArray,
    mask: NamedArray | None = None,
    bias: NamedArray | None = None,
    attention_dtype: Any = None,
    precision: Any = None,
    *,
    scale: float | None = None,
    logits_soft_cap: float | None = None,
) -> NamedArray:
    """Softmax over `KPos` of `query . key / sqrt(size(Key))` (with mask, bias, soft cap)."""
    orig_dtype = query.dtype
    if scale is None:
        scale = 1.0 / math.sqrt(query.axis_size(Key))
    query = query * jnp.asarray(scale, query.dtype)
    if attention_dtype is not None:
        query, key = query.astype(attention_dtype), key.astype(attention_dtype)
    logits = dot(query, key, axis=Key, precision=precision)
    if logits_soft_cap is not None:
        logits = NamedArray(jnp.tanh(logits.array / logits_soft_cap) * logits_soft_cap, logits.axes)
    if bias is not None:
        logits = logits + bias
    if mask is not None:
        big_neg = jnp.finfo(logits.dtype).min
        logits = where(mask, logits, big_neg)
    weights = softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), axis=KPos)
    return weights.astype(orig_dtype)


def dot_product_attention(
    KPos: AxisSelection,  # noqa: N803
    Key: AxisSelector,  # noqa: N803
    query: NamedArray,
    key: NamedArray,
    value: NamedArray,
    mask: NamedArray | None = None,
    bias: NamedArray | None = None,
    attention_dtype: Any = None,
    precision: Any = None,
    *,
    scale: float | None = None,
    logits_soft_cap: float | None = None,
) -> NamedArray:
    """Attention by name: `softmax_KPos(q.k / sqrt(d)) . v`.

    `query` has the query position axis (any name but `KPos`), `key`/`value` have `KPos`; all
    share `Key` (the head size). Heads and batch axes are whatever else the arrays carry.
    `mask` is a bool NamedArray (True = attend), `bias` is added to the logits.
    """
    weights = dot_product_attention_weights(
        Key,
        KPos,
        query,
        key,
        mask,
        bias,
        attention_dtype,
        precision,
        scale=scale,
        logits_soft_cap=logits_soft_cap,
    )
    return dot(weights, value, axis=KPos, precision=precision)


class Attention(eqx.Module):
    """Multi-head / grouped-query self-attention block with optional q/k-norm and RoPE.

    Query heads are laid out `(KVHeads, QHeadsPerGroup)`, so head `h` of a Hugging Face
    checkpoint is `(h // group, h % group)`, matching HF's `repeat_kv`.
    `qk_norm` is a hook `(q_or_k, HeadSize) -> normalised` applied before RoPE; `init` builds
    Qwen3-style per-head RmsNorms when `use_qk_norm=True`.

    >>> import jax
    >>> import meltemi.haliax as hax
    >>> Pos, Embed = hax.Axis("pos", 5), hax.Axis("embed", 8)
    >>> attn = Attention.init(Embed, num_heads=4, num_kv_heads=2, head_size=2,
    ...                       key=jax.random.key(0), rotary=RotaryConfig())
    >>> attn(hax.ones((Pos, Embed)), AttentionMask.causal()).axes
    (Axis(name='pos', size=5), Axis(name='embed', size=8))
    """

    q_proj: Linear
    k_proj: Linear
    v_proj: Linear
    o_proj: Linear
    q_norm: Callable | None
    k_norm: Callable | None
    KVHeads: Axis = eqx.field(static=True)
    QHeadsPerGroup: Axis = eqx.field(static=True)
    HeadSize: Axis = eqx.field(static=True)
    Embed: AxisSpec = eqx.field(static=True)
    rotary: RotaryConfig | None = eqx.field(static=True, default=None)
    logits_soft_cap: float | None = eqx.field(static=True, default=None)

    @staticmethod
    def init(
        Embed: AxisSpec,  # noqa: N803
        *,
        num_heads: int,
        num_kv_heads: int | None = None,
        head_size: int | None = None,
        key: jax.Array,
        use_bias: bool = False,
        use_output_bias: bool | None = None,
        use_qk_norm: bool = False,
        qk_norm_eps: float = 1e-6,
        rotary: RotaryConfig | None = None,
        logits_soft_cap: float | None = None,
    ) -> Attention:
        num_kv_heads = num_kv_heads or num_heads
        if num_heads % num_kv_heads:
            raise ValueError(
                f"Attention: num_heads={num_heads} must be a multiple of "
                f"num_kv_heads={num_kv_heads}"
            )
        if head_size is None:
            head_size = axis_size(Embed) // num_heads
        KVHeads = Axis("kv_heads", num_kv_heads)  # noqa: N806
        Group = Axis("q_heads_per_group", num_heads // num_kv_heads)  # noqa: N806
        HeadSize = Axis("head_size", head_size)  # noqa: N806
        kq, kk, kv, ko = jax.random.split(key, 4)
        out_bias = use_bias if use_output_bias is None else use_output_bias
        q_proj = Linear.init(Embed, (KVHeads, Group, HeadSize), key=kq, use_bias=use_bias)
        k_proj = Linear.init(Embed, (KVHeads, HeadSize), key=kk, use_bias=use_bias)
        v_proj = Linear.init(Embed, (KVHeads, HeadSize), key=kv, use_bias=use_bias)
        o_proj = Linear.init((KVHeads, Group, HeadSize), Embed, key=ko, use_bias=out_bias)
        q_norm = RmsNorm.init(HeadSize, eps=qk_norm_eps) if use_qk_norm else None
        k_norm = RmsNorm.init(HeadSize, eps=qk_norm_eps) if use_qk_norm else None
        return Attention(
            q_proj,
            k_proj,
            v_proj,
            o_proj,
            q_norm,
            k_norm,
            KVHeads,
            Group,
            HeadSize,
            Embed,
            rotary,
            logits_soft_cap,
        )

    @jax.named_scope("attention")
    def __call__(
        self,
        x: NamedArray,
        mask: AttentionMask | NamedArray | None,
        *,
        Pos: AxisSelector = "pos",  # noqa: N803
        positions: NamedArray | None = None,
        key: jax.Array | None = None,
    ) -> NamedArray:
        """`x` has `Pos` and `Embed` (plus batch axes); `positions` default to `arange(Pos)`."""
        Pos = x.resolve_axis(axis_name(Pos))  # noqa: N806
        KPos = Pos.alias("key_" + Pos.name)  # noqa: N806
        q = self.q_proj(x)
        k = self.k_proj(x)
        v = self.v_proj(x)
        if self.q_norm is not None:
            q = self.q_norm(q)
        if self.k_norm is not None:
            k = self.k_norm(k)
        if self.rotary is not None:
            pos_ids = arange(Pos) if positions is None else positions
            q = self.rotary(q, pos_ids, self.HeadSize)
            k = self.rotary(k, pos_ids, self.HeadSize)
        k = rename(k, {Pos.name: KPos.name})
        v = rename(v, {Pos.name: KPos.name})
        if isinstance(mask, AttentionMask):
            mask = mask.materialize(Pos, KPos)
        elif mask is not None and mask.has_axis(Pos.name) and not mask.has_axis(KPos.name):
            raise ValueError(f"attention mask must have axes ({Pos.name}, {KPos.name})")
        out = dot_product_attention(
            KPos, self.HeadSize, q, k, v, mask=mask, logits_soft_cap=self.logits_soft_cap
        )
        return self.o_proj(out)
