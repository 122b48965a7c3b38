"""`Conv` and `ConvTranspose`: N-d convolutions over named spatial axes.

The weight has axes `(Out, In', *kernel)` where `In'` is `In` divided by `groups` and each
kernel axis has the name of its spatial axis and the kernel size. All other input axes are batch
axes (flattened into one for `lax.conv_general_dilated` and restored).

>>> import jax
>>> import meltemi.haliax as hax
>>> Batch, H, W, C, D = hax.make_axes(batch=2, h=7, w=5, c=3, d=4)
>>> conv = hax.nn.Conv.init((H, W), C, D, kernel_size=3, padding=1, key=jax.random.key(0))
>>> conv(hax.ones((Batch, H, W, C))).shape
{'batch': 2, 'h': 7, 'w': 5, 'd': 4}
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from meltemi.haliax import random as hrandom
from meltemi.haliax._core import (
    Axis,
    AxisError,
    AxisSelection,
    NamedArray,
    _as_tuple,
    axis_name,
)

__all__ = ["Conv", "ConvTranspose"]


def _per_dim(value: Any, n: int, what: str) -> tuple[Any, ...]:
    vals = (value,) if isinstance(value, int) else tuple(value)
    if len(vals) == 1:
        vals = vals * n
    if len(vals) != n:
        raise ValueError(f"{what}: expected 1 or {n} values (one per spatial axis), got {vals!r}")
    return vals


def _padding(value: Any, n: int) -> tuple[tuple[int, int], ...]:
    vals = _per_dim(value, n, "padding") if not isinstance(value, int) else (value,) * n
    return tuple((p, p) if isinstance(p, int) else (int(p[0]), int(p[1])) for p in vals)


def _init_weight(key, Spatial, In, Out, kernel_size, groups, use_bias, dtype):
    if In.size % groups:
        raise ValueError(
            f"In axis {In.name!r} of size {In.size} is not divisible by groups={groups}"
        )
    kernel = tuple(Axis(n, k) for n, k in zip(Spatial, kernel_size))
    in_group = In.resize(In.size // groups)
    limit = 1 / math.sqrt(math.prod(kernel_size) * in_group.size)
    kw, kb = jax.random.split(key)
    weight = hrandom.uniform(kw, (Out, in_group, *kernel), dtype, -limit, limit)
    bias = hrandom.uniform(kb, (Out,), dtype, -limit, limit) if use_bias else None
    return weight, bias


class _ConvBase(eqx.Module):
    Spatial: tuple[str, ...] = eqx.field(static=True)
    In: Axis = eqx.field(static=True)
    Out: Axis = eqx.field(static=True)
    weight: NamedArray
    bias: NamedArray | None

    def _check(self, x: NamedArray) -> None:
        missing = [n for n in (*self.Spatial, self.In.name) if not x.has_axis(n)]
        if missing:
            raise AxisError(
                f"{type(self).__name__}: input axes {[a.name for a in x.axes]} lack {missing}; "
                f"the layer convolves over {list(self.Spatial)} with channels {self.In.name!r}"
            )
        if x.has_axis(self.Out.name) and self.Out.name != self.In.name:
            raise AxisError(
                f"{type(self).__name__}: the input already has the output axis {self.Out.name!r}"
            )

    def _apply(self, x: NamedArray, conv) -> NamedArray:
        """Runs `conv(lhs (N, C, *spatial), rhs (O, I, *kernel)) -> (N, O, *spatial')`."""
        self._check(x)
        batch = [a for a in x.axes if a.name not in (*self.Spatial, self.In.name)]
        order = [a.name for a in batch] + [self.In.name, *self.Spatial]
        raw = x.rearrange(order).array
        lhs = raw.reshape((math.prod(a.size for a in batch), *raw.shape[len(batch) :]))
        rhs = self.weight.rearrange((self.Out.name, self.In.name, *self.Spatial)).array
        out = conv(lhs, rhs)
        out = out.reshape((*(a.size for a in batch), *out.shape[1:]))
        sizes = dict(zip(self.Spatial, out.shape[len(batch) + 1 :]))
        axes = tuple(batch) + (self.Out,) + tuple(Axis(n, sizes[n]) for n in self.Spatial)
        y = NamedArray(out, axes)
        if self.bias is not None:
            y = y + self.bias
        target = [self.Out.name if a.name == self.In.name else a.name for a in x.axes]
        return y.rearrange(target)


class Conv(_ConvBase):
    """N-d convolution (cross-correlation, as PyTorch) over the named `Spatial` axes.

    `out = (in + pad_lo + pad_hi - dilation * (k - 1) - 1) // stride + 1` along each spatial axis;
    `In` is replaced by `Out`.
    """

    kernel_size: tuple[int, ...] = eqx.field(static=True)
    stride: tuple[int, ...] = eqx.field(static=True)
    padding: tuple[tuple[int, int], ...] = eqx.field(static=True)
    dilation: tuple[int, ...] = eqx.field(static=True)
    groups: int = eqx.field(static=True)

    @staticmethod
    def init(
        Spatial: AxisSelection,
        In: Axis,
        Out: Axis,
        kernel_size: int | Sequence[int],
        *,
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] | Sequence[tuple[int, int]] = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        use_bias: bool = True,
        key: jax.Array,
        dtype: Any = jnp.float32,
    ) -> Conv:
        """Uniform weights in `+-1/sqrt(fan_in)` (PyTorch's default).

        Args:
            Spatial: the spatial axes (names or Axes), in kernel order.
            In: the input channel axis.
            Out: the output channel axis.
            kernel_size: one size, or one per spatial axis.
            stride: one stride, or one per spatial axis.
            padding: one int, one per axis, or `(low, high)` per axis.
            dilation: kernel dilation, one or per axis.
            groups: split channels into this many independent groups.
            use_bias: add a bias over `Out`.
            key: PRNG key.
            dtype: parameter dtype.

        Returns:
            The layer.
        """
        names = tuple(axis_name(a) for a in _as_tuple(Spatial))
        if not names:
            raise ValueError("Conv needs at least one spatial axis")
        n = len(names)
        ks = _per_dim(kernel_size, n, "kernel_size")
        weight, bias = _init_weight(key, names, In, Out, ks, groups, use_bias, dtype)
        return Conv(
            names, In, Out, weight, bias, ks, _per_dim(stride, n, "stride"),
            _padding(padding, n), _per_dim(dilation, n, "dilation"), groups,
        )  # fmt: skip

    @jax.named_scope("conv")
    def __call__(self, inputs: NamedArray, *, key: jax.Array | None = None) -> NamedArray:
        sp = "".join("HWDTUVXYZ"[i] for i in range(len(self.Spatial)))
        dims = ("NC" + sp, "OI" + sp, "NC" + sp)

        def conv(lhs, rhs):
            return jax.lax.conv_general_dilated(
                lhs, rhs, self.stride, self.padding, rhs_dilation=self.dilation,
                dimension_numbers=dims, feature_group_count=self.groups,
            )  # fmt: skip

        return self._apply(inputs, conv)


class ConvTranspose(_ConvBase):
    """Transposed convolution: `out = (in - 1) * stride - pad_lo - pad_hi +
    dilation * (k - 1) + output_padding + 1` along each spatial axis.

    Each input element adds `x[i] * weight[..., K - 1 - m]` at output position
    `i * stride + m * dilation - pad_lo` (Haliax's and Equinox's convention: the kernel is applied
    flipped relative to PyTorch's `ConvTranspose`, whose weight is also `(In, Out, ...)`).
    """

    kernel_size: tuple[int, ...] = eqx.field(static=True)
    stride: tuple[int, ...] = eqx.field(static=True)
    padding: tuple[tuple[int, int], ...] = eqx.field(static=True)
    output_padding: tuple[int, ...] = eqx.field(static=True)
    dilation: tuple[int, ...] = eqx.field(static=True)
    groups: int = eqx.field(static=True)

    @staticmethod
    def init(
        Spatial: AxisSelection,
        In: Axis,
        Out: Axis,
        kernel_size: int | Sequence[int],
        *,
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] | Sequence[tuple[int, int]] = 0,
        output_padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        use_bias: bool = True,
        key: jax.Array,
        dtype: Any = jnp.float32,
    ) -> ConvTranspose:
        """Uniform weights in `+-1/sqrt(fan_in)`.

        Args:
            Spatial: the spatial axes (names or Axes), in kernel order.
            In: the input channel axis.
            Out: the output channel axis.
            kernel_size: one size, or one per spatial axis.
            stride: one stride, or one per spatial axis (the input dilation).
            padding: one int, one per axis, or `(low, high)` per axis (cropped from the output).
            output_padding: extra size added to the high side of each output axis.
            dilation: kernel dilation, one or per axis.
            groups: split channels into this many independent groups.
            use_bias: add a bias over `Out`.
            key: PRNG key.
            dtype: parameter dtype.

        Returns:
            The layer.
        """
        names = tuple(axis_name(a) for a in _as_tuple(Spatial))
        if not names:
            raise ValueError("ConvTranspose needs at least one spatial axis")
        n = len(names)
        ks = _per_dim(kernel_size, n, "kernel_size")
        weight, bias = _init_weight(key, names, In, Out, ks, groups, use_bias, dtype)
        return ConvTranspose(
            names, In, Out, weight, bias, ks, _per_dim(stride, n, "stride"),
            _padding(padding, n), _per_dim(output_padding, n, "output_padding"),
            _per_dim(dilation, n, "dilation"), groups,
        )  # fmt: skip

    @jax.named_scope("conv_transpose")
    def __call__(self, inputs: NamedArray, *, key: jax.Array | None = None) -> NamedArray:
        sp = "".join("HWDTUVXYZ"[i] for i in range(len(self.Spatial)))
        dims = ("NC" + sp, "OI" + sp, "NC" + sp)
        pads = tuple(
            (d * (k - 1) - lo, d * (k - 1) - hi + o)
            for k, (lo, hi), o, d in zip(
                self.kernel_size, self.padding, self.output_padding, self.dilation
            )
        )

        def conv(lhs, rhs):
            return jax.lax.conv_general_dilated(
                lhs, rhs, (1,) * len(self.Spatial), pads, lhs_dilation=self.stride,
                rhs_dilation=self.dilation, dimension_numbers=dims,
                feature_group_count=self.groups,
            )  # fmt: skip

        return self._apply(inputs, conv)
