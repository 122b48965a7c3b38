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
import re
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from meltemi.haliax._core import (
    Axis,
    AxisError,
    AxisSelector,
    NamedArray,
    axis_name,
    unflatten_axis,
)
from meltemi.haliax._core import rearrange as _rearrange_axes

__all__ = ["rearrange", "repeat", "tile", "unflatten"]

_TOKEN = re.compile(r"\s*(->|\.\.\.|[(){}:,]|[A-Za-z_][A-Za-z0-9_]*)")


@dataclasses.dataclass(frozen=True)
class _Group:
    """`(name: parts...)`; `name` is None for an anonymous split."""

    name: str | None
    parts: tuple[str, ...]


def _fail(pattern: str, why: str) -> AxisError:
    return AxisError(f"rearrange pattern {pattern!r}: {why}")


def _tokens(side: str, pattern: str) -> list[str]:
    out, pos = [], 0
    side = side.strip()
    while pos < len(side):
        m = _TOKEN.match(side, pos)
        if m is None:
            raise _fail(pattern, f"cannot read {side[pos:]!r}")
        out.append(m.group(1))
        pos = m.end()
        while pos < len(side) and side[pos].isspace():
            pos += 1
    return [t for t in out if t != ","]


def _parse_side(side: str, pattern: str) -> tuple[list[Any], bool]:
    """Elements (identifier, `...`, `_Group`) of one side; whether it is `{unordered}`."""
    toks = _tokens(side, pattern)
    unordered = bool(toks) and toks[0] == "{"
    if unordered:
        if toks[-1] != "}":
            raise _fail(pattern, "an unordered side opens with '{' and must close with '}'")
        toks = toks[1:-1]
    elems: list[Any] = []
    i = 0
    while i < len(toks):
        t = toks[i]
        if t == "(":
            close = toks.index(")", i) if ")" in toks[i:] else -1
            if close < 0:
                raise _fail(pattern, "unclosed '('")
            inner = toks[i + 1 : close]
            name = None
            if len(inner) >= 2 and inner[1] == ":":
                name, inner = inner[0], inner[2:]
            if any(not p.isidentifier() for p in inner):
                raise _fail(pattern, f"a group holds identifiers only, got {inner}")
            elems.append(_Group(name, tuple(inner)))
            i = close + 1
        elif t == "..." or t.isidentifier():
            elems.append(t)
            i += 1
        else:
            raise _fail(pattern, f"unexpected {t!r}")
    if elems.count("...") > 1:
        raise _fail(pattern, "at most one '...' per side")
    return elems, unordered


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
            f"splitting {axis.name!r} ({axis.size}) into {parts} needs the sizes of all but one "
            f"part; pass e.g. {parts[unknown[0]]}=...",
        )
    if unknown:
        if known == 0 or axis.size % known:
            raise _fail(pattern, f"{axis.name!r} of size {axis.size} is not divisible by {known}")
        sizes[unknown[0]] = axis.size // known
    if math.prod(sizes) != axis.size:  # type: ignore[arg-type]
        raise _fail(
            pattern,
            f"parts {dict(zip(parts, sizes, strict=True))} multiply to "
            f"{math.prod(sizes)}, not {axis.name!r}'s {axis.size}",  # type: ignore[arg-type]
        )
    return [(p, _bound_axis(p, s, bindings)) for p, s in zip(parts, sizes, strict=True)]  # type: ignore[arg-type]


