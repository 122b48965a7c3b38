"""Contraction by axis name: `dot` and `einsum`.

>>> import jax.numpy as jnp
>>> import meltemi.haliax as hax
>>> Batch, In, Out = hax.Axis("batch", 3), hax.Axis("in", 5), hax.Axis("out", 7)
>>> x, w = hax.ones((Batch, In)), hax.ones((Out, In))
>>> hax.dot(x, w, axis=In).axes
(Axis(name='batch', size=3), Axis(name='out', size=7))
>>> hax.einsum("batch in, out in -> out batch", x, w).axes
(Axis(name='out', size=7), Axis(name='batch', size=3))
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from meltemi.haliax._core import (
    Axis,
    AxisError,
    AxisNotFoundError,
    AxisSelection,
    NamedArray,
    _as_tuple,
    _fmt_axes,
    axis_name,
    check_axes_match,
)
from meltemi.haliax._einsum import einsum  # Haliax's einsum (positional sides, `{...}` names)

__all__ = ["dot", "einsum"]

_LETTERS = string.ascii_letters


def _letters_for(arrays: Sequence[NamedArray]) -> tuple[dict[str, str], dict[str, Axis]]:
    letters: dict[str, str] = {}
    axes: dict[str, Axis] = {}
    for arr in arrays:
        for ax in arr.axes:
            if ax.name in axes:
                check_axes_match(axes[ax.name], ax, "dot")
            else:
                if len(letters) >= len(_LETTERS):
                    raise ValueError("dot: more than 52 distinct axes")
                letters[ax.name] = _LETTERS[len(letters)]
                axes[ax.name] = ax
    return letters, axes


def _einsum_raw(arrays, out_names, letters, precision, preferred_element_type, **kw):
    spec = ",".join("".join(letters[a.name] for a in arr.axes) for arr in arrays)
    spec += "->" + "".join(letters[n] for n in out_names)
    return jnp.einsum(
        spec,
        *[a.array for a in arrays],
        precision=precision,
        preferred_element_type=preferred_element_type,
        **kw,
    )


def dot(
    *arrays: NamedArray,
    axis: AxisSelection | None,
    precision: Any = None,
    preferred_element_type: Any = None,
    out_axes: Sequence[Any] | None = None,
    dot_general: Any = None,
) -> NamedArray:
    """Contracts `arrays` over `axis` (a name, an Axis, or several); other axes are kept.

    Axes shared by several arrays but not contracted act as batch axes. The result's axes are
    the kept ones in order of first appearance (or `out_axes`, which may use `...`).
    `axis=None` contracts every axis (a scalar); `axis=()` contracts nothing. `dot_general`
    replaces `jax.lax.dot_general` (e.g. a quantized one, see `hax.quantization`).

    Args:
        *arrays: the operands.
        axis: axes to contract (name, Axis or several); None contracts all, `()` none.
        precision: passed to the matmul.
        preferred_element_type: accumulation/result dtype.
        out_axes: order of the result axes (may use `...`).
        dot_general: replaces `jax.lax.dot_general` (two operands only).

    >>> import meltemi.haliax as hax
    >>> A, B = Axis("a", 2), Axis("b", 3)
    >>> float(dot(hax.ones((A, B)), hax.ones(B), axis=None).scalar())
    6.0
    """
    if not arrays:
        raise ValueError("dot needs at least one array")
    for a in arrays:
        if not isinstance(a, NamedArray):
            raise TypeError(f"dot: expected NamedArrays, got {type(a).__name__}")
    letters, all_axes = _letters_for(arrays)
    if axis is None:
        contract = set(all_axes)
    else:
        contract = set()
        for ax in _as_tuple(axis):
            name = axis_name(ax)
            if name not in all_axes:
                raise AxisNotFoundError(
                    f"dot: axis {name!r} not found in any operand; the operands have axes "
                    + ", ".join(_fmt_axes(a.axes) for a in arrays)
                )
            if isinstance(ax, Axis):
                check_axes_match(ax, all_axes[name], "dot")
            contract.add(name)
    kept = [n for n in all_axes if n not in contract]
    if out_axes is not None:
        kept = _order_out(kept, out_axes)
    if dot_general is not None:
        return _dot_general_2(arrays, contract, kept, all_axes, dot_general, precision)
    out = _einsum_raw(arrays, kept, letters, precision, preferred_element_type)
    return NamedArray(out, tuple(all_axes[n] for n in kept))


def _dot_general_2(arrays, contract, kept, all_axes, dot_general, precision) -> NamedArray:
    """Two-operand contraction through a custom `dot_general` (which may hold arrays, so it
    cannot be a static argument of `jnp.einsum`)."""
    if len(arrays) != 2:
        raise ValueError(f"dot: a custom dot_general takes exactly 2 arrays, got {len(arrays)}")
    a, b = arrays
    a_names, b_names = [x.name for x in a.axes], [x.name for x in b.axes]
    batch = [n for n in a_names if n in b_names and n not in contract]
    con = [n for n in a_names if n in contract and n in b_names]
    only = [n for n in contract if (n in a_names) != (n in b_names)]
    if only:
        raise ValueError(f"dot: with a custom dot_general, contracted axes {only} must be in both")
    dims = (
        ([a_names.index(n) for n in con], [b_names.index(n) for n in con]),
        ([a_names.index(n) for n in batch], [b_names.index(n) for n in batch]),
    )
    out = dot_general(a.array, b.array, dims, precision=precision)
    names = batch + [n for n in a_names if n not in con and n not in batch]
    names += [n for n in b_names if n not in con and n not in batch]
    return NamedArray(out, tuple(all_axes[n] for n in names)).rearrange(kept)


def _order_out(kept: list[str], out_axes: Sequence[Any]) -> list[str]:
    """Orders the result axes by a partial order with `...` slots (Haliax's greedy placement).

    An axis not named in `out_axes` goes into the first `...` slot after the last named axis
    seen so far in `kept`'s order, so `(..., D, H, ...)` over `[H, W, D]` gives `[D, H, W]`.
    """
    explicit = [axis_name(a) for a in out_axes if a is not Ellipsis]
    for n in explicit:
        if n not in kept:
            raise AxisNotFoundError(f"out_axes: axis {n!r} is not in the result axes {kept}")
    if len(set(explicit)) != len(explicit):
        raise AxisError(f"out_axes {explicit} names an axis twice")
    if Ellipsis not in out_axes:
        if set(explicit) != set(kept):
            raise AxisError(f"out_axes {explicit} must list every result axis {kept} (or use ...)")
        return explicit
    slots: list[list[str]] = [[] if a is Ellipsis else [axis_name(a)] for a in out_axes]
    empty = [i for i, a in enumerate(out_axes) if a is Ellipsis]
    target = empty[0]
    for n in kept:
        if n in explicit:
            pos = next(i for i, sl in enumerate(slots) if out_axes[i] is not Ellipsis and sl == [n])
            later = [i for i in empty if i >= max(pos + 1, target)]
            if later:
                target = later[0]
        else:
            slots[target].append(n)
    return [n for sl in slots for n in sl]
