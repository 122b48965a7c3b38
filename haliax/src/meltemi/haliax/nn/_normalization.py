"""`LayerNorm` and `RmsNorm` over a named axis.

Statistics are computed in float32 when the input is lower precision, then cast back.

>>> import meltemi.haliax as hax
>>> Embed = hax.Axis("embed", 4)
>>> norm = hax.nn.RmsNorm.init(Embed, eps=1e-6)
>>> norm(hax.arange(Embed).astype(float)).axes
(Axis(name='embed', size=4),)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from meltemi.haliax._core import (
    Axis,
    AxisSpec,
    NamedArray,
    _as_tuple,
    flatten_axes,
    unflatten_axis,
)
from meltemi.haliax._ops import ones, zeros

__all__ = ["LayerNorm", "RmsNorm"]


def _stat_dtype(dtype):
    return jnp.promote_types(dtype, jnp.float32)


def _affine(out: NamedArray, weight: NamedArray | None, bias: NamedArray | None) -> NamedArray:
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


class LayerNorm(eqx.Module):
    """`(x - mean) / sqrt(var + eps) * weight + bias` over `axis`."""

    weight: NamedArray | None
    bias: NamedArray | None
    axis: AxisSpec = eqx.field(static=True)
    eps: float = eqx.field(static=True, default=1e-5)

    @staticmethod
    def init(
        axis: AxisSpec,
        eps: float = 1e-5,
        use_weight: bool = True,
        use_bias: bool = True,
        dtype: Any = jnp.float32,
    ) -> LayerNorm:
        """

        Args:
            axis: the axis (or axes) normalised over.
            eps: added to the variance.
            use_weight: learnable scale.
            use_bias: learnable shift.
            dtype: parameter dtype.
        """
        weight = ones(axis, dtype) if use_weight else None
        bias = zeros(axis, dtype) if use_bias else None
        return LayerNorm(weight, bias, axis, eps)

    def flatten_for_export(self) -> LayerNorm:
        """This layer with its axes flattened into one (`__OUT`), as in a PyTorch checkpoint."""
        if isinstance(self.axis, Axis):
            return self
        axes = _as_tuple(self.axis)
        new = Axis("__OUT", math.prod(a.size for a in axes))

        def flat(a: NamedArray | None) -> NamedArray | None:
            return None if a is None else flatten_axes(a, axes, new)

        return dataclasses.replace(self, weight=flat(self.weight), bias=flat(self.bias), axis=new)

    def unflatten_from_export(self, template: LayerNorm) -> LayerNorm:
        """The inverse of `flatten_for_export`, with `template`'s axes."""
        if template.axis == self.axis:
            return self

        def unflat(a: NamedArray | None) -> NamedArray | None:
            return None if a is None else unflatten_axis(a, self.axis, template.axis)

        return dataclasses.replace(
            self, weight=unflat(self.weight), bias=unflat(self.bias), axis=template.axis
        )

    @jax.named_scope("layer_norm")
    def __call__(self, x: NamedArray) -> NamedArray:
        idx = tuple(x.axis_index(a) for a in _as_tuple(self.axis))
        a = x.array.astype(_stat_dtype(x.dtype))
        mean = jnp.mean(a, axis=idx, keepdims=True)
        var = jnp.mean(jnp.square(a - mean), axis=idx, keepdims=True)
        out = NamedArray(((a - mean) * jax.lax.rsqrt(var + self.eps)).astype(x.dtype), x.axes)
        return _affine(out, self.weight, self.bias)


class RmsNorm(eqx.Module):
    """`x / sqrt(mean(x^2) + eps) * weight (+ bias)` over `axis` (Llama's RMSNorm)."""

    weight: NamedArray | None
    bias: NamedArray | None
    axis: AxisSpec = eqx.field(static=True)
    eps: float = eqx.field(static=True, default=1e-6)

    @staticmethod
    def init(
        axis: AxisSpec,
        eps: float = 1e-6,
        use_weight: bool = True,
        use_bias: bool = False,
        dtype: Any = jnp.float32,
    ) -> RmsNorm:
        """

        Args:
            axis: the axis (or axes) normalised over.
            eps: added to the mean square.
            use_weight: learnable scale.
            use_bias: learnable shift.
            dtype: parameter dtype.
        """
        weight = ones(axis, dtype) if use_weight else None
        bias = zeros(axis, dtype) if use_bias else None
        return RmsNorm(weight, bias, axis, eps)

    @jax.named_scope("rms_norm")
    def __call__(self, x: NamedArray) -> NamedArray:
        idx = tuple(x.axis_index(a) for a in _as_tuple(self.axis))
        a = x.array.astype(_stat_dtype(x.dtype))
        ms = jnp.mean(jnp.square(a), axis=idx, keepdims=True)
        out = NamedArray((a * jax.lax.rsqrt(ms + self.eps)).astype(x.dtype), x.axes)
        return _affine(out, self.weight, self.bias)
