"""Axis, NamedArray and the helpers that move axes around by name.

>>> import jax.numpy as jnp
>>> import meltemi.haliax as hax
>>> Batch, Embed = hax.Axis("batch", 3), hax.Axis("embed", 5)
>>> x = hax.named(jnp.ones((3, 5)), (Batch, Embed))
>>> x.shape
{'batch': 3, 'embed': 5}
>>> x.rearrange(("embed", "batch")).axes
(Axis(name='embed', size=5), Axis(name='batch', size=3))
"""

from __future__ import annotations

import contextlib
import math
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import meltemi.haliax as _hax  # the methods that live in other modules use it at call time
from meltemi.haliax._axis import (
    Axis,
    AxisError,
    AxisNotFoundError,
    AxisSelection,
    AxisSelector,
    AxisSizeMismatchError,
    AxisSpec,
    DuplicateAxisError,
    _as_tuple,
    _check_unique,
    _fmt_axes,
    axis_name,
    axis_size,
    check_axes_match,
    concat_axes,
    selects_axis,
    without_axes,
)
from meltemi.haliax._axis_specs import rearrange_for_partial_order
from meltemi.haliax._typing import parse_axes_spec

__all__ = [
    "Axis",
    "AxisSelection",
    "AxisSelector",
    "AxisSpec",
    "AxisError",
    "AxisNotFoundError",
    "AxisSizeMismatchError",
    "DuplicateAxisError",
    "NamedArray",
    "named",
    "axis_name",
    "axis_size",
    "selects_axis",
    "concat_axes",
    "without_axes",
    "rename",
    "rearrange",
    "broadcast_to",
    "broadcast_axis",
    "broadcast_arrays",
    "flatten_axes",
    "unflatten_axis",
    "split",
    "is_named_array",
    "check_axes_match",
    "enable_shape_checks",
    "are_shape_checks_enabled",
]

_SHAPE_CHECKS = True


@contextlib.contextmanager
def enable_shape_checks(enabled: bool) -> Iterator[bool]:
    """Within the block, `NamedArray(array, axes)` checks (or, False, skips checking) that the
    array's shape matches the axes; yields the previous setting."""
    global _SHAPE_CHECKS
    old, _SHAPE_CHECKS = _SHAPE_CHECKS, enabled
    try:
        yield old
    finally:
        _SHAPE_CHECKS = old


def are_shape_checks_enabled() -> bool:
    """Whether NamedArray checks shapes against axes (see `enable_shape_checks`)."""
    return _SHAPE_CHECKS


