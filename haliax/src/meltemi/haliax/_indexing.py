"""Indexing by name: `x[{"pos": 3, "embed": slice(0, 4)}]`, gathers, `.at[...]`, dynamic slices.

>>> import meltemi.haliax as hax
>>> Pos, Embed = hax.Axis("pos", 5), hax.Axis("embed", 3)
>>> x = hax.broadcast_to(hax.arange(Pos), (Pos, Embed)) * hax.ones(Embed)
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
import math
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
    _fmt_axes,
    axis_name,
    broadcast_to,
)
from meltemi.haliax._hof import vmap

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
    if isinstance(idx, tuple) and len(idx) == 1:
        idx = idx[0]
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


def _is_int_scalar(v: Any) -> bool:
    if isinstance(v, int | np.integer) and not isinstance(v, bool):
        return True
    shape, dtype = getattr(v, "shape", None), getattr(v, "dtype", None)
    return shape == () and dtype is not None and jnp.issubdtype(dtype, jnp.integer)


def _index_broadcast_axes(arrays: list[NamedArray]) -> tuple[Axis, ...]:
    """Haliax's order of broadcast index arrays: the biggest one's axes, the others' new axes
    in front."""
    order = sorted(arrays, key=lambda a: a.size, reverse=True)
    out: tuple[Axis, ...] = order[0].axes
    for arr in order[1:]:
        b = arr.axes
        for ax in b:
            for o in out:
                if o.name == ax.name and o.size != ax.size:
                    raise AxisError(
                        f"index arrays disagree on axis {ax.name!r}: sizes {o.size} and {ax.size}"
                    )
        if b == out or not b:
            continue
        big, small = (out, b) if math.prod(a.size for a in out) >= arr.size else (b, out)
        out = tuple(x for x in small if x not in big) + big
    return out


def _arange(ax: Axis, start: Any) -> NamedArray:
    return NamedArray(jnp.arange(ax.size) + start, (ax,))


def _plan(array: NamedArray, idx: Mapping[str, Any]):
    """Returns (jnp index list, result axes, whether a dslice is involved) for a named index.

    Follows Haliax: a `dslice` gathers `start + arange(size)`; an index array whose axes share a
    name with a kept axis of `array` is batched over that axis (like `take_along_axis`); advanced
    index dims go where numpy puts them (in place when contiguous, else in front).
    """
    n = len(array.axes)
    jidx: list[Any] = [builtins.slice(None)] * n
    kept = [True] * n
    adv: list[int] = []
    index_names: set[str] = set()
    has_dslice = False
    for name, v in idx.items():
        i = array.axis_index(name)
        ax = array.axes[i]
        if isinstance(v, builtins.slice):
            jidx[i] = v
        elif isinstance(v, dslice):
            has_dslice = True
            jidx[i] = _arange(ax.resize(v.size), v.start)
            kept[i] = False
            adv.append(i)
            index_names.add(ax.name)
        elif _is_int_scalar(v):
            if isinstance(v, np.integer) or type(v) is np.ndarray:
                v = int(v.item())
            jidx[i] = v
            kept[i] = False
        elif isinstance(v, NamedArray):
            jidx[i] = v
            kept[i] = False
            adv.append(i)
            index_names.update(a.name for a in v.axes)
        elif isinstance(v, list):
            jidx[i] = v  # numpy-style list index: jax validates it
        elif hasattr(v, "shape") and hasattr(v, "dtype"):
            if np.ndim(v) == 0:
                jidx[i] = v
                kept[i] = False
            elif np.ndim(v) == 1:
                # Haliax's sugar: a 1-d unnamed index takes the name of the first other kept axis of
                # the same length (so it is batched over it), else the indexed axis's own name.
                target = next(
                    (
                        b
                        for j, b in enumerate(array.axes)
                        if j != i and kept[j] and b.size == v.shape[0]
                    ),
                    ax,
                )
                jidx[i] = NamedArray(jnp.asarray(v), (target.resize(v.shape[0]),))
                kept[i] = False
                adv.append(i)
                index_names.add(target.name)
            else:
                raise TypeError(
                    f"index for axis {ax.name!r}: an unnamed index array must be 0-d or 1-d, got "
                    f"shape {tuple(v.shape)}; name its axes with hax.named"
                )
        else:
            raise TypeError(
                f"index for axis {ax.name!r} must be an int, a slice, hax.ds(start, size) or a "
                f"NamedArray of indices, got {type(v).__name__}"
            )
    # index axes that name a kept axis of the array: batch over it with an arange
    for i, ax in enumerate(array.axes):
        if kept[i] and ax.name in index_names:
            jidx[i] = _arange(ax, 0)
            kept[i] = False
            adv.append(i)
    kept_axes = [
        ax.resize(len(range(*jidx[i].indices(ax.size))))
        if isinstance(jidx[i], builtins.slice)
        else ax
        for i, ax in enumerate(array.axes)
    ]
    if not adv:
        return jidx, tuple(a for i, a in enumerate(kept_axes) if kept[i]), has_dslice
    adv_axes = _index_broadcast_axes([jidx[i] for i in adv])
    for i in adv:
        jidx[i] = broadcast_to(jidx[i], adv_axes).array
    positions = [i for i in range(n) if not kept[i]]
    if positions == list(range(positions[0], positions[-1] + 1)):
        first, last = positions[0], positions[-1]
        out_axes = tuple(kept_axes[:first]) + adv_axes + tuple(kept_axes[last + 1 :])
    else:
        out_axes = adv_axes + tuple(a for i, a in enumerate(kept_axes) if kept[i])
    return jidx, out_axes, has_dslice


def index(array: NamedArray, idx: Any) -> NamedArray:
    """`array[idx]` by name (also available as `x[...]`).

    A `hax.ds(start, size)` reads past the end as 0 (and `.at[...]` drops writes there), as in
    Haliax; an index array batches over the array's axes it shares a name with.
    """
    idx = _normalize(array, idx)
    jidx, out_axes, has_dslice = _plan(array, idx)
    if has_dslice:
        arr = array.array.at[tuple(jidx)].get(mode="fill", fill_value=0)
    elif all(isinstance(j, builtins.slice) and j == builtins.slice(None) for j in jidx):
        arr = array.array
    else:
        arr = array.array[tuple(jidx)]
    return NamedArray(arr, out_axes)


def take(array: NamedArray, axis: AxisSelector, index: Any) -> NamedArray:
    """Selects along one axis: an int removes it, a NamedArray of indices replaces it.

    Index axes that `array` also has are batched over (`take_along_axis`); the result then has
    the index's other axes in front, followed by `array`'s axes without `axis` (Haliax's order).
    """
    i = array.axis_index(axis)
    ax = array.axes[i]
    if not isinstance(index, NamedArray):
        return globals()["index"](array, {ax.name: index})
    if not jnp.issubdtype(index.dtype, jnp.integer):
        raise TypeError(
            f"take: index for axis {ax.name!r} must hold integers, got dtype {index.dtype}"
        )
    remaining = array.axes[:i] + array.axes[i + 1 :]
    shared = [a for a in index.axes if any(a.name == r.name for r in remaining)]
    if not shared:
        jidx: list[Any] = [builtins.slice(None)] * array.ndim
        jidx[i] = index.array
        return NamedArray(
            array.array[tuple(jidx)], array.axes[:i] + index.axes + array.axes[i + 1 :]
        )
    dummy = index.has_axis(ax.name)
    if dummy:  # the index also carries the taken axis's name: keep it apart while gathering
        index = index.rename({ax.name: "__DUMMY_" + ax.name})
    new_front = tuple(a for a in index.axes if not array.has_axis(a.name))
    full = new_front + array.axes
    arr = broadcast_to(array, full)
    j = len(new_front) + i
    out_axes = full[:j] + full[j + 1 :]
    idx_raw = broadcast_to(index, out_axes).array
    out = jnp.take_along_axis(arr.array, jnp.expand_dims(idx_raw, j), axis=j).squeeze(j)
    result = NamedArray(out, out_axes)
    return result.rename({"__DUMMY_" + ax.name: ax.name}) if dummy else result


def slice(array: NamedArray, *args: Any, **kwargs: Any) -> NamedArray:
    """A (possibly dynamic-start) slice of static length, in one of Haliax's two forms.

    * `slice(x, "pos", new_axis=None, start=0, length=None)`: one axis; `new_axis` renames it
      (an `Axis` also gives the length).
    * `slice(x, {"pos": start}, {"pos": length})`: several axes; a length may be an `Axis`.
    """
    if (args and isinstance(args[0], Mapping)) or (not args and "axis" not in kwargs):
        return _slice_many(array, *args, **kwargs)
    return _slice_one(array, *args, **kwargs)


def _slice_one(
    array: NamedArray,
    axis: AxisSelector,
    new_axis: AxisSelector | None = None,
    start: Any = 0,
    length: int | None = None,
) -> NamedArray:
    i = array.axis_index(axis)
    old = array.axes[i]
    if length is None:
        if not isinstance(new_axis, Axis):
            raise TypeError("slice: give `length` or a `new_axis` with a size")
        length = new_axis.size
    arr = jax.lax.dynamic_slice_in_dim(array.array, start, length, axis=i)
    if new_axis is None:
        new = old.resize(length)
    elif isinstance(new_axis, Axis):
        new = new_axis
    else:
        new = Axis(new_axis, length)
    return NamedArray(arr, array.axes[:i] + (new,) + array.axes[i + 1 :])


def _slice_many(
    array: NamedArray,
    start: Mapping[AxisSelector, Any],
    length: Mapping[AxisSelector, int | Axis] | None = None,
) -> NamedArray:
    if not isinstance(length, Mapping):
        raise TypeError(
            "slice: with a mapping of starts, `length` must be a mapping too, e.g. "
            "slice(x, {'pos': 2}, {'pos': 3})"
        )
    starts: list[Any] = [0] * array.ndim
    sizes = [a.size for a in array.axes]
    new_axes = list(array.axes)
    lengths = {axis_name(k): v for k, v in length.items()}
    for ax, st in start.items():
        i = array.axis_index(ax)
        name = array.axes[i].name
        if name not in lengths:
            raise AxisError(f"slice: no length given for axis {name!r}; add it to `length`")
        ln = lengths[name]
        new = ln if isinstance(ln, Axis) else array.axes[i].resize(ln)
        if isinstance(st, int) and st + new.size > array.axes[i].size:
            raise AxisError(
                f"slice: {st}:{st + new.size} is out of bounds for axis {name!r} of size "
                f"{array.axes[i].size}"
            )
        starts[i], sizes[i], new_axes[i] = st, new.size, new
    return NamedArray(jax.lax.dynamic_slice(array.array, starts, sizes), tuple(new_axes))


def updated_slice(
    array: NamedArray, start: Mapping[AxisSelector, Any], update: NamedArray
) -> NamedArray:
    """`lax.dynamic_update_slice` by name: writes `update` at `start`.

    Axes missing from `start` start at 0; axes missing from a non-scalar `update` are broadcast
    over (a scalar `update` writes one element). A start
    given as a NamedArray (e.g. per-batch lengths) is vmapped over its axes (ragged writes).
    """
    map_axes: list[str] = []
    for s in start.values():
        if isinstance(s, NamedArray):
            map_axes += [a.name for a in s.axes if a.name not in map_axes]
    if map_axes:
        f = updated_slice
        for name in map_axes:
            if not array.has_axis(name):
                raise AxisError(
                    f"updated_slice: start indices have axis {name!r}, which the array "
                    f"({_fmt_axes(array.axes)}) lacks; starts may only vary along the array's axes"
                )
            f = vmap(f, axis=name)
        return f(array, start, update)
    starts = {}
    for k, v in start.items():
        name = array.axes[array.axis_index(k)].name
        if isinstance(v, NamedArray):
            v = v.scalar()
        starts[name] = v
    extra = [a for a in update.axes if not array.has_axis(a.name)]
    if extra:
        raise AxisError(
            f"updated_slice: update array with shape {update.shape} has axes "
            f"{[a.name for a in extra]} that are not in the original array with shape "
            f"{array.shape}; rename them to the array's axes"
        )
    for ax in update.axes:
        full = array.resolve_axis(ax.name)
        st = starts.get(ax.name, 0)
        if ax.size > full.size or (isinstance(st, int) and st + ax.size > full.size):
            raise AxisError(
                f"updated_slice: update axis {ax.name!r} of size {ax.size} does not fit at start "
                f"{st} in the array's size {full.size}"
            )
    upd = update.rearrange([a.name for a in array.axes if update.has_axis(a.name)])
    shape = tuple(upd.shape.get(a.name, 1) for a in array.axes)
    if update.ndim == 0:  # a scalar writes one element (Haliax), e.g. one token per vmapped row
        full = shape
    else:  # axes missing from a non-scalar update: the whole extent
        full = tuple(upd.shape.get(a.name, a.size) for a in array.axes)
    raw = jnp.broadcast_to(jnp.reshape(upd.array, shape), full).astype(array.dtype)
    idx = tuple(starts.get(a.name, 0) for a in array.axes)
    return NamedArray(jax.lax.dynamic_update_slice(array.array, raw, idx), array.axes)


class NamedIndexUpdateRef:
    """What `x.at[{...}]` returns: `.set`, `.add`, `.mul`/`.multiply`, `.divide`, `.power`, `.min`,
    `.max`, `.apply`, `.get`; keyword arguments (`mode=`, ...) go to JAX's `.at`."""

    def __init__(self, array: NamedArray, idx: Any):
        self._array = array
        self._idx = _normalize(array, idx)

    def _apply(self, op: str, value: Any, **kwargs) -> NamedArray:
        jidx, out_axes, _ = _plan(self._array, self._idx)
        if isinstance(value, NamedArray):
            raw = broadcast_to(value, out_axes).array
        else:
            raw = value
        ref = self._array.array.at[tuple(jidx)]
        return NamedArray(getattr(ref, op)(raw, **kwargs), self._array.axes)

    def set(self, value, **kwargs):
        return self._apply("set", value, **kwargs)

    def add(self, value, **kwargs):
        return self._apply("add", value, **kwargs)

    def multiply(self, value, **kwargs):
        return self._apply("multiply", value, **kwargs)

    mul = multiply

    def divide(self, value, **kwargs):
        return self._apply("divide", value, **kwargs)

    def power(self, value, **kwargs):
        return self._apply("power", value, **kwargs)

    def min(self, value, **kwargs):
        return self._apply("min", value, **kwargs)

    def max(self, value, **kwargs):
        return self._apply("max", value, **kwargs)

    def apply(self, func, **kwargs):
        jidx, _, _ = _plan(self._array, self._idx)
        return NamedArray(self._array.array.at[tuple(jidx)].apply(func, **kwargs), self._array.axes)

    def get(self, **kwargs):
        jidx, out_axes, _ = _plan(self._array, self._idx)
        return NamedArray(self._array.array.at[tuple(jidx)].get(**kwargs), out_axes)


class _AtHelper:
    def __init__(self, array: NamedArray):
        self._array = array

    def __getitem__(self, idx) -> NamedIndexUpdateRef:
        return NamedIndexUpdateRef(self._array, idx)
