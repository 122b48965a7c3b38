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

from meltemi.haliax import random as hrandom
from meltemi.haliax._core import (
    Axis,
    AxisSelection,
    AxisSelector,
    AxisSpec,
    NamedArray,
    _fmt_axes,
    axis_name,
    axis_size,
    broadcast_arrays,
    rename,
)
from meltemi.haliax._dot import dot
from meltemi.haliax._ops import arange, where
from meltemi.haliax._ops import ones as hax_ones
from meltemi.haliax.nn._activations import softmax
from meltemi.haliax.nn._linear import Linear
from meltemi.haliax.nn._normalization import RmsNorm
from meltemi.haliax.nn.rotary import RotaryConfig

__all__ = [
    "causal_mask",
    "segment_mask",
    "prefix_lm_mask",
    "forgetful_causal_mask",
    "alibi_attention_bias",
    "combine_masks_and",
    "combine_masks_or",
    "mask_to_bias",
    "AttentionMask",
    "dot_product_attention_weights",
    "dot_product_attention",
    "Attention",
]


def causal_mask(QPos: Axis, KPos: Axis, q_start: Any = 0, k_start: Any = 0) -> NamedArray:
    """True where key position <= query position (positions offset by the starts).

    Args:
        QPos: query position axis.
        KPos: key position axis.
        q_start: position of the first query.
        k_start: position of the first key.
    """
    q = (arange(QPos) + q_start).broadcast_axis(KPos).rearrange((QPos.name, KPos.name))
    return q >= (arange(KPos) + k_start)


def prefix_lm_mask(
    QSeqLen: Axis, KSeqLen: Axis, prefix_len: Any, q_start: Any = 0, k_start: Any = 0
) -> NamedArray:
    """PrefixLM: every query sees the first `prefix_len` keys, and the rest causally.

    Args:
        QSeqLen: query position axis.
        KSeqLen: key position axis.
        prefix_len: length of the bidirectional prefix (may be traced).
        q_start: position of the first query.
        k_start: position of the first key.
    """
    if isinstance(prefix_len, int) and prefix_len < 0:
        raise ValueError(f"prefix_lm_mask: prefix_len must be >= 0, got {prefix_len}")
    prefix = (arange(KSeqLen) + k_start) < (prefix_len + k_start)
    return causal_mask(QSeqLen, KSeqLen, q_start, k_start) | prefix


def forgetful_causal_mask(
    KPos: Axis, mask_prob: float, sample_prob: bool = True, *, key: jax.Array
) -> NamedArray:
    """Forgetful causal masking (Liu et al. 2022, arXiv:2210.13432): drops each key position with
    probability `mask_prob` (drawn uniformly from `[0, mask_prob]` when `sample_prob`); position 0
    is always kept. Combine it with `causal_mask` by `&`.

    Args:
        KPos: key position axis.
        mask_prob: probability of dropping a position.
        sample_prob: draw the rate uniformly from `[0, mask_prob]` first.
        key: PRNG key.
    """
    first = arange(KPos) == 0
    if mask_prob == 0:
        return hax_ones(KPos, dtype=jnp.bool_)
    if mask_prob == 1:
        return first
    p = mask_prob
    if sample_prob:
        key, sub = jax.random.split(key)
        p = jax.random.uniform(sub, (), minval=0.0, maxval=mask_prob)
    return hrandom.bernoulli(key, KPos, 1.0 - p) | first


