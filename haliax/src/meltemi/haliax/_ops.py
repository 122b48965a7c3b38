"""Elementwise ops, array constructors and shape-preserving ops, aligned by axis name.

>>> import jax.numpy as jnp
>>> import meltemi.haliax as hax
>>> A, B = hax.Axis("a", 2), hax.Axis("b", 3)
>>> x = hax.arange(B).broadcast_axis(A) * hax.ones(A)  # one operand has all the axes
>>> x.axes
(Axis(name='a', size=2), Axis(name='b', size=3))
>>> hax.exp(hax.zeros(A)).array
Array([1., 1.], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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
    _scalar_with_unnamed_array,
    _unwrap_scalar,
    axis_name,
    check_axes_match,
    flatten_axes,
)

UNARY_OPS = (
    "abs",
    "absolute",
    "negative",
    "positive",
    "sign",
    "floor",
    "ceil",
    "round",
    "trunc",
    "rint",
    "exp",
    "exp2",
    "expm1",
    "log",
    "log2",
    "log10",
    "log1p",
    "sqrt",
    "cbrt",
    "square",
    "reciprocal",
    "sin",
    "cos",
    "tan",
    "arcsin",
    "arccos",
    "arctan",
    "sinh",
    "cosh",
    "tanh",
    "arcsinh",
    "arccosh",
    "arctanh",
    "isnan",
    "isinf",
    "isfinite",
    "isneginf",
    "isposinf",
    "iscomplex",
    "isreal",
    "logical_not",
    "conj",
    "conjugate",
    "real",
    "imag",
    "angle",
    "deg2rad",
    "rad2deg",
    "degrees",
    "radians",
    "signbit",
    "around",
    "fabs",
    "i0",
    "sinc",
    "copy",
    "rsqrt",
    "fix",
)
"""Names of the elementwise one-argument ops."""
BINARY_OPS = (
    "add",
    "subtract",
    "multiply",
    "divide",
    "true_divide",
    "floor_divide",
    "power",
    "float_power",
    "mod",
    "remainder",
    "fmod",
    "maximum",
    "minimum",
    "fmax",
    "fmin",
    "arctan2",
    "hypot",
    "logaddexp",
    "logaddexp2",
    "equal",
    "not_equal",
    "less",
    "less_equal",
    "greater",
    "greater_equal",
    "logical_and",
    "logical_or",
    "logical_xor",
    "copysign",
    "nextafter",
)
"""Names of the elementwise two-argument ops (operands aligned by name)."""

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
    "nancumsum",
    "nancumprod",
    "array_equiv",
    "divmod",
    "frexp",
    "ndim",
    "pad",
    "pad_left",
    "ravel",
    "flatten",
    *UNARY_OPS,
    *BINARY_OPS,
    "UNARY_OPS",
    "BINARY_OPS",
]


def _shape(axes: AxisSpec) -> tuple[tuple[Axis, ...], tuple[int, ...]]:
    if isinstance(axes, Mapping):  # Haliax's ShapeDict: {"batch": 3, "embed": 5}
        axes = tuple(Axis(n, s) for n, s in axes.items())
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


def arange(axis: AxisSpec, *, start=0, step=1, dtype=None) -> NamedArray:
    """`start + step * i` for i along `axis`; several axes number their elements row-major.

    Args:
        axis: the axis (its size is the number of values), or several axes.
        start: first value (may be traced).
        step: spacing.
        dtype: result dtype.

    >>> arange(Axis("pos", 4), start=1).array
    Array([1, 2, 3, 4], dtype=int32)
    >>> arange((Axis("a", 2), Axis("b", 3))).array
    Array([[0, 1, 2],
           [3, 4, 5]], dtype=int32)
    """
    ax, s = _shape(axis)
    n = 1
    for d in s:
        n *= d
    return NamedArray((jnp.arange(n, dtype=dtype) * step + start).reshape(s), ax)


def linspace(axis: AxisSelector, *, start=0.0, stop=1.0, endpoint=True, dtype=None) -> NamedArray:
    """`axis.size` evenly spaced values from `start` to `stop`.

    Args:
        axis: the axis (its size is the number of values); a bare name gets numpy's 50.
        start: first value.
        stop: last value (or the end, with `endpoint=False`).
        endpoint: include `stop`.
        dtype: result dtype.
    """
    if isinstance(axis, str):
        axis = Axis(axis, 50)
    return NamedArray(jnp.linspace(start, stop, axis.size, endpoint=endpoint, dtype=dtype), (axis,))


def _wrap_unary(fn: Callable, name: str | None = None) -> Callable:
    name = name or fn.__name__

    def wrapped(a, *args, **kwargs):
        if isinstance(a, NamedArray):
            return NamedArray(fn(a.array, *args, **kwargs), a.axes)
        return fn(a, *args, **kwargs)

    wrapped.__name__ = name
    wrapped.__qualname__ = name
    wrapped.__doc__ = f"Named version of `jnp.{name}` (elementwise; axes are kept)."
    return wrapped


def _wrap_binary(fn: Callable) -> Callable:
    def wrapped(a, b, *args, **kwargs):
        if _scalar_with_unnamed_array(a, b):
            return fn(_unwrap_scalar(a), _unwrap_scalar(b), *args, **kwargs)
        if isinstance(a, NamedArray) or isinstance(b, NamedArray):
            axes, (ra, rb) = _raw_operands(a, b, context=fn.__name__)
            return NamedArray(fn(ra, rb, *args, **kwargs), axes)
        return fn(a, b, *args, **kwargs)

    wrapped.__name__ = fn.__name__
    wrapped.__qualname__ = fn.__name__
    wrapped.__doc__ = (
        f"Named version of `jnp.{fn.__name__}`: operands are aligned by axis name and broadcast."
    )
    return wrapped


# Elementwise ops, one line each so a reader finds every public name here.
abs = _wrap_unary(jnp.abs)
absolute = _wrap_unary(jnp.absolute)
negative = _wrap_unary(jnp.negative)
positive = _wrap_unary(jnp.positive)
sign = _wrap_unary(jnp.sign)
floor = _wrap_unary(jnp.floor)
ceil = _wrap_unary(jnp.ceil)
round = _wrap_unary(jnp.round)
trunc = _wrap_unary(jnp.trunc)
rint = _wrap_unary(jnp.rint)
exp = _wrap_unary(jnp.exp)
exp2 = _wrap_unary(jnp.exp2)
expm1 = _wrap_unary(jnp.expm1)
log = _wrap_unary(jnp.log)
log2 = _wrap_unary(jnp.log2)
log10 = _wrap_unary(jnp.log10)
log1p = _wrap_unary(jnp.log1p)
sqrt = _wrap_unary(jnp.sqrt)
cbrt = _wrap_unary(jnp.cbrt)
square = _wrap_unary(jnp.square)
reciprocal = _wrap_unary(jnp.reciprocal)
sin = _wrap_unary(jnp.sin)
cos = _wrap_unary(jnp.cos)
tan = _wrap_unary(jnp.tan)
arcsin = _wrap_unary(jnp.arcsin)
arccos = _wrap_unary(jnp.arccos)
arctan = _wrap_unary(jnp.arctan)
sinh = _wrap_unary(jnp.sinh)
cosh = _wrap_unary(jnp.cosh)
tanh = _wrap_unary(jnp.tanh)
arcsinh = _wrap_unary(jnp.arcsinh)
arccosh = _wrap_unary(jnp.arccosh)
arctanh = _wrap_unary(jnp.arctanh)
isnan = _wrap_unary(jnp.isnan)
isinf = _wrap_unary(jnp.isinf)
isfinite = _wrap_unary(jnp.isfinite)
isneginf = _wrap_unary(jnp.isneginf)
isposinf = _wrap_unary(jnp.isposinf)
iscomplex = _wrap_unary(jnp.iscomplex)
isreal = _wrap_unary(jnp.isreal)
logical_not = _wrap_unary(jnp.logical_not)
conj = _wrap_unary(jnp.conj)
conjugate = _wrap_unary(jnp.conjugate)
real = _wrap_unary(jnp.real)
imag = _wrap_unary(jnp.imag)
angle = _wrap_unary(jnp.angle)
deg2rad = _wrap_unary(jnp.deg2rad)
rad2deg = _wrap_unary(jnp.rad2deg)
degrees = _wrap_unary(jnp.degrees)
radians = _wrap_unary(jnp.radians)
signbit = _wrap_unary(jnp.signbit)
around = _wrap_unary(jnp.around)
fabs = _wrap_unary(jnp.fabs)
i0 = _wrap_unary(jnp.i0)
sinc = _wrap_unary(jnp.sinc)
copy = _wrap_unary(jnp.copy)
rsqrt = _wrap_unary(jax.lax.rsqrt)
fix = _wrap_unary(jnp.trunc, "fix")  # jnp.fix is deprecated for trunc; same values
add = _wrap_binary(jnp.add)
subtract = _wrap_binary(jnp.subtract)
multiply = _wrap_binary(jnp.multiply)
divide = _wrap_binary(jnp.divide)
true_divide = _wrap_binary(jnp.true_divide)
floor_divide = _wrap_binary(jnp.floor_divide)
power = _wrap_binary(jnp.power)
float_power = _wrap_binary(jnp.float_power)
mod = _wrap_binary(jnp.mod)
remainder = _wrap_binary(jnp.remainder)
fmod = _wrap_binary(jnp.fmod)
maximum = _wrap_binary(jnp.maximum)
minimum = _wrap_binary(jnp.minimum)
fmax = _wrap_binary(jnp.fmax)
fmin = _wrap_binary(jnp.fmin)
arctan2 = _wrap_binary(jnp.arctan2)
hypot = _wrap_binary(jnp.hypot)
logaddexp = _wrap_binary(jnp.logaddexp)
logaddexp2 = _wrap_binary(jnp.logaddexp2)
equal = _wrap_binary(jnp.equal)
not_equal = _wrap_binary(jnp.not_equal)
less = _wrap_binary(jnp.less)
less_equal = _wrap_binary(jnp.less_equal)
greater = _wrap_binary(jnp.greater)
greater_equal = _wrap_binary(jnp.greater_equal)
logical_and = _wrap_binary(jnp.logical_and)
logical_or = _wrap_binary(jnp.logical_or)
logical_xor = _wrap_binary(jnp.logical_xor)
copysign = _wrap_binary(jnp.copysign)
nextafter = _wrap_binary(jnp.nextafter)


def where(
    condition: Any,
    x: Any = None,
    y: Any = None,
    *,
    fill_value: int | None = None,
    new_axis: Axis | None = None,
) -> Any:
    """`jnp.where(condition, x, y)` with all three aligned by name (Haliax's rule: one operand
    has every other's axes).

    Args:
        condition: bool NamedArray (or scalar).
        x: value where `condition` is true.
        y: value where it is false.
        fill_value: one-argument form (no `x`, `y`): index for the unused slots.
        new_axis: one-argument form: the axis of the indices (its size is the number of
            indices, as `jnp.where(condition, size=...)`); one array per axis of `condition`.

    >>> A = Axis("a", 3)
    >>> where(arange(A) > 0, 1.0, 0.0).array
    Array([0., 1., 1.], dtype=float32, weak_type=True)
    """
    if (x is None) != (y is None):
        raise TypeError("hax.where: give both x and y, or neither (with fill_value= and new_axis=)")
    if x is None:
        if not isinstance(condition, NamedArray) or fill_value is None or new_axis is None:
            raise TypeError(
                "hax.where(condition) needs a NamedArray condition, fill_value= and new_axis= "
                "(the number of indices must be static), e.g. "
                "hax.where(mask, fill_value=-1, new_axis=hax.Axis('n', 16))"
            )
        idx = jnp.where(condition.array, size=new_axis.size, fill_value=fill_value)
        return tuple(NamedArray(i, (new_axis,)) for i in idx)
    if not any(isinstance(a, NamedArray) for a in (condition, x, y)):
        return jnp.where(condition, x, y)
    axes, (rc, rx, ry) = _raw_operands(condition, x, y, context="where")
    return NamedArray(jnp.where(rc, rx, ry), axes)


def clip(a: NamedArray, a_min: Any = None, a_max: Any = None) -> NamedArray:
    """Clips `a` to `[a_min, a_max]` (bounds may be NamedArrays, aligned by name)."""
    axes, (ra, lo, hi) = _raw_operands(a, a_min, a_max, context="clip")
    return NamedArray(jnp.clip(ra, lo, hi), axes)


def nan_to_num(a: NamedArray, nan=0.0, posinf=None, neginf=None) -> NamedArray:
    """

    Args:
        a: the array.
        nan: replacement for NaN.
        posinf: replacement for +inf (default: the dtype's max).
        neginf: replacement for -inf (default: the dtype's min).
    """
    return NamedArray(jnp.nan_to_num(a.array, nan=nan, posinf=posinf, neginf=neginf), a.axes)


def isclose(a: NamedArray, b: NamedArray, rtol=1e-5, atol=1e-8, equal_nan=False) -> NamedArray:
    """`jnp.isclose` after aligning by name.

    Args:
        a: first array.
        b: second array (aligned by name).
        rtol: relative tolerance.
        atol: absolute tolerance.
        equal_nan: count NaNs in the same place as equal.
    """
    axes, (ra, rb) = _raw_operands(a, b, context="isclose")
    return NamedArray(jnp.isclose(ra, rb, rtol=rtol, atol=atol, equal_nan=equal_nan), axes)


def allclose(a: NamedArray, b: NamedArray, rtol=1e-5, atol=1e-8, equal_nan=False) -> bool:
    """Like `jnp.allclose`, after aligning by name; different axis sets are never close.

    Args:
        a: first array.
        b: second array (aligned by name).
        rtol: relative tolerance.
        atol: absolute tolerance.
        equal_nan: count NaNs in the same place as equal.
    """
    if {x.name for x in a.axes} != {x.name for x in b.axes}:
        return False
    axes, (ra, rb) = _raw_operands(a, b)
    return bool(jnp.allclose(ra, rb, rtol=rtol, atol=atol, equal_nan=equal_nan))


def array_equal(a: NamedArray, b: NamedArray) -> bool:
    """Same axis names (any order), same sizes and equal values."""
    if {x.name for x in a.axes} != {x.name for x in b.axes}:
        return False
    axes, (ra, rb) = _raw_operands(a, b)
    return bool(jnp.array_equal(ra, rb))


def array_equiv(a: NamedArray, b: NamedArray) -> bool:
    """Whether one of `a`, `b` has all the other's axes and they are equal after broadcasting.

    >>> A, B = Axis("a", 3), Axis("b", 5)
    >>> array_equiv(ones((A, B)), ones(B)), array_equiv(ones(A), ones(A.resize(4)))
    (True, False)
    """
    na, nb = {x.name for x in a.axes}, {x.name for x in b.axes}
    if not (na <= nb or nb <= na):  # Haliax broadcasts only when one's axes contain the other's
        return False
    try:
        axes, (ra, rb) = _raw_operands(a, b)
    except AxisError:
        return False
    return bool(jnp.all(ra == rb))


def divmod(x1: Any, x2: Any) -> tuple[NamedArray, NamedArray]:
    """`(x1 // x2, x1 % x2)`, aligned by name."""
    axes, (r1, r2) = _raw_operands(x1, x2, context="divmod")
    q, r = jnp.divmod(r1, r2)
    return NamedArray(q, axes), NamedArray(r, axes)


def frexp(a: NamedArray) -> tuple[NamedArray, NamedArray]:
    """Mantissa and exponent (`a == m * 2**e`), each with `a`'s axes."""
    m, e = jnp.frexp(a.array)
    return NamedArray(m, a.axes), NamedArray(e, a.axes)


def ndim(a: NamedArray) -> int:
    """The number of axes."""
    return a.ndim


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
    """Largest `k` values along `axis` and their indices; the axis becomes `new_axis` (size k).

    Args:
        array: the array.
        axis: the axis to select along.
        k: how many values.
        new_axis: name (or Axis) of the result axis (default: the old name, size k).
    """
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
    def wrapped(array: NamedArray, axis: AxisSelector | None, *args, **kwargs) -> Any:
        if axis is None:  # as in Haliax: over the flattened array, an unnamed result
            return fn(array.array, *args, axis=None, **kwargs)
        i = array.axis_index(axis)
        return NamedArray(fn(array.array, *args, axis=i, **kwargs), array.axes)

    wrapped.__name__ = fn.__name__
    wrapped.__qualname__ = fn.__name__
    wrapped.__doc__ = (
        f"`jnp.{fn.__name__}` along a named axis (`axis=None`: the flattened array, unnamed); "
        "keyword arguments such as `dtype=` go to JAX."
    )
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
    def wrapped(array: NamedArray, axis1: Any, axis2: Any = None, k: int = 0) -> NamedArray:
        if isinstance(axis1, tuple | list):  # the older (row, col) pair form: tril(x, (r, c), k)
            if axis2 is not None:
                k = axis2
            axis1, axis2 = axis1
        if axis2 is None:
            raise TypeError(
                f"{fn.__name__} needs two axes: {fn.__name__}(x, RowAxis, ColAxis, k=0)"
            )
        # Haliax returns the (row, col) axes last, in the order the mask was built
        moved = array.rearrange((..., axis1, axis2))
        return NamedArray(fn(moved.array, k=k), moved.axes)

    wrapped.__name__ = fn.__name__
    wrapped.__qualname__ = fn.__name__
    keep = "below" if fn.__name__ == "tril" else "above"
    wrapped.__doc__ = (
        f"`jnp.{fn.__name__}` over the (row, column) axes `axis1`, `axis2`, offset by `k`; the\n"
        "    result has the other axes first, then `axis1`, `axis2` (as in Haliax).\n\n"
        "    Args:\n"
        "        array: the array; its other axes are batch axes.\n"
        "        axis1: the row axis (or, in the older form, a `(row, col)` pair).\n"
        "        axis2: the column axis (in the older pair form: `k`).\n"
        f"        k: the diagonal offset; elements {keep} diagonal `k` are kept.\n"
    )
    return wrapped


tril = _tri(jnp.tril)
triu = _tri(jnp.triu)
nancumsum = _along(jnp.nancumsum)
nancumprod = _along(jnp.nancumprod)


def pad(
    array: NamedArray,
    pad_width: Mapping[AxisSelector, tuple[int, int]],
    *,
    mode: str = "constant",
    constant_values: Any = 0,
    **kwargs: Any,
) -> NamedArray:
    """`jnp.pad` by axis: `pad_width` maps an axis (or name) to `(before, after)`.

    Padded axes keep their names and grow; axes not in `pad_width` are left alone.

    Args:
        array: the array.
        pad_width: `{axis: (before, after)}`.
        mode: as `jnp.pad` (`"constant"`, `"reflect"`, `"edge"`, ...).
        constant_values: fill value for `"constant"`.
        **kwargs: passed to `jnp.pad`.

    >>> pad(ones(Axis("pos", 3)), {"pos": (1, 2)}).array
    Array([0., 1., 1., 1., 0., 0.], dtype=float32)
    """
    widths = {axis_name(k): v for k, v in pad_width.items()}
    for name in widths:
        array.axis_index(name)
    padding = [tuple(widths.get(a.name, (0, 0))) for a in array.axes]
    new_axes = tuple(a.resize(a.size + lo + hi) for a, (lo, hi) in zip(array.axes, padding))
    if isinstance(constant_values, NamedArray):
        constant_values = constant_values.scalar()
    if mode == "constant":
        kwargs["constant_values"] = constant_values
    return NamedArray(jnp.pad(array.array, padding, mode=mode, **kwargs), new_axes)


def pad_left(array: NamedArray, axis: Axis, new_axis: Axis, value: Any = 0) -> NamedArray:
    """Pads `axis` at the front with `value` up to `new_axis.size`; the axis becomes `new_axis`.

    Args:
        array: the array.
        axis: the axis to pad.
        new_axis: the padded axis (its size is the new length).
        value: fill value.
    """
    i = array.axis_index(axis)
    extra = new_axis.size - array.axes[i].size
    if extra < 0:
        raise AxisError(
            f"pad_left: cannot pad axis {array.axes[i].name!r} of size {array.axes[i].size} down "
            f"to {new_axis.size}; use x[{{{array.axes[i].name!r}: slice(...)}}] to shorten it"
        )
    padding = [(0, 0)] * array.ndim
    padding[i] = (extra, 0)
    out = jnp.pad(array.array, padding, constant_values=value)
    return NamedArray(out, array.axes[:i] + (new_axis,) + array.axes[i + 1 :])


def ravel(array: NamedArray, new_axis_name: AxisSelector) -> NamedArray:
    """All axes merged (in their current order, row-major) into one axis `new_axis_name`."""
    if not array.axes:
        new = new_axis_name if isinstance(new_axis_name, Axis) else Axis(new_axis_name, 1)
        return NamedArray(jnp.reshape(array.array, (1,)), (new,))
    return flatten_axes(array, array.axes, new_axis_name)


flatten = ravel
"""Haliax's second name for `ravel`."""