@jax.tree_util.register_pytree_node_class
class NamedArray:
    """A `jax.Array` whose dimensions have names: a pytree with one leaf, the array.

    Build one with `hax.named(array, axes)`. Binary operators align operands by axis name, so
    `x + bias` works whatever the order of `x`'s axes.

    >>> import jax.numpy as jnp
    >>> import meltemi.haliax as hax
    >>> x = hax.named(jnp.arange(6.0).reshape(2, 3), ("a", "b"))
    >>> (x + hax.named(jnp.ones(2), "a")).axes
    (Axis(name='a', size=2), Axis(name='b', size=3))
    >>> x.sum("b").array
    Array([ 3., 12.], dtype=float32)
    """

    __slots__ = ("array", "axes")
    __array_priority__ = 1000  # so numpy defers `np_array + named` to us

    def __init__(self, array: Any, axes: Sequence[Axis]):
        axes = tuple(axes)
        shape = getattr(array, "shape", None)
        if _SHAPE_CHECKS and shape is not None and isinstance(shape, tuple):
            if len(shape) != len(axes) or any(s != a.size for s, a in zip(shape, axes)):
                raise AxisSizeMismatchError(
                    f"array of shape {tuple(shape)} does not match axes {_fmt_axes(axes)}; "
                    f"give one Axis per dimension with the same size"
                )
            _check_unique([a.name for a in axes], "NamedArray axes")
        object.__setattr__(self, "array", array)
        object.__setattr__(self, "axes", axes)

    def __setattr__(self, key, value):
        raise AttributeError("NamedArray is immutable; use .at[...] or hax ops to make a new one")

    def __class_getitem__(cls, spec: Any) -> Any:
        """`NamedArray["batch ... embed"]`: an annotation naming the axes (see `_typing`)."""
        return typing.Annotated[cls, parse_axes_spec(spec)]

    def matches_axes(self, spec: Any) -> bool:
        """Whether this array fits an axes annotation (`NamedArray["a ... b"]` or its spec)."""
        return parse_axes_spec(spec).matches([a.name for a in self.axes], self.dtype)

    # pytree
    def tree_flatten(self):
        return (self.array,), self.axes

    @classmethod
    def tree_unflatten(cls, axes, children):
        obj = object.__new__(cls)
        object.__setattr__(obj, "array", children[0])
        object.__setattr__(obj, "axes", axes)
        return obj

    # --- introspection ---
    @property
    def shape(self) -> dict[str, int]:
        """`{name: size}` in axis order."""
        return {a.name: a.size for a in self.axes}

    @property
    def dtype(self):
        return self.array.dtype

    @property
    def ndim(self) -> int:
        return len(self.axes)

    @property
    def size(self) -> int:
        return math.prod(a.size for a in self.axes)

    @property
    def named_shape(self) -> dict[str, int]:
        return self.shape

    def __repr__(self):
        return f"NamedArray({_fmt_axes(self.axes)}, dtype={getattr(self.array, 'dtype', None)})"

    def _lookup_index(self, name: str) -> int | None:
        for i, a in enumerate(self.axes):
            if a.name == name:
                return i
        return None

    def _not_found(self, ax: AxisSelector) -> AxisNotFoundError:
        name = axis_name(ax)
        return AxisNotFoundError(
            f"axis {name!r} not found; the array has axes {_fmt_axes(self.axes)}"
        )

    def axis_index(self, ax: AxisSelector) -> int:
        """Position of an axis; raises AxisNotFoundError listing the axes present."""
        i = self._lookup_index(axis_name(ax))  # type: ignore[arg-type]
        if i is None:
            raise self._not_found(ax)
        if isinstance(ax, Axis):
            check_axes_match(ax, self.axes[i])
        return i

    def axis_indices(self, ax: AxisSelection) -> int | None | tuple[int | None, ...]:
        """Haliax's lookup: the position of an axis (None if absent), or a tuple for several.

        An `Axis` whose name is present with another size raises AxisSizeMismatchError.
        """
        if isinstance(ax, Axis | str):
            i = self._lookup_index(axis_name(ax))  # type: ignore[arg-type]
            if i is not None and isinstance(ax, Axis):
                check_axes_match(ax, self.axes[i])
            return i
        return tuple(self.axis_indices(a) for a in ax)  # type: ignore[misc]

    def has_axis(self, ax: AxisSelection) -> bool:
        """Whether every axis in `ax` is present (by name)."""
        return all(self._lookup_index(axis_name(a)) is not None for a in _as_tuple(ax))  # type: ignore[arg-type]

    def resolve_axis(self, ax: AxisSelection) -> Any:
        """Axis (or tuple of Axis) for a name (or names); raises AxisNotFoundError."""
        if isinstance(ax, Axis | str):
            return self.axes[self.axis_index(ax)]
        return tuple(self.axes[self.axis_index(a)] for a in ax)

    def axis_size(self, ax: AxisSelection) -> int:
        r = self.resolve_axis(ax)
        return axis_size(r)

    def scalar(self):
        """The array of a 0-axis NamedArray."""
        if self.axes:
            raise AxisError(
                f"scalar() needs an array with no axes, got axes {_fmt_axes(self.axes)}"
            )
        return self.array

    def item(self):
        return self.array.item()

    # No `__jax_array__`, as in Haliax: `jnp` functions take `.array`, and `raw + named` defers
    # to NamedArray's operators (a raw scalar plus a named scalar stays named).
    def __float__(self) -> float:
        return float(self.array)

    def __int__(self) -> int:
        return int(self.array)

    def __complex__(self) -> complex:
        return complex(self.array)

    def __bool__(self):
        # as Haliax and JAX: any single-element array (axes of size 1 too) has a truth value
        return bool(self.array)

    def __len__(self):
        if not self.axes:
            raise TypeError("len() of a NamedArray with no axes")
        return self.axes[0].size

    def __iter__(self):
        raise TypeError(
            "NamedArray is not iterable (iteration order would depend on axis order); "
            "use x[{'axis': i}] or hax.unbind(x, axis)"
        )

    # --- axis manipulation ---
    def rename(self, renames: Mapping[AxisSelector, AxisSelector]) -> NamedArray:
        return rename(self, renames)

    def rearrange(self, axes: Sequence[AxisSelector | Any] | str, **bindings: Any) -> NamedArray:
        """Reorders axes (`("c", ...)`) or applies a pattern (`"b (h d) -> b h d"`); see
        `hax.rearrange`."""
        return _hax._einops.rearrange(self, axes, **bindings)

    def broadcast_axis(self, axis: AxisSpec) -> NamedArray:
        return broadcast_axis(self, axis)

    def broadcast_to(self, axes: AxisSpec) -> NamedArray:
        return broadcast_to(self, axes)

    def flatten_axes(self, old_axes: AxisSelection, new_axis: AxisSelector) -> NamedArray:
        return flatten_axes(self, old_axes, new_axis)

    def unflatten_axis(self, axis: AxisSelector, new_axes: AxisSpec) -> NamedArray:
        return unflatten_axis(self, axis, new_axes)

    def split(self, axis: AxisSelector, new_axes: Sequence[Axis]) -> list[NamedArray]:
        return split(self, axis, new_axes)

    def astype(self, dtype) -> NamedArray:
        return NamedArray(self.array.astype(dtype), self.axes)

    @property
    def T(self) -> NamedArray:
        return NamedArray(self.array.T, self.axes[::-1])

    # --- operators: operands are aligned by axis name (`_raw_operands`); `&`, `|`, `^` are
    # logical on bools and bitwise on ints ---
    def __add__(self, other: Any) -> NamedArray:
        return _binop(jnp.add, self, other)

    def __radd__(self, other: Any) -> NamedArray:
        return _binop(jnp.add, other, self)

    def __sub__(self, other: Any) -> NamedArray:
        return _binop(jnp.subtract, self, other)

    def __rsub__(self, other: Any) -> NamedArray:
        return _binop(jnp.subtract, other, self)

    def __mul__(self, other: Any) -> NamedArray:
        return _binop(jnp.multiply, self, other)

    def __rmul__(self, other: Any) -> NamedArray:
        return _binop(jnp.multiply, other, self)

    def __truediv__(self, other: Any) -> NamedArray:
        return _binop(jnp.true_divide, self, other)

    def __rtruediv__(self, other: Any) -> NamedArray:
        return _binop(jnp.true_divide, other, self)

    def __floordiv__(self, other: Any) -> NamedArray:
        return _binop(jnp.floor_divide, self, other)

    def __rfloordiv__(self, other: Any) -> NamedArray:
        return _binop(jnp.floor_divide, other, self)

    def __mod__(self, other: Any) -> NamedArray:
        return _binop(jnp.mod, self, other)

    def __rmod__(self, other: Any) -> NamedArray:
        return _binop(jnp.mod, other, self)

    def __pow__(self, other: Any) -> NamedArray:
        return _binop(jnp.power, self, other)

    def __rpow__(self, other: Any) -> NamedArray:
        return _binop(jnp.power, other, self)

    def __and__(self, other: Any) -> NamedArray:
        return _binop(jnp.bitwise_and, self, other)

    def __rand__(self, other: Any) -> NamedArray:
        return _binop(jnp.bitwise_and, other, self)

    def __or__(self, other: Any) -> NamedArray:
        return _binop(jnp.bitwise_or, self, other)

    def __ror__(self, other: Any) -> NamedArray:
        return _binop(jnp.bitwise_or, other, self)

    def __xor__(self, other: Any) -> NamedArray:
        return _binop(jnp.bitwise_xor, self, other)

    def __rxor__(self, other: Any) -> NamedArray:
        return _binop(jnp.bitwise_xor, other, self)

    def __lshift__(self, other: Any) -> NamedArray:
        return _binop(jnp.left_shift, self, other)

    def __rlshift__(self, other: Any) -> NamedArray:
        return _binop(jnp.left_shift, other, self)

    def __rshift__(self, other: Any) -> NamedArray:
        return _binop(jnp.right_shift, self, other)

    def __rrshift__(self, other: Any) -> NamedArray:
        return _binop(jnp.right_shift, other, self)

    def __eq__(self, other: Any) -> NamedArray:  # type: ignore[override]
        return _binop(jnp.equal, self, other)

    def __ne__(self, other: Any) -> NamedArray:  # type: ignore[override]
        return _binop(jnp.not_equal, self, other)

    def __lt__(self, other: Any) -> NamedArray:  # type: ignore[override]
        return _binop(jnp.less, self, other)

    def __le__(self, other: Any) -> NamedArray:  # type: ignore[override]
        return _binop(jnp.less_equal, self, other)

    def __gt__(self, other: Any) -> NamedArray:  # type: ignore[override]
        return _binop(jnp.greater, self, other)

    def __ge__(self, other: Any) -> NamedArray:  # type: ignore[override]
        return _binop(jnp.greater_equal, self, other)

    __hash__ = None  # type: ignore[assignment]  # == is elementwise

    def __neg__(self) -> NamedArray:
        return NamedArray(-self.array, self.axes)

    def __pos__(self) -> NamedArray:
        return self

    def __abs__(self) -> NamedArray:
        return NamedArray(jnp.abs(self.array), self.axes)

    def __invert__(self) -> NamedArray:
        return NamedArray(jnp.invert(self.array), self.axes)

    # --- elementwise methods ---
    @property
    def real(self) -> NamedArray:
        return NamedArray(jnp.real(self.array), self.axes)

    @property
    def imag(self) -> NamedArray:
        return NamedArray(jnp.imag(self.array), self.axes)

    def exp(self) -> NamedArray:
        return NamedArray(jnp.exp(self.array), self.axes)

    def log(self) -> NamedArray:
        return NamedArray(jnp.log(self.array), self.axes)

    def sqrt(self) -> NamedArray:
        return NamedArray(jnp.sqrt(self.array), self.axes)

    def tanh(self) -> NamedArray:
        return NamedArray(jnp.tanh(self.array), self.axes)

    def sin(self) -> NamedArray:
        return NamedArray(jnp.sin(self.array), self.axes)

    def cos(self) -> NamedArray:
        return NamedArray(jnp.cos(self.array), self.axes)

    def square(self) -> NamedArray:
        return NamedArray(jnp.square(self.array), self.axes)

    def round(self, decimals: int = 0) -> NamedArray:
        return NamedArray(jnp.round(self.array, decimals), self.axes)

    def clip(self, a_min: Any = None, a_max: Any = None) -> NamedArray:
        """`hax.clip`: bounds may be NamedArrays, aligned by name."""
        return _hax._ops.clip(self, a_min, a_max)

    # --- along one axis ---
    def cumsum(self, axis: AxisSelector, *, dtype: Any = None) -> NamedArray:
        return NamedArray(jnp.cumsum(self.array, self.axis_index(axis), dtype), self.axes)

    def sort(self, axis: AxisSelector) -> NamedArray:
        return NamedArray(jnp.sort(self.array, self.axis_index(axis)), self.axes)

    def argsort(self, axis: AxisSelector) -> NamedArray:
        return NamedArray(jnp.argsort(self.array, self.axis_index(axis)), self.axes)

    def roll(self, shift: Any, axis: AxisSelector) -> NamedArray:
        """`hax.roll`: `jnp.roll` along a named axis."""
        return _hax._ops.roll(self, shift, axis)

    def unbind(self, axis: AxisSelector) -> list[NamedArray]:
        """The slices along `axis` (the inverse of `hax.stack`; `hax.unbind`)."""
        return _hax._ops.unbind(self, axis)

    def ravel(self, new_axis_name: AxisSelector) -> NamedArray:
        """All axes merged into one (`hax.ravel`)."""
        return _hax._ops.ravel(self, new_axis_name)

    flatten = ravel

    # --- implemented in other modules (looked up on the package at call time, so `_core`
    # stays at the bottom of the import graph) ---
    def __getitem__(self, idx: Any) -> NamedArray:
        """`x[{"pos": 3, "embed": slice(0, 4)}]` or `x["pos", 3]`: see `hax.index`."""
        return _hax._indexing.index(self, idx)

    @property
    def at(self) -> Any:
        """`x.at[{...}].set/add/multiply/min/max/get(...)`: see `_indexing.NamedIndexUpdateRef`."""
        return _hax._indexing._AtHelper(self)

    def take(self, axis: AxisSelector, index: Any) -> NamedArray:
        return _hax._indexing.take(self, axis, index)

    def slice(self, *args: Any, **kwargs: Any) -> NamedArray:
        """`hax.slice(self, ...)`."""
        return _hax._indexing.slice(self, *args, **kwargs)

    def updated_slice(self, start: Mapping[AxisSelector, Any], update: NamedArray) -> NamedArray:
        return _hax._indexing.updated_slice(self, start, update)

    def dot(self, *others: NamedArray, axis: AxisSelection | None, **kwargs: Any) -> NamedArray:
        """`hax.dot(self, *others, axis=...)`."""
        return _hax._dot.dot(self, *others, axis=axis, **kwargs)

    def sum(self, axis: AxisSelection | None = None, **kwargs: Any) -> NamedArray:
        return _hax._reductions.sum(self, axis, **kwargs)

    def mean(self, axis: AxisSelection | None = None, **kwargs: Any) -> NamedArray:
        return _hax._reductions.mean(self, axis, **kwargs)

    def max(self, axis: AxisSelection | None = None, **kwargs: Any) -> NamedArray:
        return _hax._reductions.max(self, axis, **kwargs)

    def min(self, axis: AxisSelection | None = None, **kwargs: Any) -> NamedArray:
        return _hax._reductions.min(self, axis, **kwargs)

    def prod(self, axis: AxisSelection | None = None, **kwargs: Any) -> NamedArray:
        return _hax._reductions.prod(self, axis, **kwargs)

    def std(self, axis: AxisSelection | None = None, **kwargs: Any) -> NamedArray:
        return _hax._reductions.std(self, axis, **kwargs)

    def var(self, axis: AxisSelection | None = None, **kwargs: Any) -> NamedArray:
        return _hax._reductions.var(self, axis, **kwargs)

    def any(self, axis: AxisSelection | None = None, **kwargs: Any) -> NamedArray:
        return _hax._reductions.any(self, axis, **kwargs)

    def all(self, axis: AxisSelection | None = None, **kwargs: Any) -> NamedArray:
        return _hax._reductions.all(self, axis, **kwargs)

    def ptp(self, axis: AxisSelection | None = None, **kwargs: Any) -> NamedArray:
        return _hax._reductions.ptp(self, axis, **kwargs)

    def logsumexp(self, axis: AxisSelection | None = None, **kwargs: Any) -> NamedArray:
        return _hax._reductions.logsumexp(self, axis, **kwargs)

    def argmax(self, axis: AxisSelector | None = None) -> NamedArray:
        return _hax._reductions.argmax(self, axis)

    def argmin(self, axis: AxisSelector | None = None) -> NamedArray:
        return _hax._reductions.argmin(self, axis)