def _alibi_slopes(heads: int, bias_max: float) -> list[float]:
    """Press et al.'s head slopes, generalised to a maximum bias `bias_max` (8 in the paper):
    a geometric sequence for a power of two heads, interleaved from the next power otherwise."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - math.log2(bias_max))))
        return [start ** (i + 1) for i in range(n)]

    if math.log2(heads).is_integer():
        return power_of_2(heads)
    base = 2 ** math.floor(math.log2(heads))
    return power_of_2(base) + power_of_2(2 * base)[0::2][: heads - base]


def alibi_attention_bias(
    Heads: Axis, KPos: Axis, bias_max: float = 8, dtype: Any = jnp.float32
) -> NamedArray:
    """ALiBi (Press et al. 2022) bias `slope[h] * k`, axes `(Heads, KPos)`; add it to the
    attention logits (with a causal mask, this equals the paper's `-slope * (q - k)` up to a
    per-query constant, which softmax ignores).

    Args:
        Heads: the head axis.
        KPos: key position axis.
        bias_max: the largest slope exponent (8 in the paper).
        dtype: result dtype.

    >>> import meltemi.haliax as hax
    >>> b = alibi_attention_bias(hax.Axis("heads", 2), hax.Axis("kpos", 3))
    >>> b.array.tolist()
    [[0.0, 0.0625, 0.125], [0.0, 0.00390625, 0.0078125]]
    """
    slopes = NamedArray(jnp.asarray(_alibi_slopes(Heads.size, bias_max)), (Heads,))
    return (slopes * arange(KPos).broadcast_axis(Heads)).rearrange((Heads, KPos)).astype(dtype)


def segment_mask(q_segment_ids: NamedArray, kv_segment_ids: NamedArray) -> NamedArray:
    """True where query and key belong to the same segment (packed sequences).

    The two id arrays must use different position axis names (e.g. `pos` and `key_pos`).
    """
    q, kv = broadcast_arrays(q_segment_ids, kv_segment_ids, require_subset=False)  # outer ==
    return q == kv


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

    def materialize(self, QPos: Axis, KPos: Axis, q_start: Any = 0, k_start: Any = 0):
        """A bool NamedArray over `(QPos, KPos)` (plus any batch axes of the segment ids).

        Args:
            QPos: query position axis.
            KPos: key position axis.
            q_start: position of the first query.
            k_start: position of the first key.
        """
        mask = causal_mask(QPos, KPos, q_start, k_start) if self.is_causal else None
        if self.segment_ids is not None:
            q_ids = self.segment_ids
            kv = self.kv_segment_ids if self.kv_segment_ids is not None else q_ids
            if kv.has_axis(QPos.name) and QPos.name != KPos.name:
                kv = rename(kv, {QPos.name: KPos.name})
            mask = combine_masks_and(mask, segment_mask(q_ids, kv))
        return mask


def dot_product_attention_weights(
    Key: AxisSelector,
    KPos: AxisSelection,
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
    """Softmax over `KPos` of `query . key / sqrt(size(Key))` (with mask, bias, soft cap).

    Args:
        Key: the head-size axis contracted between query and key.
        KPos: key position axis (softmax is over it).
        query: queries.
        key: keys.
        mask: bool mask (True = attend), aligned by name.
        bias: added to the logits.
        attention_dtype: dtype of the logits and softmax.
        precision: matmul precision.
        scale: logit scale (default `1/sqrt(Key.size)`).
        logits_soft_cap: if set, `cap * tanh(logits / cap)`.
    """
    orig_dtype = query.dtype
    if scale is None:
        scale = 1.0 / math.sqrt(query.axis_size(Key))
    if jnp.issubdtype(query.dtype, jnp.inexact):
        query = query * jnp.asarray(scale, query.dtype)
    else:  # integer queries promote to float, as in Haliax (the result is cast back)
        query = query * scale
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
    KPos: AxisSelection,
    Key: AxisSelector,
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

    Args:
        KPos: key position axis.
        Key: the head-size axis of query and key.
        query: queries.
        key: keys.
        value: values (with `KPos`).
        mask: bool mask (True = attend), aligned by name.
        bias: added to the logits.
        attention_dtype: dtype of the logits and softmax.
        precision: matmul precision.
        scale: logit scale (default `1/sqrt(Key.size)`).
        logits_soft_cap: if set, `cap * tanh(logits / cap)`.

    Raises:
        ValueError: an axis of `KPos` is also an axis of `query`.
    """
    kpos = KPos if isinstance(KPos, tuple | list) else (KPos,)
    for ax in kpos:
        if query.has_axis(axis_name(ax)):
            raise ValueError(
                f"dot_product_attention: KPos axis {axis_name(ax)!r} is also an axis of query "
                f"({_fmt_axes(query.axes)}); attended-to axes must be distinct from the query's: "
                f"rename the key position axis, e.g. key.rename({{{axis_name(ax)!r}: 'key_pos'}})"
            )
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
        Embed: AxisSpec,
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
        """

        Args:
            Embed: model axis.
            num_heads: query heads.
            num_kv_heads: key/value heads (GQA; default `num_heads`).
            head_size: per-head size (default `Embed.size // num_heads`).
            key: PRNG key.
            use_bias: biases on q/k/v projections.
            use_output_bias: bias on the output projection (default `use_bias`).
            use_qk_norm: RMS-normalise q and k per head before RoPE.
            qk_norm_eps: epsilon of that norm.
            rotary: RotaryConfig for RoPE, or None.
            logits_soft_cap: soft cap of the attention logits.
        """
        num_kv_heads = num_kv_heads or num_heads
        if num_heads % num_kv_heads:
            raise ValueError(
                f"Attention: num_heads={num_heads} must be a multiple of "
                f"num_kv_heads={num_kv_heads}"
            )
        if head_size is None:
            head_size = axis_size(Embed) // num_heads
        KVHeads = Axis("kv_heads", num_kv_heads)
        Group = Axis("q_heads_per_group", num_heads // num_kv_heads)
        HeadSize = Axis("head_size", head_size)
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
        Pos: AxisSelector = "pos",
        positions: NamedArray | None = None,
        key: jax.Array | None = None,
    ) -> NamedArray:
        """`x` has `Pos` and `Embed` (plus batch axes); `positions` default to `arange(Pos)`.

        Args:
            x: input with `Embed` and the position axis.
            mask: AttentionMask or bool NamedArray, or None.
            Pos: the position axis (name or Axis).
            positions: RoPE positions (default `arange(Pos)`).
            key: unused (for a uniform layer interface).
        """
        Pos = x.resolve_axis(axis_name(Pos))
        KPos = Pos.alias("key_" + Pos.name)
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
