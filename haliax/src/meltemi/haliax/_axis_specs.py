"""Axis-spec arithmetic: make, resolve, replace and remove axes in tuples or `{name: size}` dicts.

>>> import meltemi.haliax as hax
>>> Batch, Pos, Embed = hax.make_axes(batch=3, pos=5, embed=7)
>>> hax.replace_axis((Batch, Pos), "pos", hax.Axis("kv", 11))
(Axis(name='batch', size=3), Axis(name='kv', size=11))
>>> hax.eliminate_axes((Batch, Pos, Embed), ("pos",))
(Axis(name='batch', size=3), Axis(name='embed', size=7))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from meltemi.haliax._axis import (
    Axis,
    AxisError,
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


# --- Haliax's axis-spec helpers (`haliax.axis`): the same behaviour, shorter code. -------------

ShapeDict = Mapping[str, int]
"""`{name: size}`."""
PartialShapeDict = Mapping[str, int | None]
"""`{name: size or None}`."""
PartialAxisSpec = Sequence[Any]
"""Axes (or names) with `...` standing for any others: `("batch", ..., "embed")`."""


def axis_spec_to_shape_dict(axis_spec: Any) -> dict[str, int | None]:
    """`{name: size}` of an Axis, a name, a sequence of them or a dict (None for a bare name).

    >>> axis_spec_to_shape_dict((Axis("a", 3), "b"))
    {'a': 3, 'b': None}
    """
    return _as_dict(axis_spec)


def axis_spec_to_tuple(axis_spec: Any) -> tuple[Any, ...]:
    """The axes of a spec as a tuple (`Axis` where the size is known, else the name)."""
    if isinstance(axis_spec, Mapping):
        return tuple(n if s is None else Axis(n, s) for n, s in axis_spec.items())
    if isinstance(axis_spec, Axis | str):
        return (axis_spec,)
    if isinstance(axis_spec, Sequence):
        return tuple(axis_spec)
    raise TypeError(f"not an axis spec: {axis_spec!r}; give an Axis, a name, a tuple or a dict")


def is_axis_compatible(ax1: AxisSelector, ax2: AxisSelector) -> bool:
    """Whether two axis selectors name the same axis (sizes are not compared)."""
    return axis_name(ax1) == axis_name(ax2)


def _sizes_agree(a: Any, b: Any, name: str, s1: int | None, s2: int | None) -> None:
    if s1 is not None and s2 is not None and s1 != s2:
        raise AxisSizeMismatchError(f"axis {name!r} has size {s1} in {a!r} but {s2} in {b!r}")


def without_axes(
    axis_spec: Any, to_remove: AxisSelection, allow_mismatched_sizes: bool = False
) -> Any:
    """`axis_spec` without the axes in `to_remove`; names not present are ignored.

    An axis present in both with different sizes raises, unless `allow_mismatched_sizes`.
    """
    have = _as_dict(axis_spec)
    for n, s in _as_dict(to_remove).items():
        if n in have:
            if not allow_mismatched_sizes:
                _sizes_agree(axis_spec, to_remove, n, have[n], s)
            del have[n]
    return _like(axis_spec, have)


def union_axes(a1: Any, a2: Any) -> Any:
    """`a1` then the axes of `a2` not in it (a dict if either is one); sizes must agree."""
    out = _as_dict(a1)
    for n, s in _as_dict(a2).items():
        if n in out:
            _sizes_agree(a1, a2, n, out[n], s)
        else:
            out[n] = s
    if isinstance(a1, Mapping) or isinstance(a2, Mapping):
        return out
    return axis_spec_to_tuple(out)


def intersect_axes(ax1: Any, ax2: Any) -> Any:
    """The axes of `ax1` that are also in `ax2`, in `ax1`'s order, with `ax2`'s sizes."""
    have = _as_dict(ax2)
    out: dict[str, int | None] = {}
    for n, s in _as_dict(ax1).items():
        if n in have:
            _sizes_agree(ax1, ax2, n, s, have[n])
            out[n] = have[n]
    return out if isinstance(ax1, Mapping) else axis_spec_to_tuple(out)


def unsize_axes(axis_spec: Any, to_unsize: AxisSelection | None = None) -> Any:
    """`axis_spec` with the sizes of `to_unsize` (all axes when None) dropped, names kept."""
    if to_unsize is None:
        if isinstance(axis_spec, Mapping):
            return {n: None for n in axis_spec}
        if isinstance(axis_spec, Axis | str):
            return axis_name(axis_spec)
        return tuple(axis_name(a) for a in axis_spec)
    have = _as_dict(axis_spec)
    for n in _as_dict(to_unsize):
        if n not in have:
            raise AxisNotFoundError(f"axis {n!r} not found in {axis_spec!r}")
        have[n] = None
    return have if isinstance(axis_spec, Mapping) else axis_spec_to_tuple(have)


def replace_missing_with_ellipsis(ax1: AxisSelection, ax2: AxisSelection) -> tuple[Any, ...]:
    """`ax1` with every axis not in `ax2` replaced by `...` (and `ax2`'s sizes filled in)."""
    have = _as_dict(ax2)
    out: list[Any] = []
    for n, s in _as_dict(ax1).items():
        if n not in have:
            out.append(Ellipsis)
            continue
        _sizes_agree(ax1, ax2, n, s, have[n])
        out.append(n if have[n] is None else Axis(n, have[n]))  # type: ignore[arg-type]
    return tuple(out)


def rearrange_for_partial_order(
    partial_order: PartialAxisSpec, axes: tuple[Any, ...]
) -> tuple[Any, ...]:
    """`axes` reordered to fit `partial_order`, where each `...` stands for any other axes.

    Greedy, as Haliax: axes keep their relative order and an unlisted axis goes into the first
    `...` slot after the last listed axis seen so far.

    >>> rearrange_for_partial_order(("a", ..., "b"), ("b", "a", "c"))
    ('a', 'c', 'b')
    """
    if tuple(partial_order) == (Ellipsis,):
        return tuple(axes)
    spec = _as_dict(axes)

    def as_axis(n: str) -> Any:
        return n if spec[n] is None else Axis(n, spec[n])  # type: ignore[arg-type]

    if Ellipsis not in partial_order:
        names = [axis_name(a) for a in partial_order]
        if sorted(names) != sorted(spec) or len(names) != len(spec):
            raise AxisError(
                f"partial order {tuple(partial_order)!r} has no `...`, so it must list every axis "
                f"of {tuple(axes)!r} once (or add `...` for the others)"
            )
        return tuple(as_axis(n) for n in names)

    listed = [axis_name(a) for a in partial_order if a is not Ellipsis]
    if len(listed) != len(set(listed)):
        raise DuplicateAxisError(f"partial order {tuple(partial_order)!r} lists an axis twice")
    slots: list[list[str]] = [[] if a is Ellipsis else [axis_name(a)] for a in partial_order]

    def first_free(start: int) -> int:
        # the first still empty `...` slot at or after `start` (listed axes' slots never are)
        return next(i for i in range(start, len(slots)) if not slots[i])

    uncovered = set(listed)
    target = first_free(0)
    for ax in axes:
        n = axis_name(ax)
        if n in uncovered:
            uncovered.remove(n)
            pos = next(
                i for i, s in enumerate(slots) if partial_order[i] is not Ellipsis and s == [n]
            )
            try:
                target = first_free(max(pos + 1, target))
            except StopIteration:
                pass  # no empty `...` after it: later axes join the current slot
        elif n in listed:
            raise DuplicateAxisError(f"axis {n!r} occurs twice in {tuple(axes)!r}")
        else:
            slots[target].append(n)
    if uncovered:
        raise AxisNotFoundError(
            f"partial order {tuple(partial_order)!r} names axes {sorted(uncovered)} that are not "
            f"in {tuple(axes)!r}"
        )
    return tuple(as_axis(n) for s in slots for n in s)