def _binop(fn: Any, a: Any, b: Any) -> Any:
    if _scalar_with_unnamed_array(a, b):
        return fn(_unwrap_scalar(a), _unwrap_scalar(b))
    axes, (ra, rb) = _raw_operands(a, b, context=fn.__name__)
    return NamedArray(fn(ra, rb), axes)


def _scalar_with_unnamed_array(a: Any, b: Any) -> bool:
    """Haliax's rule: a NamedArray without axes and an unnamed array with dimensions give an
    unnamed result (`jnp_array + named_scalar`), as the plain scalar would."""
    for n, r in ((a, b), (b, a)):
        if isinstance(n, NamedArray) and not n.axes and not isinstance(r, NamedArray):
            if r is not None and np.ndim(r) != 0:
                return True
    return False


def _unwrap_scalar(x: Any) -> Any:
    return x.array if isinstance(x, NamedArray) else x


def is_named_array(x: Any) -> bool:
    return isinstance(x, NamedArray)


def named(a: Any, axis: AxisSelection) -> NamedArray:
    """Names the dimensions of `a`. Names given as strings take their size from `a`.

    >>> import jax.numpy as jnp
    >>> named(jnp.zeros((2, 3)), ("batch", Axis("embed", 3))).axes
    (Axis(name='batch', size=2), Axis(name='embed', size=3))
    """
    a = jnp.asarray(a)
    sel = _as_tuple(axis)
    if len(sel) != a.ndim:
        raise AxisSizeMismatchError(
            f"named: array of shape {a.shape} has {a.ndim} dimensions but {len(sel)} axes were "
            f"given ({axis_name(sel)}); give one axis per dimension"
        )
    out = []
    for s, ax in zip(a.shape, sel):
        if isinstance(ax, str):
            out.append(Axis(ax, s))
        elif isinstance(ax, Axis):
            if ax.size != s:
                raise AxisSizeMismatchError(
                    f"named: axis {ax.name!r} has size {ax.size} but the array dimension has "
                    f"size {s} (array shape {a.shape}); fix the Axis size or the array"
                )
            out.append(ax)
        else:
            raise TypeError(f"named: expected Axis or str, got {ax!r}")
    return NamedArray(a, tuple(out))


