"""Indexing by name: `x[{"pos": 3, "embed": slice(0, 4)}]`, gathers, `.at[...]`, dynamic slices.

>>> import meltemi.haliax as hax
>>> Pos, Embed = hax.Axis("pos", 5), hax.Axis("embed", 3)
>>> x = hax.arange(Pos) * hax.ones(Embed)
>>> x[{"pos": 2}].axes
(Axis(name='embed', size=3),)
>>> x[{"pos": hax.ds(1, 2)}].shape
{'pos': 2, 'embed': 3}
>>> x.at[{"pos": 0}].set(7.0)[{"pos": 0, "embed": 1}].item()
7.0
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from meltemi.haliax._core import (
    Axis,
    AxisError,
    AxisSelector,
    NamedArray,
    _broadcast_axes,
    _fmt_axes,
    axis_name,
    broadcast_to,
)

__all__ = [
    "dslice",
    "ds",
    "dblock",
    "index",
    "take",
    "slice",
    "updated_slice",
    "NamedIndexUpdateRef",
]


@dataclasses.dataclass(frozen=True)
class dslice:
    """A slice of static `size` starting at a (possibly traced) `start`."""

    start: Any
    size: int

    def __post_init__(self):
        if isinstance(self.size, Axis):  # Haliax allows dslice(start, Axis): its size
            object.__setattr__(self, "size", self.size.size)

    def to_slice(self):
        return builtins.slice(self.start, self.start + self.size)

    @staticmethod
    def block(idx: Any, size: int) -> dslice:
        """The `idx`-th block of `size` elements: `dslice(idx * size, size)`."""
        return dslice(idx * size, size)


ds = dslice


def dblock(idx: Any, size: int) -> dslice:
    """The `idx`-th block of `size` elements: `dslice(idx * size, size)`."""
    return dslice(idx * size, size)


def _normalize(array: NamedArray, idx: Any) -> dict[str, Any]:
    if isinstance(idx, Mapping):
        items = list(idx.items())
    elif (
        isinstance(idx, tuple)
        and len(idx) % 2 == 0
        and all(isinstance(k, str | Axis) for k in idx[::2])
    ):
        items = list(zip(idx[::2], idx[1::2]))
    else:
        raise TypeError(
            f"index a NamedArray by name: x[{{'axis': i}}] or x['axis', i], got {idx!r} "
            f"(axes are {_fmt_axes(array.axes)})"
        )
    out: dict[str, Any] = {}
    for k, v in items:
        name = axis_name(k)
        array.axis_index(name)  # raises with the axes present
        if name in out:
            raise AxisError(f"axis {name!r} indexed twice")
        out[name] = v  # type: ignore[index]
    return out


def _plan(array: NamedArray, idx: Mapping[str, Any]):
    """Returns (jnp index tuple, result axes, dynamic slices) for a named index."""
    adv_positions, adv_arrays = [], []
    jidx: list[Any] = []
    dyn: dict[int, dslice] = {}
    for i, ax in enumerate(array.axes):
        v = idx.get(ax.name, builtins.slice(None))
        if isinstance(v, NamedArray):
            adv_positions.append(i)
            adv_arrays.append(v)
            jidx.append(None)  # filled below
        elif isinstance(v, dslice):
            dyn[i] = v
            jidx.append(builtins.slice(None))
        elif isinstance(v, builtins.slice):
            jidx.append(v)
        elif isinstance(v, int | np.integer) or (hasattr(v, "shape") and np.ndim(v) == 0):
            jidx.append(v)
        else:
            raise TypeError(
                f"index for axis {ax.name!r} must be an int, a slice, hax.ds(start, size) or a "
                f"NamedArray of indices, got {type(v).__name__} (an unnamed array would be "
                f"matched by position; wrap it with hax.named)"
            )
    adv_axes = _broadcast_axes(*adv_arrays)
    for a in adv_axes:
        if any(a.name == b.name for j, b in enumerate(array.axes) if j not in adv_positions):
            if a.name not in idx or not isinstance(idx[a.name], NamedArray):
                raise AxisError(
                    f"gather: index axis {a.name!r} clashes with an axis of the array; "
                    f"rename the index axis"
                )
    for pos, arr in zip(adv_positions, adv_arrays):
        jidx[pos] = broadcast_to(arr, adv_axes).array if adv_axes else arr.array
    # result axes, following numpy's placement of advanced-index dims
    out_axes: list[Axis] = []
    contiguous = (
        adv_positions == list(range(adv_positions[0], adv_positions[-1] + 1))
        if adv_positions
        else True
    )
    placed = False
    for i, ax in enumerate(array.axes):
        v = jidx[i]
        if i in adv_positions:
            if contiguous and not placed:
                out_axes.extend(adv_axes)
                placed = True
            continue
        if isinstance(v, builtins.slice):
            if i in dyn:
                out_axes.append(ax.resize(dyn[i].size))
            else:
                out_axes.append(ax.resize(len(range(*v.indices(ax.size)))))
    if adv_positions and not contiguous:
        out_axes = list(adv_axes) + out_axes
    return tuple(jidx), tuple(out_axes), dyn


def index(array: NamedArray, idx: Any) -> NamedArray:
    """`array[idx]` by name (also available as `x[...]`)."""
    idx = _normalize(array, idx)
    jidx, out_axes, dyn = _plan(array, idx)
    arr = array.array
    for i, d in dyn.items():
        arr = jax.lax.dynamic_slice_in_dim(arr, d.start, d.size, axis=i)
    if any(not (isinstance(j, builtins.slice) and j == builtins.slice(None)) for j in jidx):
        arr = arr[jidx]
    return NamedArray(arr, out_axes)


def take(array: NamedArray, axis: AxisSelector, index: Any) -> NamedArray:
    """Selects along one axis: an int removes it, a NamedArray of indices replaces it."""
    return globals()["index"](array, {axis_name(axis): index})


def slice(
    array: NamedArray,
    axis: AxisSelector | Mapping[AxisSelector, Any],
    new_axis: AxisSelector | None = None,
    start: Any = 0,
    length: int | Mapping[AxisSelector, int] | None = None,
) -> NamedArray:
    """A (possibly dynamic-start) slice of static length.

    Either `slice(x, "pos", start=2, length=3)` or `slice(x, {"pos": 2}, length={"pos": 3})`.
    `new_axis` renames the sliced axis.

    Args:
        array: the array.
        axis: the axis to slice, or a mapping `{axis: start}`.
        new_axis: name (or Axis) of the sliced axis (default: the old name).
        start: the start, possibly traced.
        length: static length (a mapping with the mapping form).
    """
    if isinstance(axis, Mapping):
        if not isinstance(length, Mapping):
            raise TypeError("slice: with a mapping of starts, `length` must be a mapping too")
        out = array
        for ax, st in axis.items():
            out = slice(out, ax, start=st, length=length[ax])
        return out
    i = array.axis_index(axis)
    old = array.axes[i]
    if length is None:
        if isinstance(new_axis, Axis):
            length = new_axis.size
        else:
            raise TypeError("slice: give `length` or a `new_axis` with a size")
    arr = jax.lax.dynamic_slice_in_dim(array.array, start, length, axis=i)  # type: ignore[arg-type]
    if new_axis is None:
        new = old.resize(length)  # type: ignore[arg-type]
    elif isinstance(new_axis, Axis):
        new = new_axis
    else:
        new = Axis(new_axis, length)  # type: ignore[arg-type]
    return NamedArray(arr, array.axes[:i] + (new,) + array.axes[i + 1 :])


def updated_slice(array: NamedArray, start: Mapping[AxisSelector, Any], update: NamedArray):
    """`lax.dynamic_update_slice` by name: writes `update` at `start`.

    Axes missing from `start` start at 0; axes missing from `update` are broadcast over.
    """
    starts = {axis_name(k): v for k, v in start.items()}
    for k in starts:
        array.axis_index(k)
    for ax in update.axes:
        full = array.resolve_axis(ax.name)
        if ax.size > full.size:
            raise AxisError(
                f"updated_slice: update axis {ax.name!r} has size {ax.size} > array's {full.size}"
            )
    upd = update.rearrange([a.name for a in array.axes if update.has_axis(a.name)])
    shape = tuple(upd.shape.get(a.name, 1) for a in array.axes)
    full = tuple(upd.shape.get(a.name, a.size) for a in array.axes)  # missing axes: whole extent
    raw = jnp.broadcast_to(jnp.reshape(upd.array, shape), full).astype(array.dtype)
    idx = tuple(starts.get(a.name, 0) for a in array.axes)
    return NamedArray(jax.lax.dynamic_update_slice(array.array, raw, idx), array.axes)


class NamedIndexUpdateRef:
    """What `x.at[{...}]` returns: `.set`, `.add`, `.multiply`, `.min`, `.max`, `.get`."""

    def __init__(self, array: NamedArray, idx: Any):
        self._array = array
        self._idx = _normalize(array, idx)

    def _apply(self, op: str, value: Any, **kwargs) -> NamedArray:
        idx = dict(self._idx)
        for k, v in list(idx.items()):
            if isinstance(v, dslice):  # dynamic starts become a gather/scatter index
                idx[k] = NamedArray(v.start + jnp.arange(v.size), (Axis(k, v.size),))
        jidx, out_axes, _ = _plan(self._array, idx)
        if isinstance(value, NamedArray):
            raw = broadcast_to(value, out_axes).array
        else:
            raw = value
        ref = self._array.array.at[jidx]
        return NamedArray(getattr(ref, op)(raw, **kwargs), self._array.axes)

    def set(self, value, **kwargs):
        return self._apply("set", value, **kwargs)

    def add(self, value, **kwargs):
        return self._apply("add", value, **kwargs)

    def multiply(self, value, **kwargs):
        return self._apply("multiply", value, **kwargs)

    def min(self, value, **kwargs):
        return self._apply("min", value, **kwargs)

    def max(self, value, **kwargs):
        return self._apply("max", value, **kwargs)

    def get(self, **kwargs):
        return index(self._array, self._idx)


class _AtHelper:
    def __init__(self, array: NamedArray):
        self._array = array

    def __getitem__(self, idx) -> NamedIndexUpdateRef:
        return NamedIndexUpdateRef(self._array, idx)
