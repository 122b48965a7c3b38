"""Elementwise ops, array constructors and shape-preserving ops, aligned by axis name.

>>> import jax.numpy as jnp
>>> import meltemi.haliax as hax
>>> A, B = hax.Axis("a", 2), hax.Axis("b", 3)
>>> x = hax.arange(B) * hax.ones(A)
>>> x.axes
(Axis(name='b', size=3), Axis(name='a', size=2))
>>> hax.exp(hax.zeros(A)).array
Array([1., 1.], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from meltemi.haliax._core import (
    Axis,
    AxisError,
    AxisSelector,
    AxisSpec,
    NamedArray,
    _as_tuple,
    _check_unique,
    _raw_operands,
    axis_name,
    check_axes_match,
)

__all__ = [
    "zeros",
    "ones",
    "full",
    "zeros_like",
    "ones_like",
    "full_like",
    "arange",
    "linspace",
    "where",
    "clip",
    "concatenate",
    "stack",
    "unbind",
    "top_k",
    "cumsum",
    "cumprod",
    "sort",
    "argsort",
    "roll",
    "tril",
    "triu",
    "isclose",
    "allclose",
    "array_equal",
    "nan_to_num",
    "UNARY_OPS",
    "BINARY_OPS",
]


def _shape(axes: AxisSpec) -> tuple[tuple[Axis, ...], tuple[int, ...]]:
    ax = tuple(_as_tuple(axes))
    for a in ax:
        if not isinstance(a, Axis):
            raise TypeError(f"constructors need Axis objects with sizes, got {a!r}")
    _check_unique([a.name for a in ax], "shape")  # type: ignore[union-attr]
    return ax, tuple(a.size for a in ax)  # type: ignore[union-attr,return-value]


def zeros(shape: AxisSpec, dtype=None) -> NamedArray:
    """`jnp.zeros` over named axes: `hax.zeros((Batch, Embed))`."""
    ax, s = _shape(shape)
    return NamedArray(jnp.zeros(s, dtype), ax)


def ones(shape: AxisSpec, dtype=None) -> NamedArray:
    ax, s = _shape(shape)
    return NamedArray(jnp.ones(s, dtype), ax)


def full(shape: AxisSpec, fill_value, dtype=None) -> NamedArray:
    ax, s = _shape(shape)
    return NamedArray(jnp.full(s, fill_value, dtype), ax)


def zeros_like(a: NamedArray, dtype=None) -> NamedArray:
    return NamedArray(jnp.zeros_like(a.array, dtype), a.axes)


def ones_like(a: NamedArray, dtype=None) -> NamedArray:
    return NamedArray(jnp.ones_like(a.array, dtype), a.axes)


def full_like(a: NamedArray, fill_value, dtype=None) -> NamedArray:
    return NamedArray(jnp.full_like(a.array, fill_value, dtype), a.axes)


def arange(axis: Axis, *, start=0, step=1, dtype=None) -> NamedArray:
    """`start + step * i` for i along `axis`.

    >>> arange(Axis("pos", 4), start=1).array
    Array([1, 2, 3, 4], dtype=int32)
    """
    return NamedArray(jnp.arange(axis.size, dtype=dtype) * step + start, (axis,))


def linspace(axis: Axis, *, start=0.0, stop=1.0, endpoint=True, dtype=None) -> NamedArray:
    return NamedArray(jnp.linspace(start, stop, axis.size, endpoint=endpoint, dtype=dtype), (axis,))


def _wrap_unary(fn: Callable) -> Callable:
    def wrapped(a, *args, **kwargs):
        if isinstance(a, NamedArray):
            return NamedArray(fn(a.array, *args, **kwargs), a.axes)
        return fn(a, *args, **kwargs)

    wrapped.__name__ = fn.__name__
    wrapped.__qualname__ = fn.__name__
    wrapped.__doc__ = f"Named version of `jnp.{fn.__name__}` (elementwise; axes are kept)."
    return wrapped


def _wrap_binary(fn: Callable) -> Callable:
    def wrapped(a, b, *args, **kwargs):
        if isinstance(a, NamedArray) or isinstance(b, NamedArray):
            axes, (ra, rb) = _raw_operands(a, b)
            return NamedArray(fn(ra, rb, *args, **kwargs), axes)
        return fn(a, b, *args, **kwargs)

    wrapped.__name__ = fn.__name__
    wrapped.__qualname__ = fn.__name__
    wrapped.__doc__ = (
        f"Named version of `jnp.{fn.__name__}`: operands are aligned by axis name and broadcast."
    )
    return wrapped


UNARY_OPS = (
    "abs absolute negative positive sign floor ceil round trunc rint exp exp2 expm1 log log2 log10 "
    "log1p sqrt cbrt square reciprocal sin cos tan arcsin arccos arctan sinh cosh tanh arcsinh "
    "arccosh arctanh isnan isinf isfinite logical_not invert bitwise_not conj real imag angle "
    "deg2rad rad2deg signbit"
).split()

BINARY_OPS = (
    "add subtract multiply divide true_divide floor_divide power float_power mod remainder fmod "
    "maximum minimum fmax fmin arctan2 hypot logaddexp logaddexp2 equal not_equal less less_equal "
    "greater greater_equal logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor "
    "left_shift right_shift copysign nextafter"
).split()

_g = globals()
for _name in UNARY_OPS:
    _g[_name] = _wrap_unary(getattr(jnp, _name))
    __all__.append(_name)
for _name in BINARY_OPS:
    _g[_name] = _wrap_binary(getattr(jnp, _name))
    __all__.append(_name)
rsqrt = _wrap_unary(jax.lax.rsqrt)
__all__.append("rsqrt")
del _g, _name


def where(condition: Any, x: Any = None, y: Any = None) -> NamedArray:
    """`jnp.where(condition, x, y)` with all three aligned by name.

    >>> A = Axis("a", 3)
    >>> where(arange(A) > 0, 1.0, 0.0).array
    Array([0., 1., 1.], dtype=float32, weak_type=True)
    """
    if x is None or y is None:
        raise TypeError("hax.where needs x and y (the one-argument form has no static shape)")
    axes, (rc, rx, ry) = _raw_operands(condition, x, y)
    return NamedArray(jnp.where(rc, rx, ry), axes)


def clip(a: NamedArray, a_min: Any = None, a_max: Any = None) -> NamedArray:
    """Clips `a` to `[a_min, a_max]` (bounds may be NamedArrays, aligned by name)."""
    axes, (ra, lo, hi) = _raw_operands(a, a_min, a_max)
    return NamedArray(jnp.clip(ra, lo, hi), axes)


def nan_to_num(a: NamedArray, nan=0.0, posinf=None, neginf=None) -> NamedArray:
    return NamedArray(jnp.nan_to_num(a.array, nan=nan, posinf=posinf, neginf=neginf), a.axes)


def isclose(a: NamedArray, b: NamedArray, rtol=1e-5, atol=1e-8) -> NamedArray:
    axes, (ra, rb) = _raw_operands(a, b)
    return NamedArray(jnp.isclose(ra, rb, rtol=rtol, atol=atol), axes)


def allclose(a: NamedArray, b: NamedArray, rtol=1e-5, atol=1e-8) -> bool:
    """Like `jnp.allclose`, after aligning by name; different axis sets are never close."""
    if {x.name for x in a.axes} != {x.name for x in b.axes}:
        return False
    axes, (ra, rb) = _raw_operands(a, b)
    return bool(jnp.allclose(ra, rb, rtol=rtol, atol=atol))


def array_equal(a: NamedArray, b: NamedArray) -> bool:
    if {x.name for x in a.axes} != {x.name for x in b.axes}:
        return False
    axes, (ra, rb) = _raw_operands(a, b)
    return bool(jnp.array_equal(ra, rb))


def concatenate(axis: AxisSelector, arrays: Sequence[NamedArray]) -> NamedArray:
    """Joins arrays along `axis` (sizes may differ there); other axes are aligned by name.

    >>> A, B = Axis("a", 2), Axis("b", 3)
    >>> concatenate("a", [zeros((A, B)), ones((B, A.resize(1)))]).shape
    {'a': 3, 'b': 3}
    """
    if not arrays:
        raise ValueError("concatenate needs at least one array")
    name = axis_name(axis)
    first = arrays[0]
    i = first.axis_index(name)
    order = [a.name for a in first.axes]
    raws, total = [], 0
    for arr in arrays:
        arr.axis_index(name)
        others = {a.name for a in arr.axes}
        if others != set(order):
            raise AxisError(
                f"concatenate: arrays must have the same axes; got {list(order)} and "
                f"{[a.name for a in arr.axes]}"
            )
        for a in arr.axes:
            if a.name != name:
                check_axes_match(first.resolve_axis(a.name), a, "concatenate")
        raws.append(arr.rearrange(order).array)
        total += arr.axis_size(name)
    new_axis = axis if isinstance(axis, Axis) else Axis(name, total)  # type: ignore[arg-type]
    if new_axis.size != total:
        raise AxisError(
            f"concatenate: axis {name!r} given size {new_axis.size}, inputs sum to {total}"
        )
    axes = first.axes[:i] + (new_axis,) + first.axes[i + 1 :]
    return NamedArray(jnp.concatenate(raws, axis=i), axes)


def stack(axis: AxisSelector, arrays: Sequence[NamedArray]) -> NamedArray:
    """Stacks arrays along a new leading axis (others are aligned to the first array's order)."""
    if not arrays:
        raise ValueError("stack needs at least one array")
    new_axis = axis if isinstance(axis, Axis) else Axis(axis, len(arrays))
    if new_axis.size != len(arrays):
        raise AxisError(
            f"stack: axis {new_axis.name!r} has size {new_axis.size} but got {len(arrays)} arrays"
        )
    order = arrays[0].axes
    if arrays[0].has_axis(new_axis.name):
        raise AxisError(f"stack: the arrays already have an axis {new_axis.name!r}")
    raws = [a.rearrange([x.name for x in order]).array for a in arrays]
    return NamedArray(jnp.stack(raws, axis=0), (new_axis,) + order)


def unbind(array: NamedArray, axis: AxisSelector) -> list[NamedArray]:
    """The slices of `array` along `axis` (the inverse of `stack`)."""
    i = array.axis_index(axis)
    rest = array.axes[:i] + array.axes[i + 1 :]
    arr = jnp.moveaxis(array.array, i, 0)
    return [NamedArray(arr[j], rest) for j in range(array.axes[i].size)]


def top_k(array: NamedArray, axis: AxisSelector, k: int, new_axis: AxisSelector | None = None):
    """Largest `k` values along `axis` and their indices; the axis becomes `new_axis` (size k)."""
    i = array.axis_index(axis)
    old = array.axes[i]
    if new_axis is None:
        new = old.resize(k)
    elif isinstance(new_axis, Axis):
        new = new_axis
    else:
        new = Axis(new_axis, k)
    arr = jnp.moveaxis(array.array, i, -1)
    values, idx = jax.lax.top_k(arr, k)
    values, idx = jnp.moveaxis(values, -1, i), jnp.moveaxis(idx, -1, i)
    axes = array.axes[:i] + (new,) + array.axes[i + 1 :]
    return NamedArray(values, axes), NamedArray(idx, axes)


def _along(fn):
    def wrapped(array: NamedArray, axis: AxisSelector, *args, **kwargs) -> NamedArray:
        i = array.axis_index(axis)
        return NamedArray(fn(array.array, *args, axis=i, **kwargs), array.axes)

    wrapped.__name__ = fn.__name__
    wrapped.__qualname__ = fn.__name__
    wrapped.__doc__ = f"`jnp.{fn.__name__}` along a named axis."
    return wrapped


cumsum = _along(jnp.cumsum)
cumprod = _along(jnp.cumprod)
sort = _along(jnp.sort)
argsort = _along(jnp.argsort)


def roll(array: NamedArray, shift: int | jax.Array, axis: AxisSelector) -> NamedArray:
    """`jnp.roll` along a named axis."""
    i = array.axis_index(axis)
    return NamedArray(jnp.roll(array.array, shift, axis=i), array.axes)


def _tri(fn):
    def wrapped(array: NamedArray, axes: tuple[AxisSelector, AxisSelector], k: int = 0):
        r, c = axes
        moved = array.rearrange((..., r, c))
        return NamedArray(fn(moved.array, k=k), moved.axes).rearrange([a.name for a in array.axes])

    wrapped.__name__ = fn.__name__
    wrapped.__doc__ = f"`jnp.{fn.__name__}` over the (row, column) axes given by name."
    return wrapped


tril = _tri(jnp.tril)
triu = _tri(jnp.triu)