def rename(array: NamedArray, renames: Mapping[AxisSelector, AxisSelector]) -> NamedArray:
    """Renames axes: `rename(x, {"pos": "key_pos"})`; a new Axis must keep the size."""
    new_axes = list(array.axes)
    for old, new in renames.items():
        i = array.axis_index(old)
        if isinstance(new, Axis):
            if new.size != new_axes[i].size:
                raise AxisSizeMismatchError(
                    f"rename: axis {new_axes[i].name!r} has size {new_axes[i].size} but the new "
                    f"axis {new.name!r} has size {new.size}"
                )
            new_axes[i] = new
        else:
            new_axes[i] = Axis(new, new_axes[i].size)
    _check_unique([a.name for a in new_axes], "rename result")
    return NamedArray(array.array, tuple(new_axes))


def _resolve_order(array: NamedArray, axes: Sequence[Any]) -> list[int]:
    """Permutation for `rearrange`: names in order, `...` for the remaining axes."""
    axes = list(axes)
    n_ellipsis = sum(1 for a in axes if a is Ellipsis)
    explicit = [array.axis_index(a) for a in axes if a is not Ellipsis]
    _check_unique([array.axes[i].name for i in explicit], "rearrange")
    if n_ellipsis > 1:  # several `...`: Haliax's greedy partial order
        names = [a if a is Ellipsis else array.axes[array.axis_index(a)].name for a in axes]
        order = rearrange_for_partial_order(names, tuple(a.name for a in array.axes))
        return [array.axis_index(n) for n in order]
    if n_ellipsis == 0:
        if len(explicit) != array.ndim:
            missing = [a.name for i, a in enumerate(array.axes) if i not in explicit]
            raise AxisError(
                f"rearrange: axes {missing} of {_fmt_axes(array.axes)} are not placed; "
                f"list every axis or use `...` for the rest"
            )
        return explicit
    rest = [i for i in range(array.ndim) if i not in explicit]
    k = axes.index(Ellipsis)
    return explicit[:k] + rest + explicit[k:]


