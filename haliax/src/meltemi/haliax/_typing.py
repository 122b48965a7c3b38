"""Axis annotations for NamedArray types: `NamedArray["batch ... embed"]`, `Named[NamedArray, ...]`.

An annotation is `Annotated[NamedArray, NamedArrayAxes(...)]`; `x.matches_axes(spec)` checks an
array against it at run time.

>>> import meltemi.haliax as hax
>>> hax.NamedArray["batch ... embed"]
typing.Annotated[meltemi.haliax._core.NamedArray, NamedArray[batch ... embed]]
>>> hax.ones((hax.Axis("batch", 3), hax.Axis("pos", 5), hax.Axis("embed", 7))).matches_axes(
...     "batch ... embed")
True
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

__all__ = [
    "DTypeCategory",
    "NamedArrayAxes",
    "NamedArrayAxesSpec",
    "parse_axes_spec",
    "Named",
    "ReductionFunction",
    "SimpleReductionFunction",
]


@dataclasses.dataclass(frozen=True)
class DTypeCategory:
    """A dtype category for annotations (`Float`, `Int`): any dtype under `category` matches."""

    name: str
    category: Any

    def __str__(self) -> str:
        return self.name


@dataclasses.dataclass(frozen=True)
class NamedArrayAxes:
    """The axis names an annotated NamedArray must have.

    `before` names come first (in order when `ordered`), `after` names last; with `subset`,
    any other axes may sit between them (the `...`). `dtype` optionally pins the dtype.
    """

    before: tuple[str, ...]
    after: tuple[str, ...] = ()
    ordered: bool = True
    subset: bool = False
    dtype: Any = None

    def __repr__(self) -> str:
        if self.ordered:
            parts = [*self.before, *(["..."] if self.subset else []), *self.after]
            return f"NamedArray[{' '.join(parts)}]"
        parts = [*self.before, *(["..."] if self.subset else [])]
        return "NamedArray[{" + ", ".join(parts) + "}]"

    def matches(self, names: Sequence[str], dtype: Any = None) -> bool:
        """Whether an array with these axis names (and dtype) fits the annotation."""
        if self.dtype is not None and dtype is not None:
            want = self.dtype.category if isinstance(self.dtype, DTypeCategory) else self.dtype
            if not np.issubdtype(dtype, want):
                return False
        names = tuple(names)
        if not self.ordered:
            want = set(self.before)
            return want <= set(names) if self.subset else want == set(names)
        if not self.subset:
            return names == self.before
        n_b, n_a = len(self.before), len(self.after)
        return (
            len(names) >= n_b + n_a
            and names[:n_b] == self.before
            and (n_a == 0 or names[-n_a:] == self.after)
        )


NamedArrayAxesSpec = NamedArrayAxes | str | Sequence[Any] | set[Any]
"""`"a b ... c"`, `("a", ..., "c")`, `{"a", "b"}` (any order) or a NamedArrayAxes."""


def _names(parts: Sequence[Any]) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
    before: list[str] = []
    after: list[str] = []
    cur, subset = before, False
    for p in parts:
        if p is Ellipsis or p == "...":
            if subset:
                raise TypeError(f"only one `...` is allowed in an axes annotation, got {parts!r}")
            subset, cur = True, after
        elif isinstance(p, str):
            cur.append(p)
        else:
            raise TypeError(f"axes annotation parts must be names or `...`, got {p!r}")
    return tuple(before), tuple(after), subset


def parse_axes_spec(spec: Any) -> NamedArrayAxes:
    """The NamedArrayAxes of an annotation (a string, a sequence, a set, or an `Annotated`)."""
    if typing.get_origin(spec) is typing.Annotated:
        spec = typing.get_args(spec)[1]
    if isinstance(spec, NamedArrayAxes):
        return spec
    if isinstance(spec, str):
        before, after, subset = _names(spec.split())
        return NamedArrayAxes(before, after, ordered=True, subset=subset)
    if isinstance(spec, set | frozenset):
        before, _, subset = _names(sorted(spec, key=lambda p: (p is Ellipsis, str(p))))
        return NamedArrayAxes(before, (), ordered=False, subset=subset)
    if isinstance(spec, tuple | list):
        before, after, subset = _names(spec)
        return NamedArrayAxes(before, after, ordered=True, subset=subset)
    raise TypeError(f"not an axes annotation: {spec!r}; use e.g. 'batch ... embed'")


class Named:
    """`Named[NamedArray, "batch embed"]` is `Annotated[NamedArray, NamedArrayAxes(...)]`."""

    def __class_getitem__(cls, item: tuple[Any, Any]) -> Any:
        base, spec = item
        return typing.Annotated[base, parse_axes_spec(spec)]


class ReductionFunction(Protocol):
    """The signature of `hax.sum`, `hax.mean`, ...: `f(array, axis=None, where=None, **kw)`."""

    def __call__(self, array: Any, axis: Any = None, where: Any = None, **kwargs: Any) -> Any: ...


class SimpleReductionFunction(Protocol):
    """The signature of `hax.argmax`-like reductions: `f(array, axis=None, **kw)`."""

    def __call__(self, array: Any, axis: Any = None, **kwargs: Any) -> Any: ...
