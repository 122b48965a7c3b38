"""Reductions over named axes.

`axis=None` reduces every axis and returns a NamedArray with no axes (`.scalar()` unwraps it).

>>> import meltemi.haliax as hax
>>> A, B = hax.Axis("a", 2), hax.Axis("b", 3)
>>> x = hax.arange(B).broadcast_axis(A) * hax.ones(A)
>>> hax.sum(x, axis="b").axes
(Axis(name='a', size=2),)
>>> float(hax.mean(x).scalar())
1.0
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from meltemi.haliax._core import (
    AxisSelection,
    AxisSelector,
    NamedArray,
    _as_tuple,
    _check_unique,
    _raw_operands,
)

__all__ = [
    "sum",
    "mean",
    "max",
    "min",
    "prod",
    "std",
    "var",
    "logsumexp",
    "argmax",
    "argmin",
    "any",
    "all",
    "count_nonzero",
    "amax",
    "amin",
    "product",
    "ptp",
    "nansum",
    "nanmean",
    "nanmax",
    "nanmin",
    "nanprod",
    "nanstd",
    "nanvar",
    "nanargmax",
    "nanargmin",
    "trace",
]


def _reduce_indices(array: NamedArray, axis: AxisSelection | None) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(array.ndim))
    sel = _as_tuple(axis)
    idx = tuple(array.axis_index(a) for a in sel)
    _check_unique([array.axes[i].name for i in idx], "reduction axes")
    return idx


def _make_reduction(fn: Callable, name: str, supports_where: bool = True) -> Callable:
    def reduction(
        array: NamedArray, axis: AxisSelection | None = None, *, where: Any = None, **kwargs
    ) -> NamedArray:
        if not isinstance(array, NamedArray):  # Haliax passes unnamed arrays through to jnp
            if axis is not None:
                raise TypeError(
                    f"hax.{name}: axis={axis!r} names an axis but the input is an unnamed "
                    f"{type(array).__name__}; wrap it with hax.named(array, axes) first"
                )
            if where is not None:
                kwargs["where"] = where
            return fn(array, **kwargs)
        idx = _reduce_indices(array, axis)
        arr = array.array
        if where is not None:
            if not supports_where:
                raise TypeError(f"hax.{name} does not take `where`")
            _, (arr, w) = _raw_operands(array, where, context=f"hax.{name} where=")
            w = jnp.broadcast_to(w, arr.shape)
            kwargs["where"] = w
        out = fn(arr, axis=idx, **kwargs)
        keep = tuple(a for i, a in enumerate(array.axes) if i not in idx)
        return NamedArray(out, keep)

    reduction.__name__ = name
    reduction.__qualname__ = name
    reduction.__doc__ = (
        f"`jnp.{name}` over the named axes `axis` (all axes if None). `where` (a NamedArray, "
        f"aligned by name) masks elements out of the reduction. An unnamed array (with "
        f"`axis=None`) is reduced by `jnp.{name}` and returned unnamed, as in Haliax."
    )
    return reduction


sum = _make_reduction(jnp.sum, "sum")
mean = _make_reduction(jnp.mean, "mean")
max = _make_reduction(jnp.max, "max")
min = _make_reduction(jnp.min, "min")
prod = _make_reduction(jnp.prod, "prod")
std = _make_reduction(jnp.std, "std")
var = _make_reduction(jnp.var, "var")
any = _make_reduction(jnp.any, "any")
all = _make_reduction(jnp.all, "all")
count_nonzero = _make_reduction(jnp.count_nonzero, "count_nonzero", supports_where=False)
amax = _make_reduction(jnp.max, "amax")
amin = _make_reduction(jnp.min, "amin")
product = _make_reduction(jnp.prod, "product")
nansum = _make_reduction(jnp.nansum, "nansum")
nanmean = _make_reduction(jnp.nanmean, "nanmean")
nanmax = _make_reduction(jnp.nanmax, "nanmax")
nanmin = _make_reduction(jnp.nanmin, "nanmin")
nanprod = _make_reduction(jnp.nanprod, "nanprod")
nanstd = _make_reduction(jnp.nanstd, "nanstd")
nanvar = _make_reduction(jnp.nanvar, "nanvar")


def ptp(array: NamedArray, axis: AxisSelection | None = None, *, where: Any = None) -> NamedArray:
    """Peak to peak, `max - min`, over the named axes (all if None)."""
    if where is None:
        return max(array, axis) - min(array, axis)
    big = jnp.finfo(array.dtype).max if jnp.issubdtype(array.dtype, jnp.floating) else None
    if big is None:
        big = jnp.iinfo(array.dtype).max
    return max(array, axis, where=where, initial=-big) - min(array, axis, where=where, initial=big)


def trace(
    array: NamedArray, axis1: AxisSelector, axis2: AxisSelector, offset: int = 0, dtype: Any = None
) -> NamedArray:
    """Sum of the diagonal over (`axis1`, `axis2`); both axes are removed.

    Args:
        array: the array.
        axis1: row axis.
        axis2: column axis.
        offset: diagonal offset (positive: above the main diagonal).
        dtype: accumulation dtype.

    >>> import meltemi.haliax as hax
    >>> A, B = hax.Axis("a", 3), hax.Axis("b", 3)
    >>> float(trace(hax.ones((A, B)), A, B).scalar())
    3.0
    """
    i, j = array.axis_index(axis1), array.axis_index(axis2)
    _check_unique([array.axes[i].name, array.axes[j].name], "trace axes")
    out = jnp.trace(array.array, offset=offset, axis1=i, axis2=j, dtype=dtype)
    return NamedArray(out, tuple(a for k, a in enumerate(array.axes) if k not in (i, j)))


def logsumexp(array: NamedArray, axis: AxisSelection | None = None, *, where=None) -> NamedArray:
    """`log(sum(exp(array)))` over named axes, computed stably."""
    idx = _reduce_indices(array, axis)
    arr = array.array
    kwargs = {}
    if where is not None:
        _, (arr, w) = _raw_operands(array, where, context="hax.logsumexp where=")
        kwargs["where"] = jnp.broadcast_to(w, arr.shape)
    out = jax.nn.logsumexp(arr, axis=idx, **kwargs)
    return NamedArray(out, tuple(a for i, a in enumerate(array.axes) if i not in idx))


def _make_arg(fn: Callable, name: str) -> Callable:
    def arg(array: NamedArray, axis: AxisSelector | None = None) -> NamedArray:
        if axis is None:
            return NamedArray(fn(array.array.reshape(-1)), ())
        i = array.axis_index(axis)
        return NamedArray(fn(array.array, axis=i), array.axes[:i] + array.axes[i + 1 :])

    arg.__name__ = name
    arg.__qualname__ = name
    arg.__doc__ = f"`jnp.{name}` along one named axis (the axis is removed)."
    return arg


argmax = _make_arg(jnp.argmax, "argmax")
argmin = _make_arg(jnp.argmin, "argmin")
nanargmax = _make_arg(jnp.nanargmax, "nanargmax")
nanargmin = _make_arg(jnp.nanargmin, "nanargmin")