def rearrange(array: NamedArray, axes: Sequence[Any]) -> NamedArray:
    """Reorders axes by name; `...` stands for the axes not listed.

    >>> import jax.numpy as jnp
    >>> x = named(jnp.zeros((2, 3, 4)), ("a", "b", "c"))
    >>> rearrange(x, ("c", ...)).axes[0].name
    'c'
    """
    perm = _resolve_order(array, axes)
    if perm == list(range(array.ndim)):
        return array
    return NamedArray(jnp.transpose(array.array, perm), tuple(array.axes[i] for i in perm))


def broadcast_to(array: Any, axes: AxisSpec, *, enforce_no_extra_axes: bool = True) -> NamedArray:
    """Broadcasts to exactly `axes` (in that order); extra axes of `array` are an error."""
    axes = tuple(_as_tuple(axes))  # type: ignore[arg-type]
    if not isinstance(array, NamedArray):
        arr = jnp.asarray(array)
        if arr.ndim != 0:
            raise TypeError(
                f"broadcast_to: only scalars or NamedArrays can be broadcast by name, got shape "
                f"{arr.shape}; wrap it with hax.named(array, axes)"
            )
        return NamedArray(jnp.broadcast_to(arr, tuple(a.size for a in axes)), axes)
    names = {a.name for a in axes}
    extra = [a.name for a in array.axes if a.name not in names]
    if extra and enforce_no_extra_axes:
        raise AxisError(
            f"broadcast_to: array axes {extra} are not in the target axes {_fmt_axes(axes)}"
        )
    for a in array.axes:
        for b in axes:
            check_axes_match(a, b, "broadcast_to")
    aligned = _align(array, axes)
    return NamedArray(jnp.broadcast_to(aligned, tuple(a.size for a in axes)), axes)


