"""Haliax's pattern grammar for `rearrange` and `einsum` strings, parsed into captures.

A side is ordered (`a (b c) ... d`) or unordered (`{a b (c: d e)}`); a capture is a name, a
group `(a b)` or a bound group `(name: a b)`, and `...` stands for the axes not named. Names
are identifiers or quoted strings (`"b c"`). Errors point at the offending character.

>>> lhs, rhs = parse_rearrangement("b (h: x y) -> {b h}")
>>> [c.axes for c in lhs.captures], lhs.is_ordered, rhs.is_ordered
([('b',), ('x', 'y')], True, False)
>>> [len(s.captures) for s in parse_einsum("a b, b c -> a c")[0]]
[2, 2]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from types import EllipsisType
from typing import NoReturn

__all__ = ["AxisCapture", "Expression", "parse_einsum", "parse_rearrangement"]


@dataclasses.dataclass(frozen=True)
class AxisCapture:
    """A name or a group: `binding` is the group's name (`(q: a b)`) or the single axis name."""

    binding: str | None = None
    axes: tuple[str, ...] = ()
    char_range: tuple[int, int] | None = None

    def __post_init__(self):
        if not self.axes:
            raise ValueError("a capture needs at least one axis name")


@dataclasses.dataclass(frozen=True)
class Expression:
    """One side of a pattern: its captures (or `...`) and whether their order matters."""

    captures: Sequence[AxisCapture | EllipsisType]
    is_ordered: bool


def _fail(message: str, text: str, pos: int) -> NoReturn:
    raise ValueError(f"Error while parsing:\n    {text}\n    {' ' * pos}^\n{message}")


def _is_ident_char(c: str) -> bool:
    return c.isalnum() or c == "_"


def _quoted(text: str, pos: int) -> tuple[str, int]:
    quote, pos, out = text[pos], pos + 1, []
    while pos < len(text) and text[pos] != quote:
        if text[pos] == "\\":
            pos += 1
            if pos >= len(text):
                _fail(f"Unexpected end of string at position {pos}", text, pos)
        out.append(text[pos])
        pos += 1
    pos += 1  # the closing quote
    if not out:
        _fail("Empty strings are not valid identifiers", text, pos)
    return "".join(out), pos


def _ident(text: str, pos: int) -> tuple[str, int]:
    if text[pos] in "'\"":
        return _quoted(text, pos)
    start = pos
    if text[pos].isdigit():
        _fail("Identifiers cannot start with a number", text, pos)
    while pos < len(text) and _is_ident_char(text[pos]):
        pos += 1
    if pos == start:
        _fail("Identifier expected", text, pos)
    return text[start:pos], pos


def _group(text: str, pos: int) -> tuple[AxisCapture, int]:
    """`(a b)` or `(name: a b)`; one level of nesting only."""
    start, pos = pos, pos + 1
    binding: str | None = None
    axes: list[str] = []
    while pos < len(text) and text[pos] != ")":
        c = text[pos]
        if c.isspace():
            pos += 1
        elif c == ":":
            if binding is not None:
                _fail("Only one binding allowed per group", text, pos)
            if len(axes) != 1:
                _fail(
                    "Binding must come before axes" if axes else "Binding cannot be empty",
                    text,
                    pos,
                )
            binding, axes, pos = axes[0], [], pos + 1
        elif c == "(":
            _fail("Only one level of nesting is allowed", text, pos)
        elif c == "}":
            raise ValueError(f"Unexpected }} at {pos}")
        elif _is_ident_char(c) or c in "'\"":
            name, pos = _ident(text, pos)
            axes.append(name)
        else:
            _fail(f"Unexpected character {c}", text, pos)
    pos += 1  # the closing parenthesis (or the end of the string)
    if not axes:
        _fail("No axes found", text, start)
    return AxisCapture(binding, tuple(axes), (start, pos)), pos


def _side(text: str, pos: int) -> tuple[Expression, int]:
    """One side, up to `->`, a top-level `,` or the end."""
    captures: list[AxisCapture | EllipsisType] = []
    ordered, started, closed = True, False, False
    while pos < len(text):
        c = text[pos]
        if c.isspace():
            pos += 1
        elif c == "{":
            if started:
                _fail("Unexpected {", text, pos)
            started, ordered, pos = True, False, pos + 1
        elif c == "}":
            if ordered:
                _fail("Unexpected }", text, pos)
            closed, pos = True, pos + 1
        elif c == "(":
            if closed:
                _fail("Unexpected ( after }", text, pos)
            started = True
            capture, pos = _group(text, pos)
            captures.append(capture)
        elif text.startswith("...", pos):
            if closed:
                _fail("Unexpected ... after }", text, pos)
            started = True
            captures.append(Ellipsis)
            pos += 3
        elif c == "-":
            if pos + 1 >= len(text):
                _fail("Unexpected end of string", text, pos)
            if text[pos + 1] != ">":
                _fail("Expected >", text, pos)
            break
        elif c == ",":
            if ordered:
                break
            pos += 1  # inside `{...}` a comma separates names like a space
        else:
            if closed:
                _fail("Unexpected character after }", text, pos)
            name, end = _ident(text, pos)
            captures.append(AxisCapture(name, (name,), (pos, end)))
            started, pos = True, end
    if not ordered and not closed:
        _fail("Expected }", text, pos)
    return Expression(captures, ordered), pos


def parse_rearrangement(expression: str) -> tuple[Expression, Expression]:
    """The two sides of `"lhs -> rhs"`."""
    lhs, pos = _side(expression, 0)
    if pos + 2 >= len(expression):
        _fail("Unexpected end of string", expression, pos)
    if not expression.startswith("->", pos):
        _fail("Expected ->", expression, pos)
    rhs, pos = _side(expression, pos + 2)
    if pos != len(expression):
        _fail("Unexpected character", expression, pos)
    return lhs, rhs


def parse_einsum(expression: str) -> tuple[list[Expression], Expression]:
    """The operand sides and the result side of `"a b, b c -> a c"` (`->` may be missing)."""
    pos, lhses = 0, []
    while pos < len(expression):
        lhs, pos = _side(expression, pos)
        lhses.append(lhs)
        if pos >= len(expression):
            break
        if expression[pos] == ",":
            pos += 1
            continue
        if expression.startswith("->", pos):
            pos += 2
            break
        _fail("Expected , or ->", expression, pos)
    rhs, pos = _side(expression, pos)
    if pos != len(expression):
        _fail("Unexpected character", expression, pos)
    return lhses, rhs
