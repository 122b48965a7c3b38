"""`NamedRef`: a mutable `jax.Ref` with named axes, indexed like a NamedArray.

>>> import meltemi.haliax as hax
>>> Pos = hax.Axis("pos", 5)
>>> r = hax.new_ref(hax.zeros(Pos))
>>> r[{"pos": 1}] = 3.0
>>> hax.freeze(r).array
Array([0., 3., 0., 0., 0.], dtype=float32)
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from meltemi.haliax._core import Axis, AxisSelector, NamedArray, broadcast_to
from meltemi.haliax._indexing import _normalize, _plan, index

__all__ = ["NamedRef", "new_ref", "freeze", "get", "swap"]


class NamedRef:
    """A `jax.Ref` (mutable buffer) with axes; `r[idx]` reads, `r[idx] = v` writes, by name."""

    __slots__ = ("_ref", "_axes")

    def __init__(self, ref: Any, axes: tuple[Axis, ...]):
        self._ref = ref
        self._axes = tuple(axes)

    @property
    def axes(self) -> tuple[Axis, ...]:
        return self._axes

    @property
    def shape(self) -> Mapping[str, int]:
        return {a.name: a.size for a in self._axes}

    named_shape = shape

    @property
    def dtype(self):
        return self._ref.dtype

    @property
    def ndim(self) -> int:
        return len(self._axes)

    def resolve_axis(self, axis: AxisSelector) -> Axis:
        return self._proxy().resolve_axis(axis)

    def _proxy(self) -> NamedArray:
        shape = tuple(a.size for a in self._axes)
        return NamedArray(jax.ShapeDtypeStruct(shape, self._ref.dtype), self._axes)

    def _static_plan(self, idx: Any):
        """(jnp index, result axes) when `idx` has only ints and slices, else None."""
        if idx is Ellipsis:
            return (Ellipsis,), self._axes
        norm = _normalize(self._proxy(), idx)
        if not all(isinstance(v, int | builtins.slice) for v in norm.values()):
            return None
        jidx, out_axes, _ = _plan(self._proxy(), norm)
        return tuple(jidx), out_axes  # a Ref takes a tuple index, not a list

    def value(self) -> NamedArray:
        """The current contents."""
        return NamedArray(self._ref[...], self._axes)

    def __getitem__(self, idx: Any = Ellipsis) -> NamedArray:
        plan = self._static_plan(idx)
        if plan is None:
            return index(self.value(), idx)
        jidx, out_axes = plan
        return NamedArray(self._ref[jidx], out_axes)

    def _payload(self, out_axes: tuple[Axis, ...], value: Any) -> Any:
        if isinstance(value, NamedArray):
            return broadcast_to(value, out_axes).array.astype(self.dtype)
        return jnp.broadcast_to(jnp.asarray(value, self.dtype), tuple(a.size for a in out_axes))

    def __setitem__(self, idx: Any, value: Any) -> None:
        plan = self._static_plan(idx)
        if plan is None:
            self._ref[...] = self.value().at[idx].set(value).array
            return
        jidx, out_axes = plan
        self._ref[jidx] = self._payload(out_axes, value)

    def __repr__(self) -> str:
        axes = ", ".join(f"{a.name}={a.size}" for a in self._axes)
        return f"NamedRef(({axes}), dtype={self.dtype})"


def new_ref(value: NamedArray) -> NamedRef:
    """A new mutable reference holding `value`."""
    if not isinstance(value, NamedArray):
        raise TypeError(
            f"new_ref needs a NamedArray, got {type(value).__name__}; name it first: "
            f"hax.new_ref(hax.named(x, axes))"
        )
    return NamedRef(jax.new_ref(value.array), value.axes)


def freeze(ref: NamedRef) -> NamedArray:
    """The contents of `ref` as an immutable NamedArray."""
    return ref.value()


def get(ref: NamedRef, idx: Any = Ellipsis) -> NamedArray:
    """`ref[idx]`."""
    return ref[idx]


def swap(ref: NamedRef, idx: Any, value: Any) -> NamedArray:
    """Writes `value` at `idx` and returns what was there."""
    old = ref[idx]
    ref[idx] = value
    return old