def broadcast_axis(array: NamedArray, axis: AxisSpec) -> NamedArray:
    """Adds new axes in front of `array` (axes already present are left alone)."""
    new = tuple(a for a in _as_tuple(axis) if not array.has_axis(a))  # type: ignore[arg-type]
    for a in _as_tuple(axis):
        if array.has_axis(a):
            check_axes_match(a, array.resolve_axis(a.name), "broadcast_axis")  # type: ignore
    return broadcast_to(array, new + array.axes)


def _align(array: NamedArray, out_axes: Sequence[Axis]) -> jax.Array:
    """`array` transposed to the order of `out_axes` with size-1 dims for missing ones."""
    order = []
    out_names = [a.name for a in out_axes]
    for name in out_names:
        i = array._lookup_index(name)
        if i is not None:
            order.append(i)
    if len(order) != array.ndim:
        missing = [a.name for a in array.axes if a.name not in out_names]
        raise AxisNotFoundError(
            f"axes {missing} of {_fmt_axes(array.axes)} have no place in {out_names}"
        )
    arr = array.array
    if order != list(range(array.ndim)):
        arr = jnp.transpose(arr, order)
    if len(out_axes) != array.ndim:
        present = {a.name for a in array.axes}
        shape = tuple(a.size if a.name in present else 1 for a in out_axes)
        arr = jnp.reshape(arr, shape)
    return arr


