"""Named higher-order functions: `vmap`, `scan`, `fold`, `map` over an axis given by name.

>>> import jax.numpy as jnp
>>> import meltemi.haliax as hax
>>> Layers, Embed = hax.Axis("layers", 3), hax.Axis("embed", 2)
>>> ws = hax.ones((Layers, Embed))
>>> out = hax.fold(lambda c, w: c + w, Layers)(hax.zeros(Embed), ws)
>>> out.array
Array([3., 3.], dtype=float32)
>>> hax.vmap(lambda w: w.sum(), Layers)(ws).axes
(Axis(name='layers', size=3),)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
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
    is_named_array,
)
from meltemi.haliax._remat import (
    RematSpec,
    ScanCheckpointPolicy,
    multilevel_scan,
    tree_checkpoint_name,
)

__all__ = ["vmap", "scan", "fold", "map"]


def _is_array(x: Any) -> bool:
    return isinstance(x, jax.Array | np.ndarray) and not isinstance(x, NamedArray)


def _is_shaped_array(x: Any) -> bool:
    """An unnamed array with at least one dimension (scan slices these; scalars are shared)."""
    return _is_array(x) and np.ndim(x) > 0


def _zero_if_array_else_none(x: Any):
    return 0 if _is_array(x) else None


def _infer_size(axis: AxisSelector, leaves: list[Any]) -> Axis:
    if isinstance(axis, Axis):
        return axis
    for leaf in leaves:
        if isinstance(leaf, NamedArray) and leaf.has_axis(axis):
            return leaf.resolve_axis(axis)
    raise AxisError(
        f"axis {axis!r} was given by name but no NamedArray argument has it; pass an Axis "
        f"with a size, e.g. Axis({axis!r}, n)"
    )


class _Split:
    """Splits a pytree (NamedArrays as leaves) into mapped arrays, closure arrays and statics."""

    def __init__(self, tree: Any, axis_name_: str, raw_spec: Callable[[Any], Any]):
        leaves, self.treedef = jax.tree.flatten(tree, is_leaf=is_named_array)
        self.kinds: list[Any] = []
        self.mapped: list[Any] = []
        self.leaves = leaves
        for leaf in leaves:
            if isinstance(leaf, NamedArray):
                i = leaf._lookup_index(axis_name_)
                if i is None:
                    self.kinds.append(("fixed",))
                else:
                    rest = leaf.axes[:i] + leaf.axes[i + 1 :]
                    self.kinds.append(("named", i, rest, leaf.axes[i]))
                    self.mapped.append(leaf.array)
            elif _is_array(leaf) or isinstance(leaf, jax.core.Tracer):
                spec = raw_spec(leaf)
                if spec is None:
                    self.kinds.append(("fixed",))
                else:
                    self.kinds.append(("raw", spec))
                    self.mapped.append(leaf)
            else:
                self.kinds.append(("fixed",))

    def rebuild(self, mapped: list[Any]) -> Any:
        it = iter(mapped)
        out = []
        for kind, leaf in zip(self.kinds, self.leaves):
            if kind[0] == "named":
                out.append(NamedArray(next(it), kind[2]))
            elif kind[0] == "raw":
                out.append(next(it))
            else:
                out.append(leaf)
        return jax.tree.unflatten(self.treedef, out)

    def check_size(self, axis: Axis) -> None:
        for kind in self.kinds:
            if kind[0] == "named" and kind[3].size != axis.size:
                raise AxisError(
                    f"axis {axis.name!r} has size {axis.size} but an argument has it with size "
                    f"{kind[3].size}"
                )


class _Outputs:
    """Records the named structure of a traced function's outputs."""

    def __init__(self):
        self.treedef = None
        self.meta: list[Any] = []

    def flatten(self, out: Any) -> list[Any]:
        leaves, self.treedef = jax.tree.flatten(out, is_leaf=is_named_array)
        arrays, self.meta = [], []
        for leaf in leaves:
            if isinstance(leaf, NamedArray):
                self.meta.append(("named", leaf.axes))
                arrays.append(leaf.array)
            elif _is_array(leaf) or isinstance(leaf, jax.core.Tracer):
                self.meta.append(("raw",))
                arrays.append(leaf)
            else:
                self.meta.append(("static", leaf))
        return arrays

    def unflatten(self, arrays: list[Any], axis: Axis | None) -> Any:
        it = iter(arrays)
        out = []
        for m in self.meta:
            if m[0] == "named":
                a = next(it)
                axes = m[1] if axis is None else (axis,) + m[1]
                if axis is not None and any(x.name == axis.name for x in m[1]):
                    raise AxisError(f"output already has axis {axis.name!r}: {_fmt_axes(m[1])}")
                out.append(NamedArray(a, axes))
            elif m[0] == "raw":
                out.append(next(it))
            else:
                out.append(m[1])
        return jax.tree.unflatten(self.treedef, out)


