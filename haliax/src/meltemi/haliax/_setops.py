"""Data-dependent ops with a static result axis: unique, bincount, searchsorted, nonzero.

Under `jit` an output size must be known when tracing, so each takes the result Axis (`Unique`,
`Counts`, `size`); results are padded with `fill_value` (or cut) to its size.

>>> import jax.numpy as jnp
>>> import meltemi.haliax as hax
>>> x = hax.named(jnp.array([3, 1, 3, 2, 1]), "pos")
>>> hax.unique(x, hax.Axis("u", 3)).array
Array([1, 2, 3], dtype=int32)
>>> hax.bincount(x, hax.Axis("bin", 4)).array
Array([0, 2, 1, 2], dtype=int32)
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from meltemi.haliax._core import (
    Axis,
    AxisError,
    AxisSelector,
    NamedArray,
    broadcast_to,
)

__all__ = [
    "unique",
    "unique_values",
    "unique_counts",
    "unique_inverse",
    "unique_all",
    "bincount",
    "searchsorted",
    "nonzero",
]


def unique(
    array: NamedArray,
    Unique: Axis,
    *,
    return_index: bool = False,
    return_inverse: bool = False,
    return_counts: bool = False,
    axis: AxisSelector | None = None,
    fill_value: Any = None,
) -> NamedArray | tuple[NamedArray, ...]:
    """Sorted unique values of `array` (flattened, or slices along `axis`), on the axis `Unique`.

    Args:
        array: the input.
        Unique: the result axis; its size is the number of values kept (padded with
            `fill_value`, default the smallest value, when there are fewer).
        return_index: also return the index of each unique value's first occurrence (`Unique`).
        return_inverse: also return, for each input position, the index of its unique value
            (with `array`'s axes, or just `axis` when given).
        return_counts: also return how often each unique value occurs (`Unique`).
        axis: find unique slices along this axis instead of unique elements; it is replaced
            by `Unique` in the values.
        fill_value: the padding value.

    Returns:
        The values, or a tuple `(values, [index], [inverse], [counts])`.
    """
    kwargs = dict(
        size=Unique.size,
        fill_value=fill_value,
        return_index=return_index,
        return_inverse=return_inverse,
        return_counts=return_counts,
    )
    if axis is None:
        out = jnp.unique(array.array, **kwargs)
        value_axes: tuple[Axis, ...] = (Unique,)
        inverse_axes = array.axes
    else:
        i = array.axis_index(axis)
        out = jnp.unique(array.array, axis=i, **kwargs)
        value_axes = array.axes[:i] + (Unique,) + array.axes[i + 1 :]
        inverse_axes = (array.axes[i],)
    if not (return_index or return_inverse or return_counts):
        return NamedArray(out, value_axes)
    out = list(out)
    result = [NamedArray(out.pop(0), value_axes)]
    if return_index:
        result.append(NamedArray(out.pop(0), (Unique,)))
    if return_inverse:
        inv = out.pop(0)
        result.append(
            NamedArray(jnp.reshape(inv, tuple(a.size for a in inverse_axes)), inverse_axes)
        )
    if return_counts:
        result.append(NamedArray(out.pop(0), (Unique,)))
    return tuple(result)


def unique_values(
    array: NamedArray,
    Unique: Axis,
    *,
    axis: AxisSelector | None = None,
    fill_value: Any = None,
) -> NamedArray:
    """`unique` returning only the values.

    Args:
        array: the input.
        Unique: the result axis (its size is how many values are kept).
        axis: unique slices along this axis instead of elements.
        fill_value: padding value.
    """
    return unique(array, Unique, axis=axis, fill_value=fill_value)  # type: ignore[return-value]


def unique_counts(
    array: NamedArray,
    Unique: Axis,
    *,
    axis: AxisSelector | None = None,
    fill_value: Any = None,
) -> tuple[NamedArray, NamedArray]:
    """`(values, counts)`.

    Args:
        array: the input.
        Unique: the result axis.
        axis: unique slices along this axis instead of elements.
        fill_value: padding value.
    """
    return unique(array, Unique, return_counts=True, axis=axis, fill_value=fill_value)  # type: ignore[return-value]


def unique_inverse(
    array: NamedArray,
    Unique: Axis,
    *,
    axis: AxisSelector | None = None,
    fill_value: Any = None,
) -> tuple[NamedArray, NamedArray]:
    """`(values, inverse)`: `values[inverse]` rebuilds `array`.

    Args:
        array: the input.
        Unique: the result axis.
        axis: unique slices along this axis instead of elements.
        fill_value: padding value.
    """
    return unique(array, Unique, return_inverse=True, axis=axis, fill_value=fill_value)  # type: ignore[return-value]


def unique_all(
    array: NamedArray,
    Unique: Axis,
    *,
    axis: AxisSelector | None = None,
    fill_value: Any = None,
) -> tuple[NamedArray, NamedArray, NamedArray, NamedArray]:
    """`(values, first indices, inverse, counts)`.

    Args:
        array: the input.
        Unique: the result axis.
        axis: unique slices along this axis instead of elements.
        fill_value: padding value.
    """
    return unique(  # type: ignore[return-value]
        array,
        Unique,
        return_index=True,
        return_inverse=True,
        return_counts=True,
        axis=axis,
        fill_value=fill_value,
    )


def bincount(
    x: NamedArray,
    Counts: Axis,
    *,
    weights: Any = None,
    minlength: int = 0,
) -> NamedArray:
    """How often each value `0 .. Counts.size - 1` occurs in the 1-d `x` (summing `weights`).

    Args:
        x: 1-d non-negative integers.
        Counts: the result axis; values >= its size are dropped.
        weights: per-element weights (aligned by name).
        minlength: as `jnp.bincount` (the length is `Counts.size`).
    """
    if x.ndim != 1:
        raise AxisError(
            f"bincount needs a 1-d array, got axes {x.axes}; flatten it first (hax.ravel)"
        )
    w = None
    if isinstance(weights, NamedArray):
        w = broadcast_to(weights, x.axes).array
    elif weights is not None:
        w = jnp.asarray(weights)
    out = jnp.bincount(x.array, weights=w, minlength=minlength, length=Counts.size)
    return NamedArray(out, (Counts,))


def searchsorted(
    a: NamedArray,
    v: Any,
    *,
    side: str = "left",
    sorter: Any = None,
    method: str = "scan",
) -> NamedArray:
    """Indices where `v` would be inserted into the sorted 1-d `a`; the result has `v`'s axes.

    Args:
        a: 1-d sorted array.
        v: values to insert (a NamedArray or a scalar).
        side: `"left"` or `"right"`.
        sorter: indices that sort `a`, if it is not sorted.
        method: as `jnp.searchsorted`.
    """
    if a.ndim != 1:
        raise AxisError(f"searchsorted needs a 1-d sorted array, got axes {a.axes}")
    if not isinstance(v, NamedArray):
        v = NamedArray(jnp.asarray(v), ())
        if v.array.ndim != 0:
            raise TypeError("searchsorted: name the axes of a non-scalar `v` with hax.named")
    s = sorter.array if isinstance(sorter, NamedArray) else sorter
    out = jnp.searchsorted(a.array, v.array, side=side, sorter=s, method=method)
    return NamedArray(out, v.axes)


def nonzero(array: NamedArray, *, size: Axis, fill_value: int = 0) -> tuple[NamedArray, ...]:
    """Indices of the nonzero elements, one array (axis `size`) per axis of `array`."""
    if not isinstance(array, NamedArray):
        raise TypeError(f"nonzero needs a NamedArray, got {type(array).__name__}")
    idx = jnp.nonzero(array.array, size=size.size, fill_value=fill_value)
    return tuple(NamedArray(i, (size,)) for i in idx)
