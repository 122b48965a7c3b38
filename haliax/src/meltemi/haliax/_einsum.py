"""Haliax's `einsum`: Einstein summation over named arrays, in its three forms.

- **positional** `"h w d, d w h -> h w"`: one ordered side per operand; the identifiers are
  variables bound to the operand's axes by position (`...` stands for the unnamed ones), as in
  `jnp.einsum`, and the result keeps the bound axes' real names;
- **named** `"{Height Depth} -> Width"`: names (or keyword aliases) of axes; axes named only on
  the left are contracted, every other axis is kept; with `...` on the left only the axes on
  the right are kept;
- **output only** `"-> Height Width"`: keep the listed axes, contract every other one.

Keyword arguments alias identifiers to axes (`einsum("{x} -> y", a, x=Embed, y=Mlp)`); an alias
given as an `Axis` also checks the size; an alias that the equation does not use is an error.

>>> import meltemi.haliax as hax
>>> H, W, D = hax.make_axes(H=2, W=3, D=4)
>>> a, b = hax.ones((H, W, D)), hax.ones((D, W, H))
>>> einsum("h w d, d w h -> h w", a, b).axes == (H, W), einsum("{D} -> ", a, b).axes == (H, W)
(True, True)
>>> einsum("-> D ... W", a, b).axes == (D, H, W)
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp

from meltemi.haliax._axis_specs import (
    axis_spec_to_tuple,
    rearrange_for_partial_order,
    union_axes,
)
from meltemi.haliax._core import Axis, AxisSelector, NamedArray, axis_name
from meltemi.haliax._parsing import AxisCapture, Expression, parse_einsum

__all__ = ["einsum"]


def _err(message: str, equation: str) -> ValueError:
    return ValueError(f"einsum {equation!r}: {message}")


def _single_name(capture: AxisCapture, equation: str, where: str = "") -> str:
    if len(capture.axes) != 1 or (capture.binding not in (None, capture.axes[0])):
        raise _err(f"Parenthesized axes are not currently supported{where}", equation)
    return capture.axes[0]


def _all_axes(arrays: Sequence[NamedArray]) -> tuple[Axis, ...]:
    out: tuple[Any, ...] = ()
    for a in arrays:
        out = union_axes(out, a.axes)
    return axis_spec_to_tuple(out)


class _Letters:
    """Assigns `jnp.einsum` letters to names (the name's initial when still free)."""

    def __init__(self):
        self.of: dict[str, str] = {}

    def __call__(self, name: str) -> str:
        if name not in self.of:
            used = set(self.of.values())
            first = name[0] if name[0].isalpha() and name[0].isascii() else "a"
            free = [
                c for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in used
            ]
            if not free:
                raise ValueError("einsum: more than 52 distinct axes")
            self.of[name] = first if first not in used else free[0]
        return self.of[name]


def _spec_by_name(arrays: Sequence[NamedArray], out_axes: Sequence[AxisSelector]) -> str:
    letter = _Letters()
    ins = ["".join(letter(a.name) for a in x.axes) for x in arrays]
    return ",".join(ins) + "->" + "".join(letter(axis_name(a)) for a in out_axes)  # type: ignore[arg-type]


def _check_unused(aliases: Mapping[str, Any], used: set[str], equation: str) -> None:
    unused = [a for a in aliases if a not in used]
    if unused:
        raise _err(f"Unused aliases from kwargs: {', '.join(unused)}", equation)


def _output_only(equation, arrays, rhs: Expression, aliases):
    inputs = _all_axes(arrays)
    by_name = {a.name: a for a in inputs}
    out: list[Any] = []
    used_aliases: set[str] = set()
    for c in rhs.captures:
        if c is Ellipsis:
            out.append(Ellipsis)
            continue
        name = _single_name(c, equation, " in the output of an einsum")
        if name in aliases:
            used_aliases.add(name)
            alias = aliases[name]
            name = axis_name(alias)
            if name not in by_name:
                raise _err(f"Axis {name} not found in any of the input arrays", equation)
            if isinstance(alias, Axis) and by_name[name].size != alias.size:
                raise _err(
                    f"Size mismatch for axis {name}: the arrays have size {by_name[name].size} "
                    f"but the alias gives {alias}",
                    equation,
                )
        if name in out:
            raise _err(f"Axis {name} occurs multiple times on the rhs", equation)
        if name not in by_name:
            raise _err(f"Axis {name} not found in any of the input arrays", equation)
        out.append(name)
    _check_unused(aliases, used_aliases, equation)
    if Ellipsis in out:
        i = out.index(Ellipsis)
        rest = [a.name for a in inputs if a.name not in out]
        out = out[:i] + rest + [n for n in out[i + 1 :] if n is not Ellipsis]
    return tuple(by_name[n] for n in out)


def _names(equation, side: Expression, aliases, used: set[str]) -> list[Any]:
    out: list[Any] = []
    for c in side.captures:
        if c is Ellipsis:
            out.append(Ellipsis)
            continue
        name = _single_name(c, equation)
        if name in aliases:
            used.add(name)
            name = axis_name(aliases[name])
        out.append(name)
    return out


def _unordered(equation, arrays, lhs: Expression, rhs: Expression, aliases):
    used: set[str] = set()
    left = _names(equation, lhs, aliases, used)
    right = _names(equation, rhs, aliases, used)
    for a in aliases:
        if a not in used:
            raise _err(f"Axis alias {a} not used in the einsum", equation)
    inputs = _all_axes(arrays)
    by_name = {a.name: a for a in inputs}
    for n in [*left, *right]:
        if n is not Ellipsis and n not in by_name:
            raise _err(f"Axis {n} not present in the input arrays {inputs}", equation)
    if Ellipsis in right:
        out = rearrange_for_partial_order(right, tuple(a.name for a in inputs))
    elif Ellipsis in left:
        out = tuple(right)
    else:
        contracted = {n for n in left if n not in right}
        kept = tuple(a.name for a in inputs if a.name not in contracted)
        out = rearrange_for_partial_order([Ellipsis, *right], kept)
    return tuple(by_name[n] for n in out)


def _positional(equation, arrays, lhses: Sequence[Expression], rhs: Expression, aliases):
    if len(lhses) != len(arrays):
        raise _err(
            f"Number of lhses ({len(lhses)}) does not match number of arrays ({len(arrays)})",
            equation,
        )
    bound: dict[str, Axis] = {}
    used: set[str] = set()
    letter = _Letters()

    def bind(name: str, ax: Axis) -> str:
        if name in aliases:
            used.add(name)
            want = aliases[name]
            if axis_name(want) != ax.name or (isinstance(want, Axis) and want != ax):
                raise _err(f"alias {name}={want!r} but the operand's axis there is {ax}", equation)
        if name in bound and bound[name] != ax:
            raise _err(f"{name} is bound to both {bound[name]} and {ax}", equation)
        bound[name] = ax
        return letter(name)

    specs = []
    for lhs, a in zip(lhses, arrays, strict=True):
        caps = list(lhs.captures)
        if caps.count(Ellipsis) > 1:
            raise _err("Can't have two ellipses in an einsum", equation)
        if Ellipsis in caps:
            i = caps.index(Ellipsis)
            head, tail = caps[:i], caps[i + 1 :]
            if len(head) + len(tail) > len(a.axes):
                raise _err(f"Mismatched number of axes in einsum: {a.axes} for {lhs}", equation)
            axes_head, axes_tail = a.axes[: len(head)], a.axes[len(a.axes) - len(tail) :]
        else:
            head, tail = caps, []
            if len(head) != len(a.axes):
                raise _err(f"Mismatched number of axes in einsum: {a.axes} for {lhs}", equation)
            axes_head, axes_tail = a.axes, ()
        s = "".join(
            bind(_single_name(c, equation), ax) for c, ax in zip(head, axes_head, strict=True)
        )
        if Ellipsis in caps:
            s += "..."
        s += "".join(
            bind(_single_name(c, equation), ax) for c, ax in zip(tail, axes_tail, strict=True)
        )
        specs.append(s)

    out: list[Any] = []
    out_spec = ""
    for c in rhs.captures:
        if c is Ellipsis:
            if Ellipsis in out:
                raise _err("Can't have two ellipses in an ordered einsum", equation)
            out.append(Ellipsis)
            out_spec += "..."
            continue
        name = _single_name(c, equation, " in the output of an einsum")
        if name not in bound:
            raise _err(f"Axis name {name} does not occur on the left hand side", equation)
        out.append(bound[name])
        out_spec += letter(name)
    _check_unused(aliases, used, equation)
    if Ellipsis in out:
        named = {a.name for a in out if a is not Ellipsis}
        contracted = {ax.name for ax in bound.values()} - named
        rest = [a for a in _all_axes(arrays) if a.name not in named and a.name not in contracted]
        i = out.index(Ellipsis)
        out = out[:i] + rest + out[i + 1 :]
    return ",".join(specs) + "->" + out_spec, tuple(out)


def einsum(
    equation: str,
    *arrays: NamedArray,
    precision: Any = None,
    preferred_element_type: Any = None,
    **axis_aliases: AxisSelector,
) -> NamedArray:
    """Haliax's named Einstein summation (see the module docstring for the three forms).

    Args:
      equation: the pattern, e.g. `"b h w c, c e -> b h w e"`, `"{c} -> ..."` or `"-> b e"`.
      *arrays: the operands.
      precision: passed to `jnp.einsum`.
      preferred_element_type: passed to `jnp.einsum`.
      **axis_aliases: identifiers of the equation mapped to axes (or axis names).
    """
    for a in arrays:
        if not isinstance(a, NamedArray):
            raise TypeError(f"einsum: expected NamedArrays, got {type(a).__name__}")
    lhses, rhs = parse_einsum(equation)
    if len(lhses) == 1 and not lhses[0].captures and lhses[0].is_ordered:
        out_axes = _output_only(equation, arrays, rhs, axis_aliases)
        spec = _spec_by_name(arrays, out_axes)
    elif len(lhses) == 1 and not lhses[0].is_ordered:
        out_axes = _unordered(equation, arrays, lhses[0], rhs, axis_aliases)
        spec = _spec_by_name(arrays, out_axes)
    else:
        if any(not lhs.is_ordered for lhs in lhses):
            raise _err("Cannot have multiple unordered axes in an einsum", equation)
        spec, out_axes = _positional(equation, arrays, lhses, rhs, axis_aliases)
    raw = jnp.einsum(
        spec,
        *(a.array for a in arrays),
        precision=precision,
        preferred_element_type=preferred_element_type,
    )
    return NamedArray(raw, tuple(out_axes))
