"""Max, min and mean pooling over named window axes (`lax.reduce_window`).

The window is given as axes: `Window=(Axis("h", 3), Axis("w", 3))` pools 3x3 windows over the
input axes named `h` and `w`; the other axes are untouched. Pooled axes keep their names and get
the pooled sizes.

>>> import meltemi.haliax as hax
>>> x = hax.arange(hax.Axis("t", 7)).astype(float)
>>> hax.nn.max_pool(hax.Axis("t", 3), x, stride=2).array
Array([2., 4., 6.], dtype=float32)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp

from meltemi.haliax._core import AxisSpec, NamedArray, _as_tuple

__all__ = ["max_pool", "min_pool", "mean_pool", "Padding", "DEFAULT_PADDING"]

Padding = Literal["SAME", "VALID"] | int | Sequence[tuple[int, int]]
"""`"SAME"`, `"VALID"`, one int for every side, or one `(low, high)` pair per window axis."""
DEFAULT_PADDING: Literal["VALID"] = "VALID"


def _per_axis(value: Any, n: int, what: str) -> tuple[Any, ...]:
    vals = (value,) * n if isinstance(value, int) else tuple(value)
    if len(vals) != n:
        raise ValueError(f"{what}: expected 1 or {n} values (one per window axis), got {vals!r}")
    return vals


def _plan(
    Window: AxisSpec,
    x: NamedArray,
    stride: int | Sequence[int] | None,
    padding: Padding,
    use_ceil: bool,
):
    """Window dims, strides and padding in `x`'s axis order."""
    window = {a.name: a.size for a in _as_tuple(Window)}  # type: ignore[union-attr]
    for name in window:
        x.axis_index(name)
    names = list(window)
    strides = dict(zip(names, _per_axis(1 if stride is None else stride, len(names), "stride")))
    if isinstance(padding, str):
        mode = padding.upper()
        if mode not in ("SAME", "VALID"):
            raise ValueError(f"padding must be 'SAME', 'VALID', an int or pairs, got {padding!r}")
        if mode == "SAME" or not use_ceil:
            dims = tuple(window.get(a.name, 1) for a in x.axes)
            return dims, tuple(strides.get(a.name, 1) for a in x.axes), mode
        pads = dict.fromkeys(names, (0, 0))
    else:
        pairs = _per_axis(padding, len(names), "padding")
        pads = {n: (p, p) if isinstance(p, int) else tuple(p) for n, p in zip(names, pairs)}
    if use_ceil:  # extend the high side so a last partial window (starting inside) is kept
        for n in names:
            size, k, s = x.resolve_axis(n).size, window[n], strides[n]
            lo, hi = pads[n]
            out = math.ceil((size + lo + hi - k) / s) + 1
            if (out - 1) * s >= size + lo:
                out -= 1
            pads[n] = (lo, hi + max(0, (out - 1) * s + k - (size + lo + hi)))
    dims = tuple(window.get(a.name, 1) for a in x.axes)
    return (
        dims,
        tuple(strides.get(a.name, 1) for a in x.axes),
        [pads.get(a.name, (0, 0)) for a in x.axes],
    )


def _extreme(dtype: Any, lowest: bool) -> Any:
    """The identity of max (`lowest`) or min pooling: -/+inf for floats, the integer bounds else."""
    if jnp.issubdtype(dtype, jnp.inexact):
        return -jnp.inf if lowest else jnp.inf
    if jnp.issubdtype(dtype, jnp.bool_):
        return not lowest
    info = jnp.iinfo(dtype)
    return info.min if lowest else info.max


def _pool(Window, x, init, op: Callable, stride, padding, use_ceil) -> NamedArray:
    dims, strides, pads = _plan(Window, x, stride, padding, use_ceil)
    out = jax.lax.reduce_window(x.array, jnp.asarray(init, x.dtype), op, dims, strides, pads)
    return NamedArray(out, tuple(a.resize(s) for a, s in zip(x.axes, out.shape)))


def max_pool(
    Window: AxisSpec,
    inputs: NamedArray,
    stride: int | Sequence[int] | None = None,
    padding: Padding = DEFAULT_PADDING,
    use_ceil: bool = False,
) -> NamedArray:
    """Maximum over each window.

    Args:
        Window: the window, as axes of the input with the window sizes.
        inputs: the array to pool.
        stride: step between windows, one int or one per window axis (default 1).
        padding: `"VALID"` (default), `"SAME"`, an int, or `(low, high)` per window axis.
        use_ceil: round the output size up (a last partial window is kept), as PyTorch's
            `ceil_mode`.

    Returns:
        The pooled array; window axes keep their names with the pooled sizes.
    """
    return _pool(
        Window, inputs, _extreme(inputs.dtype, True), jax.lax.max, stride, padding, use_ceil
    )


def min_pool(
    Window: AxisSpec,
    inputs: NamedArray,
    stride: int | Sequence[int] | None = None,
    padding: Padding = DEFAULT_PADDING,
    use_ceil: bool = False,
) -> NamedArray:
    """Minimum over each window (arguments as `max_pool`).

    Args:
        Window: the window, as axes of the input with the window sizes.
        inputs: the array to pool.
        stride: step between windows (default 1).
        padding: `"VALID"` (default), `"SAME"`, an int, or `(low, high)` per window axis.
        use_ceil: round the output size up.

    Returns:
        The pooled array.
    """
    return _pool(
        Window, inputs, _extreme(inputs.dtype, False), jax.lax.min, stride, padding, use_ceil
    )


def mean_pool(
    Window: AxisSpec,
    inputs: NamedArray,
    stride: int | Sequence[int] | None = None,
    padding: Padding = DEFAULT_PADDING,
    *,
    use_ceil: bool = False,
    count_include_pad: bool = False,
) -> NamedArray:
    """Mean over each window.

    Args:
        Window: the window, as axes of the input with the window sizes.
        inputs: the array to pool.
        stride: step between windows (default 1).
        padding: `"VALID"` (default), `"SAME"`, an int, or `(low, high)` per window axis.
        use_ceil: round the output size up.
        count_include_pad: divide by the full window size (padding counts as zeros) instead of
            by the number of input elements in the window.

    Returns:
        The pooled array.
    """
    total = _pool(Window, inputs, 0, jax.lax.add, stride, padding, use_ceil)
    if count_include_pad:
        size = math.prod(a.size for a in _as_tuple(Window))  # type: ignore[union-attr]
        return total / size
    ones = NamedArray(jnp.ones_like(inputs.array), inputs.axes)
    count = _pool(Window, ones, 0, jax.lax.add, stride, padding, use_ceil)
    return total / count
