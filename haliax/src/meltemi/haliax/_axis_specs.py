"""Axis-spec arithmetic: make, resolve, replace and remove axes in tuples or `{name: size}` dicts.

>>> import meltemi.haliax as hax
>>> Batch, Pos, Embed = hax.make_axes(batch=3, pos=5, embed=7)
>>> hax.replace_axis((Batch, Pos), "pos", hax.Axis("kv", 11))
(Axis(name='batch', size=3), Axis(name='kv', size=11))
>>> hax.eliminate_axes((Batch, Pos, Embed), ("pos",))
(Axis(name='batch', size=3), Axis(name='embed', size=7))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meltemi.haliax._core import (
    Axis,
    AxisNotFoundError,
    AxisSelection,
    AxisSelector,
    AxisSizeMismatchError,
    DuplicateAxisError,
    axis_name,
    concat_axes,
)

__all__ = ["make_axes", "resolve_axis", "replace_axis", "eliminate_axes", "concat_axis_specs"]


def make_axes(**sizes: int) -> tuple[Axis, ...]:
    """One Axis per keyword, in order: `Batch, Embed = make_axes(batch=3, embed=5)`."""
    return tuple(Axis(name, size) for name, size in sizes.items())


def _as_dict(spec: Any) -> dict[str, int | None]:
    """`{name: size}` (None for a bare name) of an Axis, a name, a sequence of them, or a dict."""
    if isinstance(spec, Axis):
        return {spec.name: spec.size}
    if isinstance(spec, str):
        return {spec: None}
    if isinstance(spec, Mapping):
        return dict(spec)
    out: dict[str, int | None] = {}
    for a in spec:
        if not isinstance(a, Axis | str):
            raise TypeError(f"expected an Axis or an axis name, got {a!r}")
        n = axis_name(a)
        if n in out:
            raise DuplicateAxisError(f"axis {n!r} occurs twice in {spec!r}")
        out[n] = a.size if isinstance(a, Axis) else None  # type: ignore[assignment]
    return out


def _like(spec: Any, d: Mapping[str, int | None]) -> Any:
    """`d` in the form of `spec`: a dict for a dict, else a tuple of Axis (or names)."""
    if isinstance(spec, Mapping):
        return dict(d)
    return tuple(n if s is None else Axis(n, s) for n, s in d.items())


def _check_size(spec: Any, name: str, have: int | None, want: int | None) -> None:
    if have is not None and want is not None and have != want:
        raise AxisSizeMismatchError(
            f"axis {name!r} has size {have} in {spec!r} but {want} was asked for"
        )


def resolve_axis(axis_spec: Any, axis_selection: AxisSelection) -> Any:
    """The Axis (or axes) of `axis_spec` named by `axis_selection`, with their sizes.

    >>> resolve_axis((Axis("a", 3), Axis("b", 5)), "b")
    Axis(name='b', size=5)
    """
    have = _as_dict(axis_spec)
    single = isinstance(axis_selection, Axis | str)
    want = _as_dict(axis_selection)
    out: dict[str, int | None] = {}
    for n, size in want.items():
        if n not in have:
            raise AxisNotFoundError(f"axis {n!r} not found in {axis_spec!r}")
        _check_size(axis_spec, n, have[n], size)
        out[n] = have[n]
    if single:
        ((n, s),) = out.items()
        return Axis(n, s) if s is not None else n  # type: ignore[arg-type]
    return _like(axis_selection, out)


def replace_axis(axis_spec: Any, old: AxisSelector, new: AxisSelection) -> Any:
    """`axis_spec` with the axis `old` replaced, in place, by the axis or axes `new`."""
    have = _as_dict(axis_spec)
    old_name = axis_name(old)
    if old_name not in have:
        raise AxisNotFoundError(f"axis {old_name!r} not found in {axis_spec!r}")
    if isinstance(old, Axis):
        _check_size(axis_spec, old_name, have[old_name], old.size)
    out: dict[str, int | None] = {}
    for n, s in have.items():
        if n != old_name:
            out[n] = s
            continue
        for nn, ns in _as_dict(new).items():
            if nn in have and nn != old_name:
                raise DuplicateAxisError(
                    f"replace_axis: {nn!r} is already in {axis_spec!r}; replacing {old_name!r} "
                    f"with it would name two axes {nn!r}"
                )
            out[nn] = ns
    return _like(axis_spec, out)


def eliminate_axes(axis_spec: Any, to_remove: AxisSelection) -> Any:
    """`axis_spec` without the axes in `to_remove`; each must be present (see `without_axes`)."""
    have = _as_dict(axis_spec)
    for n, s in _as_dict(to_remove).items():
        if n not in have:
            raise AxisNotFoundError(f"axis {n!r} not found in {axis_spec!r}")
        _check_size(axis_spec, n, have[n], s)
        del have[n]
    return _like(axis_spec, have)


concat_axis_specs = concat_axes
"""Haliax's name for `concat_axes`."""