def _broadcast_axes(
    *arrays: NamedArray, require_subset: bool = True, context: str = "broadcasting"
) -> tuple[Axis, ...]:
    """Result axes when broadcasting by name: the order of the operand with the most axes.

    With `require_subset` (Haliax's rule, the default for every elementwise op) that operand
    must have every other operand's axes; without it the others' missing axes are appended.
    """
    if not arrays:
        return ()
    base = max(arrays, key=lambda a: a.ndim)
    out = list(base.axes)
    by_name = {a.name: a for a in out}
    for arr in arrays:
        for ax in arr.axes:
            if ax.name in by_name:
                check_axes_match(by_name[ax.name], ax, context)
            else:
                by_name[ax.name] = ax
                out.append(ax)
    if require_subset and len(out) != base.ndim:
        raise _not_subset_error(arrays, tuple(out), context)
    return tuple(out)


def _not_subset_error(
    arrays: Sequence[NamedArray], union: tuple[Axis, ...], context: str
) -> AxisError:
    operands = ", ".join(_fmt_axes(a.axes) for a in arrays)
    lacking = next(a for a in arrays if a.ndim and len(a.axes) < len(union))
    have = {a.name for a in lacking.axes}
    missing = [f"hax.Axis({a.name!r}, {a.size})" for a in union if a.name not in have]
    spec = missing[0] if len(missing) == 1 else f"({', '.join(missing)})"
    return AxisError(
        f"{context}: cannot broadcast operands with axes {operands}: no operand has all the "
        f"others' axes (Haliax's rule: one operand's axes must be a subset of the other's, so an "
        f"outer product is never made by accident). To broadcast to the union "
        f"{_fmt_axes(union)}, add the missing axes explicitly first, e.g. for the operand with "
        f"axes {_fmt_axes(lacking.axes)}: `hax.broadcast_axis(x, {spec})` "
        f"(or `hax.broadcast_to(x, <all axes>)`)"
    )


def broadcast_arrays(
    *arrays: Any, require_subset: bool = True, ensure_order: bool = True
) -> tuple[Any, ...]:
    """Broadcasts NamedArrays to common axes, in one order (scalars and None are left alone).

    Args:
        *arrays: NamedArrays, scalars or None.
        require_subset: Haliax's rule: one array must have every other array's axes (else an
            `AxisError`, a ValueError). False broadcasts any arrays to the union of their axes.
        ensure_order: accepted for Haliax compatibility; the results always share one order.
    """
    del ensure_order
    named_ = [a for a in arrays if isinstance(a, NamedArray)]
    axes = _broadcast_axes(*named_, require_subset=require_subset, context="broadcast_arrays")
    return tuple(broadcast_to(a, axes) if isinstance(a, NamedArray) else a for a in arrays)