def _rearrange_pattern(array: NamedArray, pattern: str, bindings: Mapping[str, Any]) -> NamedArray:
    if pattern.count("->") != 1:
        raise _fail(pattern, "needs exactly one '->'")
    lhs_s, rhs_s = pattern.split("->")
    lhs, unordered = _parse_side(lhs_s, pattern)
    rhs, rhs_unordered = _parse_side(rhs_s, pattern)
    if rhs_unordered:
        raise _fail(pattern, "the right side is always ordered")
    # 1. bind every input axis to atoms: (variable, Axis) pairs, in input order.
    per_axis: list[list[tuple[str | None, Axis]] | None] = [None] * array.ndim
    if unordered:
        for el in lhs:
            if el == "...":
                continue
            name = el.name if isinstance(el, _Group) else el
            if name is None:
                raise _fail(pattern, "a split in {...} must name its axis: (name: a b)")
            alias = bindings.get(name)
            i = array.axis_index(axis_name(alias) if isinstance(alias, (str, Axis)) else name)
            ax = array.axes[i]
            per_axis[i] = (
                _split(ax, el.parts, bindings, pattern) if isinstance(el, _Group) else [(el, ax)]
            )
    else:
        n_named = len([e for e in lhs if e != "..."])
        if n_named > array.ndim or ("..." not in lhs and n_named != array.ndim):
            raise _fail(
                pattern,
                f"the left side names {n_named} axes, the array has {array.ndim}: {array.axes}",
            )
        dots = lhs.index("...") if "..." in lhs else len(lhs)
        positions = list(range(dots)) + list(range(array.ndim - (len(lhs) - dots - 1), array.ndim))
        for el, i in zip([e for e in lhs if e != "..."], positions, strict=True):
            ax = array.axes[i]
            per_axis[i] = (
                _split(ax, el.parts, bindings, pattern) if isinstance(el, _Group) else [(el, ax)]
            )
    atoms: list[tuple[str | None, Axis]] = []
    for i, bound in enumerate(per_axis):
        atoms += bound if bound is not None else [(None, array.axes[i])]  # `...` atoms
    variables = [v for v, _ in atoms if v is not None]
    if len(set(variables)) != len(variables):
        raise _fail(pattern, f"an identifier is bound twice on the left: {variables}")
    index = {v: k for k, (v, _) in enumerate(atoms) if v is not None}
    # 2. the right side, as groups of atom indices.
    used: list[int] = []
    out: list[Any] = []
    for el in rhs:
        if el == "...":
            out.append("...")
            continue
        idents = el.parts if isinstance(el, _Group) else (el,)
        for ident in idents:
            if ident not in index:
                raise _fail(
                    pattern, f"{ident!r} on the right is not bound on the left ({variables})"
                )
        if isinstance(el, _Group) and el.name is None:
            raise _fail(
                pattern, f"merged axes need a name: ({'_'.join(el.parts)}: {' '.join(el.parts)})"
            )
        used += [index[i] for i in idents]
        out.append((el, [index[i] for i in idents]))
    if len(set(used)) != len(used):
        raise _fail(pattern, "an identifier appears twice on the right")
    rest = [k for k in range(len(atoms)) if k not in used]
    if rest and "..." not in out:
        names = [atoms[k][1].name for k in rest]
        raise _fail(pattern, f"axes {names} are not on the right side; add '...' to keep them")
    # 3. reshape into atoms, transpose, reshape into the output axes.
    data = jnp.reshape(array.array, tuple(ax.size for _, ax in atoms))
    order: list[int] = []
    new_axes: list[Axis] = []
    for item in out:
        if item == "...":
            order += rest
            new_axes += [atoms[k][1] for k in rest]
            continue
        el, ks = item
        order += ks
        if isinstance(el, _Group):
            name = bindings.get(el.name, el.name)
            new_axes.append(Axis(axis_name(name), math.prod(atoms[k][1].size for k in ks)))
        else:
            new_axes.append(atoms[ks[0]][1])
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


def repeat(array: NamedArray, repeats: int, axis: AxisSelector) -> NamedArray:
    """`jnp.repeat` along one axis: each element `repeats` times in a row; the axis keeps its
    name and grows.

    >>> import meltemi.haliax as hax
    >>> repeat(hax.arange(hax.Axis("pos", 3)), 2, "pos").array.tolist()
    [0, 0, 1, 1, 2, 2]
    """
    i = array.axis_index(axis)
    ax = array.axes[i]
    out = jnp.repeat(array.array, repeats, axis=i)
    return NamedArray(out, array.axes[:i] + (ax.resize(ax.size * repeats),) + array.axes[i + 1 :])


def tile(array: NamedArray, reps: Mapping[AxisSelector, int]) -> NamedArray:
    """`jnp.tile` by axis: the whole array is repeated `reps[axis]` times along each axis
    named (axes keep their names and grow).

    >>> import meltemi.haliax as hax
    >>> tile(hax.arange(hax.Axis("pos", 3)), {"pos": 2}).array.tolist()
    [0, 1, 2, 0, 1, 2]
    """
    counts = [1] * array.ndim
    for ax, n in reps.items():
        counts[array.axis_index(ax)] = int(n)
    new_axes = tuple(a.resize(a.size * n) for a, n in zip(array.axes, counts, strict=True))
    return NamedArray(jnp.tile(array.array, counts), new_axes)


unflatten = unflatten_axis
"""`unflatten_axis` (the inverse of `flatten_axes`), under the name paired with `flatten`."""
