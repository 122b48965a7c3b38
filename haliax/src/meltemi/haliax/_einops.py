"""einops-style string patterns for `rearrange`, and `repeat` / `tile` / `unflatten`.

`rearrange(x, "b (h d) -> b h d", h=4)` follows Haliax's syntax:

- an **ordered** left side binds its identifiers to `x`'s axes by position (`...` stands for
  the axes not named); the identifiers are variables, so output axes keep their own names
  (`"n c h w -> n h w c"` moves the second axis last whatever it is called);
- an **unordered** left side `{h w}` selects axes by name;
- `(a b)` (or `(name: a b)`) on the left splits an axis into new axes `a` and `b` (sizes from
  keyword arguments, one may be inferred); on the right `(name: a b)` merges them into an axis
  called `name` (merged axes must be named);
- a keyword argument gives a size (`h=4`), a new name (`p="patch"`) or an `Axis`.

Split and merged axes are in C order, as in einops and `jnp.reshape`.

>>> import jax.numpy as jnp
>>> import meltemi.haliax as hax
>>> x = hax.named(jnp.arange(2 * 15).reshape(2, 15), ("batch", "hd"))
>>> y = hax.rearrange(x, "b (heads d) -> b heads d", heads=3)
>>> [(a.name, a.size) for a in y.axes]
[('batch', 2), ('heads', 3), ('d', 5)]
>>> bool((hax.rearrange(y, "b h d -> b (hd: h d)").array == x.array).all())
True
>>> [a.name for a in hax.rearrange(y, "{d heads} -> d ... heads").axes]
['d', 'batch', 'heads']
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from meltemi.haliax._axis_specs import rearrange_for_partial_order
from meltemi.haliax._core import (
    Axis,
    AxisError,
    AxisSelector,
    NamedArray,
    axis_name,
    unflatten_axis,
)
from meltemi.haliax._core import rearrange as _rearrange_axes
from meltemi.haliax._parsing import Expression, parse_rearrangement

__all__ = ["rearrange", "repeat", "tile", "unflatten"]


@dataclasses.dataclass(frozen=True)
class _Group:
    """`(name: parts...)`; `name` is None for an anonymous split."""

    name: str | None
    parts: tuple[str, ...]


def _fail(pattern: str, why: str) -> AxisError:
    return AxisError(f"rearrange pattern {pattern!r}: {why}")


def _elements(side: Expression) -> list[Any]:
    """Identifiers (str), `...`, and `_Group`s of one parsed side."""
    out: list[Any] = []
    for c in side.captures:
        if c is Ellipsis:
            out.append("...")
        elif len(c.axes) == 1 and c.binding == c.axes[0]:
            out.append(c.axes[0])
        else:
            out.append(_Group(c.binding, c.axes))
    return out


def _idents(el: Any) -> tuple[str, ...]:
    return el.parts if isinstance(el, _Group) else (el,)


def _bound_axis(ident: str, size: int, bindings: Mapping[str, Any]) -> Axis:
    b = bindings.get(ident)
    if isinstance(b, Axis):
        return b
    if isinstance(b, str):
        return Axis(b, size)
    return Axis(ident, size)


def _split(
    axis: Axis, parts: tuple[str, ...], bindings: Mapping[str, Any], pattern: str
) -> list[tuple[str, Axis]]:
    sizes: list[int | None] = []
    for p in parts:
        b = bindings.get(p)
        sizes.append(b.size if isinstance(b, Axis) else b if isinstance(b, int) else None)
    unknown = [i for i, s in enumerate(sizes) if s is None]
    known = math.prod(s for s in sizes if s is not None)
    if len(unknown) > 1:
        raise _fail(
            pattern,
            f"Sizes for splitting {axis.name!r} ({axis.size}) into {parts} are ambiguous: "
            f"give all but one as keyword arguments, e.g. {parts[unknown[0]]}=...",
        )
    if known == 0 or axis.size % known or (not unknown and known != axis.size):
        raise _fail(
            pattern,
            f"parts {dict(zip(parts, sizes, strict=True))} do not divide evenly into axis "
            f"{axis.name!r} of size {axis.size}",
        )
    if unknown:
        sizes[unknown[0]] = axis.size // known
    return [(p, _bound_axis(p, s, bindings)) for p, s in zip(parts, sizes, strict=True)]  # type: ignore[arg-type]


def _bind_lhs(
    array: NamedArray, lhs: list[Any], unordered: bool, bindings: Mapping[str, Any], pattern: str
) -> list[list[tuple[str | None, Axis]]]:
    """The atoms (identifier, Axis) each input axis is split into, in input order."""
    per_axis: list[list[tuple[str | None, Axis]] | None] = [None] * array.ndim
    seen: set[str] = set()

    def bind(i: int, el: Any) -> None:
        if per_axis[i] is not None:
            raise _fail(pattern, f"Axis {array.axes[i]} is bound more than once")
        for ident in _idents(el):
            if ident in seen:
                raise _fail(pattern, f"Capture {ident} is assigned more than once on the left")
            seen.add(ident)
        ax = array.axes[i]
        per_axis[i] = (
            _split(ax, el.parts, bindings, pattern) if isinstance(el, _Group) else [(el, ax)]
        )

    if unordered:
        for el in lhs:
            if el == "...":
                continue
            name = el.name if isinstance(el, _Group) else el
            if name is None:
                raise _fail(
                    pattern, "Unordered axes must be bound by name, e.g. (a: b c) or just a"
                )
            alias = bindings.get(name)
            real = axis_name(alias) if isinstance(alias, str | Axis) else name
            if not any(a.name == real for a in array.axes):
                raise _fail(pattern, f"Could not resolve axis {real}: the array has {array.axes}")
            bind(array.axis_index(real), el)
    else:
        if lhs.count("...") > 1:
            raise _fail(pattern, "Only one ellipsis allowed on the left")
        named = [e for e in lhs if e != "..."]
        if "..." not in lhs and len(named) > array.ndim:
            raise _fail(pattern, f"Too many axes in lhs: {len(named)} for {array.axes}")
        if "..." not in lhs and len(named) < array.ndim:
            raise _fail(
                pattern,
                f"Not all axes are bound, use ... to skip missing axes: {len(named)} names "
                f"for {array.axes}",
            )
        dots = lhs.index("...") if "..." in lhs else len(lhs)
        head, tail = named[:dots], named[dots:]
        if len(head) > array.ndim:
            raise _fail(pattern, f"Too many axes in lhs: {len(head)} for {array.axes}")
        for i, el in enumerate(head):
            bind(i, el)
        for i, el in reversed(
            list(zip(range(array.ndim - len(tail), array.ndim), tail, strict=True))
        ):
            if i < 0:
                raise _fail(pattern, f"Too many axes in lhs: {len(named)} for {array.axes}")
            bind(i, el)
    return [b if b is not None else [(None, array.axes[i])] for i, b in enumerate(per_axis)]


def _rearrange_pattern(array: NamedArray, pattern: str, bindings: Mapping[str, Any]) -> NamedArray:
    if pattern.count("->") != 1:
        raise _fail(pattern, "needs exactly one '->'")
    try:
        lhs_e, rhs_e = parse_rearrangement(pattern)
    except ValueError as e:
        raise _fail(pattern, str(e)) from None
    lhs, rhs = _elements(lhs_e), _elements(rhs_e)
    # 1. bind every input axis to atoms: (variable, Axis) pairs, in input order.
    atoms = [
        a for group in _bind_lhs(array, lhs, not lhs_e.is_ordered, bindings, pattern) for a in group
    ]
    index = {v: k for k, (v, _) in enumerate(atoms) if v is not None}
    # 2. the right side: a partial order of atoms, `...` for the atoms not named.
    used: list[int] = []
    partial: list[Any] = []
    out_axis_of_first: dict[int, Axis] = {}
    for el in rhs:
        if el == "...":
            partial.append(Ellipsis)
            continue
        if isinstance(el, _Group) and el.name is None:
            raise _fail(
                pattern,
                f"All rhs axes must have a name: use ({'_'.join(el.parts)}: {' '.join(el.parts)})",
            )
        ks = []
        for ident in _idents(el):
            if ident not in index:
                raise _fail(pattern, f"Axis {ident} is not bound on the lhs ({sorted(index)})")
            if index[ident] in used:
                raise _fail(pattern, f"Axis {ident} is used more than once on the right")
            ks.append(index[ident])
        used += ks
        partial += [str(k) for k in ks]
        if isinstance(el, _Group):
            name = bindings.get(el.name, el.name)
            out_axis_of_first[ks[0]] = Axis(
                axis_name(name), math.prod(atoms[k][1].size for k in ks)
            )
        else:
            out_axis_of_first[ks[0]] = atoms[ks[0]][1]
    rest = [k for k in range(len(atoms)) if k not in used]
    if rest and Ellipsis not in partial:
        names = [atoms[k][1].name for k in rest]
        raise _fail(
            pattern, f"Not all intermediate axes are used: {names}; use ... to insert unused axes"
        )
    # 3. reshape into atoms, transpose, reshape into the output axes (Haliax's greedy order).
    order = [
        int(k)
        for k in rearrange_for_partial_order(partial, tuple(str(k) for k in range(len(atoms))))
    ]
    new_axes: list[Axis] = []
    for k in order:
        if k not in used:
            new_axes.append(atoms[k][1])
        elif k in out_axis_of_first:
            new_axes.append(out_axis_of_first[k])
    data = jnp.reshape(array.array, tuple(ax.size for _, ax in atoms))
    data = jnp.reshape(jnp.transpose(data, order), tuple(a.size for a in new_axes))
    return NamedArray(data, tuple(new_axes))


def rearrange(array: NamedArray, axes: Any, **bindings: Any) -> NamedArray:
    """Reorders axes by a sequence of names (`("c", ...)`), or splits, merges and reorders
    them by an einops-style pattern (`"b (h d) -> b h d"`, see the module docstring).

    Args:
        array: the array.
        axes: a sequence of axes / names (one `...` allowed) or a pattern string.
        **bindings: for patterns: sizes (`h=4`), new names (`p="patch"`) or `Axis` objects.

    >>> import jax.numpy as jnp
    >>> import meltemi.haliax as hax
    >>> x = hax.named(jnp.zeros((2, 3, 4)), ("a", "b", "c"))
    >>> rearrange(x, ("c", ...)).axes[0].name
    'c'
    >>> [a.size for a in rearrange(x, "a b (c1 c2) -> c2 (ab: a b) c1", c1=2).axes]
    [2, 6, 2]
    """
    if isinstance(axes, str):
        return _rearrange_pattern(array, axes, bindings)
    if bindings:
        raise AxisError(f"rearrange: keyword bindings {sorted(bindings)} need a pattern string")
    return _rearrange_axes(array, axes)


def repeat(
    array: NamedArray,
    repeats: int | jax.Array,
    axis: AxisSelector,
    total_repeat_length: int | None = None,
) -> NamedArray:
    """`jnp.repeat` along one axis: each element `repeats` times in a row (an int, or one count
    per element); the axis keeps its name and takes the new size.

    Args:
        array: the array.
        repeats: how often to repeat each element along `axis`.
        axis: the axis to repeat along.
        total_repeat_length: the result size, needed under `jit` when `repeats` is an array.

    >>> import jax.numpy as jnp
    >>> import meltemi.haliax as hax
    >>> repeat(hax.arange(hax.Axis("pos", 3)), 2, "pos").array.tolist()
    [0, 0, 1, 1, 2, 2]
    >>> repeat(hax.arange(hax.Axis("pos", 2)), jnp.array([1, 2]), "pos").axes
    (Axis(name='pos', size=3),)
    """
    i = array.axis_index(axis)
    out = jnp.repeat(array.array, repeats, axis=i, total_repeat_length=total_repeat_length)
    new_axis = array.axes[i].resize(out.shape[i])
    return NamedArray(out, array.axes[:i] + (new_axis,) + array.axes[i + 1 :])


def tile(array: NamedArray, reps: Mapping[AxisSelector, int]) -> NamedArray:
    """`jnp.tile` by axis: the whole array is repeated `reps[axis]` times along each axis
    named (axes keep their names and grow); an axis `array` does not have is added in front,
    with size `reps[axis]`, as Haliax does.

    >>> import meltemi.haliax as hax
    >>> tile(hax.arange(hax.Axis("pos", 3)), {"pos": 2}).array.tolist()
    [0, 1, 2, 0, 1, 2]
    >>> tile(hax.arange(hax.Axis("pos", 2)), {"rows": 3}).axes
    (Axis(name='rows', size=3), Axis(name='pos', size=2))
    """
    counts = [1] * array.ndim
    new_axes: list[Axis] = []
    for ax, n in reps.items():
        name = axis_name(ax)
        if any(a.name == name for a in array.axes):
            counts[array.axis_index(name)] = int(n)
        else:
            new_axes.append(Axis(name, int(n)))  # type: ignore[arg-type]
    counts = [a.size for a in new_axes] + counts
    grown = tuple(
        a.resize(a.size * n) for a, n in zip(array.axes, counts[len(new_axes) :], strict=True)
    )
    return NamedArray(jnp.tile(array.array, counts), tuple(new_axes) + grown)


unflatten = unflatten_axis
"""`unflatten_axis` (the inverse of `flatten_axes`), under the name paired with `flatten`."""