def _raw_operands(*args: Any, context: str = "broadcasting") -> tuple[tuple[Axis, ...], list[Any]]:
    """Aligned raw arrays (size-1 dims for missing axes) and the result axes (Haliax's rule:
    one operand has every other's axes; `context` names the op in the error)."""
    named_ = [a for a in args if isinstance(a, NamedArray)]
    axes = _broadcast_axes(*named_, context=context)
    raws = []
    for a in args:
        if isinstance(a, NamedArray):
            raws.append(_align(a, axes))
        elif a is None:
            raws.append(None)
        else:
            nd = np.ndim(a)
            if nd != 0:
                raise TypeError(
                    f"cannot combine a NamedArray with an unnamed array of shape {np.shape(a)} "
                    f"(axes would be matched by position); wrap it with hax.named(array, axes)"
                )
            raws.append(a)
    return axes, raws


def flatten_axes(array: NamedArray, old_axes: AxisSelection, new_axis: AxisSelector) -> NamedArray:
    """Merges `old_axes` (moved together, at the first one's place) into one axis.

    >>> import jax.numpy as jnp
    >>> x = named(jnp.zeros((2, 3, 4)), ("a", "b", "c"))
    >>> flatten_axes(x, ("a", "c"), "ac").axes
    (Axis(name='ac', size=8), Axis(name='b', size=3))
    """
    old = list(_as_tuple(old_axes))
    if not old:
        raise ValueError("flatten_axes: need at least one axis to flatten")
    idx = [array.axis_index(a) for a in old]
    _check_unique([array.axes[i].name for i in idx], "flatten_axes")
    size = math.prod(array.axes[i].size for i in idx)
    if isinstance(new_axis, Axis):
        if new_axis.size != size:
            raise AxisSizeMismatchError(
                f"flatten_axes: new axis {new_axis.name!r} has size {new_axis.size} but the "
                f"flattened axes have total size {size}"
            )
        new = new_axis
    else:
        new = Axis(new_axis, size)
    first = min(idx)
    rest = [i for i in range(array.ndim) if i not in idx]
    before = [i for i in rest if i < first]
    after = [i for i in rest if i > first]
    perm = before + idx + after
    arr = array.array if perm == list(range(array.ndim)) else jnp.transpose(array.array, perm)
    shape = [array.axes[i].size for i in before] + [size] + [array.axes[i].size for i in after]
    axes = [array.axes[i] for i in before] + [new] + [array.axes[i] for i in after]
    return NamedArray(jnp.reshape(arr, shape), tuple(axes))


def unflatten_axis(array: NamedArray, axis: AxisSelector, new_axes: AxisSpec) -> NamedArray:
    """Splits one axis into several (row-major), in its place."""
    i = array.axis_index(axis)
    new = tuple(_as_tuple(new_axes))
    total = math.prod(a.size for a in new)  # type: ignore[union-attr]
    if total != array.axes[i].size:
        raise AxisSizeMismatchError(
            f"unflatten_axis: axis {array.axes[i].name!r} has size {array.axes[i].size} but "
            f"the new axes {_fmt_axes(new)} have total size {total}"  # type: ignore[arg-type]
        )
    axes = array.axes[:i] + new + array.axes[i + 1 :]  # type: ignore[operator]
    _check_unique([a.name for a in axes], "unflatten_axis result")
    return NamedArray(jnp.reshape(array.array, tuple(a.size for a in axes)), axes)


def split(array: NamedArray, axis: AxisSelector, new_axes: Sequence[Axis]) -> list[NamedArray]:
    """Splits `axis` into consecutive pieces, one per new axis (their sizes must add up)."""
    i = array.axis_index(axis)
    total = sum(a.size for a in new_axes)
    if total != array.axes[i].size:
        raise AxisSizeMismatchError(
            f"split: axis {array.axes[i].name!r} has size {array.axes[i].size} but the pieces "
            f"{_fmt_axes(new_axes)} add up to {total}"
        )
    bounds = np.cumsum([a.size for a in new_axes])[:-1].tolist()
    pieces = jnp.split(array.array, bounds, axis=i)
    return [
        NamedArray(p, array.axes[:i] + (ax,) + array.axes[i + 1 :])
        for p, ax in zip(pieces, new_axes)
    ]
