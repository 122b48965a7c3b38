"""`Axis` (a named dimension), axis selections, and the errors about axes.

>>> from meltemi.haliax import Axis, concat_axes
>>> Embed = Axis("embed", 7)
>>> Embed.alias("out"), Embed.resize(3)
(Axis(name='out', size=7), Axis(name='embed', size=3))
>>> concat_axes(Embed, (Axis("pos", 5),))
(Axis(name='embed', size=7), Axis(name='pos', size=5))
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TypeAlias

import numpy as np

__all__ = [
    "Axis",
    "AxisSelection",
    "AxisSelector",
    "AxisSpec",
    "AxisError",
    "AxisNotFoundError",
    "AxisSizeMismatchError",
    "DuplicateAxisError",
    "axis_name",
    "axis_size",
    "selects_axis",
    "check_axes_match",
    "concat_axes",
    "without_axes",
]


@dataclasses.dataclass(frozen=True)
class Axis:
    """A named dimension with a size: `Axis("embed", 4096)`.

    >>> Axis("pos", 13).resize(7)
    Axis(name='pos', size=7)
    """

    name: str
    size: int

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise TypeError(f"Axis name must be a str, got {self.name!r}; e.g. Axis('embed', 8)")
        if not isinstance(self.size, int | np.integer) or isinstance(self.size, bool):
            raise TypeError(
                f"Axis {self.name!r}: size must be an int, got {self.size!r} "
                f"(type {type(self.size).__name__}); e.g. Axis({self.name!r}, 8)"
            )
        if self.size < 0:
            raise ValueError(f"Axis {self.name!r}: size must be >= 0, got {self.size}")
        object.__setattr__(self, "size", int(self.size))

    def alias(self, new_name: str) -> Axis:
        """The same size under another name."""
        return Axis(new_name, self.size)

    def resize(self, size: int) -> Axis:
        """The same name with another size."""
        return Axis(self.name, size)


AxisSelector: TypeAlias = Axis | str
"""An axis given by value or by name."""
AxisSpec: TypeAlias = Axis | Sequence[Axis]
"""One or more axes with sizes."""
AxisSelection: TypeAlias = AxisSelector | Sequence[AxisSelector]
"""One or more axes, given by value or by name."""


class AxisError(ValueError):
    """Base class for errors about axes (a ValueError)."""


class AxisNotFoundError(AxisError, KeyError):
    """An axis was asked for that the array does not have."""

    def __str__(self):  # KeyError would quote the message
        return str(self.args[0])


class AxisSizeMismatchError(AxisError):
    """Two axes with one name have different sizes."""


class DuplicateAxisError(AxisError):
    """An axis name occurs twice where names must be unique."""


def axis_name(ax: AxisSelection) -> str | tuple[str, ...]:
    """The name(s) of an axis selection: `axis_name(Axis("a", 2)) == "a"`."""
    if isinstance(ax, Axis):
        return ax.name
    if isinstance(ax, str):
        return ax
    return tuple(axis_name(a) for a in ax)  # type: ignore[misc]


def _as_tuple(axes: AxisSelection) -> tuple[AxisSelector, ...]:
    if isinstance(axes, Axis | str):
        return (axes,)
    return tuple(axes)


def _fmt_axes(axes: Sequence[Axis]) -> str:
    return "(" + ", ".join(f"{a.name}={a.size}" for a in axes) + ")"


def _check_unique(names: Sequence[str], where: str) -> None:
    seen = set()
    for n in names:
        if n in seen:
            raise DuplicateAxisError(
                f"duplicate axis name {n!r} in {where}: {list(names)}; every axis of an array "
                f"needs its own name (rename one, e.g. Axis({n + '_2'!r}, size))"
            )
        seen.add(n)


def axis_size(ax: AxisSpec) -> int:
    """The product of the sizes of one or more axes."""
    if isinstance(ax, Axis):
        return ax.size
    return math.prod(a.size for a in ax)


def _sizes(axes: AxisSelection | Mapping[str, int | None]) -> dict[str, int | None]:
    if isinstance(axes, Mapping):
        return dict(axes)
    return {axis_name(a): a.size if isinstance(a, Axis) else None for a in _as_tuple(axes)}  # type: ignore[misc]


def selects_axis(selection: AxisSelection, selector: AxisSelection) -> bool:
    """Whether every axis of `selector` (by name, and size where both give one) is in `selection`.

    >>> selects_axis((Axis("a", 2), "b"), ("b", Axis("a", 2))), selects_axis("a", Axis("a", 3))
    (True, True)
    """
    have = _sizes(selection)
    for name, size in _sizes(selector).items():
        if name not in have:
            return False
        if size is not None and have[name] is not None and have[name] != size:
            return False
    return True


def check_axes_match(a: Axis, b: Axis, context: str = "") -> None:
    """Raises AxisSizeMismatchError if `a` and `b` share a name but not a size."""
    if a.name == b.name and a.size != b.size:
        where = f" in {context}" if context else ""
        raise AxisSizeMismatchError(
            f"axis {a.name!r} has size {a.size} in one array and {b.size} in the other{where}; "
            f"axes with one name must have one size (slice or rename one of them)"
        )


def concat_axes(a: AxisSpec, b: AxisSpec) -> tuple[Axis, ...]:
    """`a + b` as tuples of axes; a name in both raises DuplicateAxisError."""
    out = tuple(_as_tuple(a)) + tuple(_as_tuple(b))
    _check_unique([x.name for x in out], "concat_axes")  # type: ignore[union-attr]
    return out  # type: ignore[return-value]


def without_axes(axes: Sequence[Axis], to_remove: AxisSelection) -> tuple[Axis, ...]:
    """`axes` minus the named ones (names not present are ignored)."""
    names = set(axis_name(a) for a in _as_tuple(to_remove))
    return tuple(a for a in axes if a.name not in names)