def vmap(
    fn: Callable,
    axis: AxisSelector | tuple[AxisSelector, ...],
    *,
    default: Callable[[Any], Any] = _zero_if_array_else_none,
    spmd_axis_name: Any = None,
) -> Callable:
    """Maps `fn` over a named axis.

    NamedArray arguments that have `axis` are mapped over it (wherever it sits); others are
    passed whole. Unnamed arrays are mapped over their leading dimension unless `default(leaf)`
    returns None. Outputs get `axis` as their first axis.

    Args:
        fn: the function to map.
        axis: the axis (or axes, outermost first) to map over.
        default: for unnamed leaves: returns None to pass a leaf whole, else it is mapped on dim 0.
        spmd_axis_name: mesh axis the mapped axis is sharded over (as `jax.vmap`).
    """
    if isinstance(axis, tuple | list):
        out = fn
        for ax in reversed(axis):
            out = vmap(out, ax, default=default, spmd_axis_name=spmd_axis_name)
        return out
    name = axis_name(axis)

    def mapped(*args, **kwargs):
        split = _Split((args, kwargs), name, default)  # type: ignore[arg-type]
        ax = _infer_size(axis, split.leaves)
        split.check_size(ax)
        outs = _Outputs()
        in_axes = [k[1] for k in split.kinds if k[0] in ("named", "raw")]

        def inner(*arrays):
            a, kw = split.rebuild(list(arrays))
            return outs.flatten(fn(*a, **kw))

        result = jax.vmap(
            inner,
            in_axes=tuple(in_axes),
            out_axes=0,
            axis_size=ax.size,
            spmd_axis_name=spmd_axis_name,
        )(*split.mapped)
        return outs.unflatten(result, ax)

    return mapped


def _scan_split(axis: AxisSelector, args, kwargs, is_scanned, f: Callable | None = None):
    name = axis_name(axis)
    split = _Split((args, kwargs), name, lambda x: 0 if is_scanned(x) else None)  # type: ignore
    ax = _infer_size(axis, split.leaves)
    split.check_size(ax)
    _check_leading_sizes(ax, split, args, kwargs, f)
    xs = []
    for kind, arr in zip([k for k in split.kinds if k[0] != "fixed"], split.mapped):
        i = kind[1]
        xs.append(arr if i == 0 else jnp.moveaxis(arr, i, 0))
    return split, ax, xs


def _check_leading_sizes(ax: Axis, split: _Split, args, kwargs, f: Callable | None) -> None:
    """Names each scanned unnamed array whose leading dimension is not `ax.size` (Haliax's
    message: "y has leading dimension 1", with the argument's name and pytree path)."""
    paths = [
        p
        for p, _ in jax.tree_util.tree_flatten_with_path((args, kwargs), is_leaf=is_named_array)[0]
    ]
    bad = [
        (path, np.shape(leaf)[0])
        for path, leaf, kind in zip(paths, split.leaves, split.kinds)
        if kind[0] == "raw" and np.ndim(leaf) > 0 and np.shape(leaf)[0] != ax.size
    ]
    if not bad:
        return
    names = _positional_names(f, len(args)) if f is not None else {}
    details = ", ".join(f"{_format_path(p, names)} has leading dimension {n}" for p, n in bad)
    raise ValueError(
        f"scan over axis {ax.name!r} got `length` argument of {ax.size} but some inputs had "
        f"different leading axis sizes: {details}; give them a leading dimension of {ax.size} "
        f"or pass them as NamedArrays without {ax.name!r} (or set is_scanned) to share them"
    )


def _positional_names(f: Callable, n_args: int) -> dict[int, str]:
    """Argument index (after the carry) -> parameter name of `f`, where it can be read."""
    try:
        params = list(inspect.signature(f).parameters.values())[1:]
    except (TypeError, ValueError):
        return {}
    out: dict[int, str] = {}
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            out[len(out)] = p.name
        elif p.kind == p.VAR_POSITIONAL:
            base = len(out)
            for i in range(base, n_args):
                out[i] = f"{p.name}[{i - base}]"
            break
    return out


def _format_path(path: tuple, names: dict[int, str]) -> str:
    tu = jax.tree_util
    parts: list[str] = []
    rest = path
    if len(path) >= 2 and isinstance(path[0], tu.SequenceKey):
        if path[0].idx == 0 and isinstance(path[1], tu.SequenceKey):  # positional argument
            parts.append(names.get(path[1].idx, f"[{path[1].idx}]"))
            rest = path[2:]
        elif path[0].idx == 1 and isinstance(path[1], tu.DictKey):  # keyword argument
            parts.append(str(path[1].key))
            rest = path[2:]
    for p in rest:
        if isinstance(p, tu.GetAttrKey):
            parts.append("." + p.name)
        elif isinstance(p, tu.DictKey):
            parts.append(f"[{p.key!r}]")
        elif isinstance(p, tu.SequenceKey):
            parts.append(f"[{p.idx}]")
        else:
            parts.append(str(p))
    return "".join(parts).lstrip(".") or "<root>"


def _match_carry(new: Any, old: Any) -> Any:
    """Reorders NamedArray carries to the input carry's axis order (lax.scan needs one type)."""

    def fix(n, o):
        if isinstance(n, NamedArray) and isinstance(o, NamedArray) and n.axes != o.axes:
            return n.rearrange([a.name for a in o.axes])
        return n

    return jax.tree.map(fix, new, old, is_leaf=is_named_array)


def scan(
    f: Callable,
    axis: AxisSelector,
    *,
    remat: RematSpec = False,
    reverse: bool = False,
    unroll: int = 1,
    is_scanned: Callable[[Any], bool] = _is_shaped_array,
) -> Callable:
    """`lax.scan` over a named axis: returns `g(init, *args, **kwargs) -> (carry, ys)`.

    `f(carry, *args, **kwargs) -> (carry, y)`. Arguments that are NamedArrays with `axis` are
    sliced along it; unnamed arrays are sliced along their leading dimension when
    `is_scanned(leaf)` (by default: those with at least one dimension); everything else is
    passed whole to every step. NamedArrays in `y` are stacked with `axis` first. `remat` is a
    ScanCheckpointPolicy, a bool, or a kind string. An unnamed scanned array whose leading
    dimension is not the axis size is a ValueError naming its argument and pytree path.

    Args:
        f: `f(carry, *args, **kwargs) -> (carry, y)`.
        axis: the axis to scan over.
        remat: checkpointing: a ScanCheckpointPolicy, a bool or a kind string.
        reverse: scan from the last step to the first.
        unroll: steps unrolled per loop iteration.
        is_scanned: which unnamed leaves are sliced along their leading dim.
    """
    policy = ScanCheckpointPolicy.from_bool_or_str(remat).resolved()
    carry_name = f"scan({axis_name(axis)})__carry"
    input_name = f"scan({axis_name(axis)})__input"

    def scanned(init, *args, **kwargs):
        split, ax, xs = _scan_split(axis, args, kwargs, is_scanned, f)
        outs = _Outputs()

        def body(carry, x):
            x = tree_checkpoint_name(list(x), input_name)
            carry = tree_checkpoint_name(carry, carry_name)
            a, kw = split.rebuild(x)
            result = f(carry, *a, **kw)
            if not isinstance(result, tuple | list) or len(result) != 2:
                raise ValueError(
                    f"scan: f must return a pair (carry, y), got {type(result).__name__}; "
                    f"use hax.fold for a function that returns only the carry"
                )
            new_carry, y = result
            return _match_carry(new_carry, carry), outs.flatten(y)

        body = policy.checkpoint(carry_name, input_name, body)
        outer = policy.outer_block_size(ax.size)
        if outer is not None:
            carry, ys = multilevel_scan(
                body, init, xs, outer, ax.size, reverse=reverse, unroll=unroll
            )
        else:
            carry, ys = jax.lax.scan(body, init, xs, length=ax.size, reverse=reverse, unroll=unroll)
        return carry, outs.unflatten(ys, ax)

    return scanned


def fold(
    fn: Callable,
    axis: AxisSelector,
    *,
    remat: RematSpec = False,
    reverse: bool = False,
    unroll: int = 1,
    is_scanned: Callable[[Any], bool] = _is_shaped_array,
) -> Callable:
    """Like `scan` for `fn(carry, *args, **kwargs) -> carry`: returns `g(init, ...) -> carry`.

    Args:
        fn: `fn(carry, *args, **kwargs) -> carry`.
        axis: the axis to fold over.
        remat: checkpointing, as in `scan`.
        reverse: fold from the last step to the first.
        unroll: steps unrolled per loop iteration.
        is_scanned: which unnamed leaves are sliced along their leading dim.
    """

    def step(carry, *args, **kwargs):
        return fn(carry, *args, **kwargs), None

    s = scan(step, axis, remat=remat, reverse=reverse, unroll=unroll, is_scanned=is_scanned)

    def folded(init, *args, **kwargs):
        return s(init, *args, **kwargs)[0]

    return folded


def map(fn: Callable, axis: AxisSelector, *, is_scanned=_is_shaped_array) -> Callable:
    """Sequential map over a named axis (`lax.map`): like `vmap` but one slice at a time."""

    def step(carry, *args, **kwargs):
        return carry, fn(*args, **kwargs)

    s = scan(step, axis, is_scanned=is_scanned)
    return lambda *args, **kwargs: s(None, *args, **kwargs)[1]
