"""Fourier transforms over named axes (`jax.numpy.fft`).

One function per transform; `axis` chooses the axes and lengths:

- `None`: the last axis; a name: that axis; an `Axis`: that axis, transformed at length
  `Axis.size` (zero-padded or cropped) and renamed/resized to it in the output;
- a sequence of those, or a dict `{axis: None | int | Axis}`: an n-dimensional transform over
  them, in that order (None keeps the input length).

>>> import meltemi.haliax as hax
>>> X, Y = hax.make_axes(x=3, y=5)
>>> hax.fft(hax.ones((X, Y)), axis="y").axes
(Axis(name='x', size=3), Axis(name='y', size=5))
>>> hax.rfft(hax.ones((X, Y)), axis="y").shape
{'x': 3, 'y': 3}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp

from meltemi.haliax._core import Axis, AxisError, AxisSelection, NamedArray, axis_name

__all__ = [
    "fft",
    "ifft",
    "rfft",
    "irfft",
    "hfft",
    "ihfft",
    "fftshift",
    "ifftshift",
    "fftfreq",
    "rfftfreq",
]

FftAxis = Any
"""None, an axis name, an Axis, a sequence of them, or a dict {axis: None | int | Axis}."""


def _plan(a: NamedArray, axis: FftAxis) -> list[tuple[int, int | None, Axis | None]]:
    """`(index, length or None, output axis or None)` for each transformed axis, in order."""
    if axis is None:
        return [(a.ndim - 1, None, None)]
    if isinstance(axis, Axis | str):
        items: list[tuple[Any, Any]] = [(axis, axis if isinstance(axis, Axis) else None)]
    elif isinstance(axis, Mapping):
        items = list(axis.items())
    elif isinstance(axis, Sequence):
        items = [(ax, ax if isinstance(ax, Axis) else None) for ax in axis]
    else:
        raise TypeError(
            f"fft axis must be None, a name, an Axis, a sequence or a dict; got {axis!r}"
        )
    out = []
    for key, val in items:
        i = a.axis_index(axis_name(key))  # an Axis key names the axis; its size is the length
        if isinstance(val, Axis):
            out.append((i, val.size, val))
        elif val is None:
            out.append((i, None, None))
        else:
            out.append((i, int(val), a.axes[i].resize(int(val))))
    return out


def _run(a: NamedArray, axis: FftAxis, fn1, fnn) -> NamedArray:
    """Applies `fn1` (one axis) or `fnn` (several); output axes take the result's sizes."""
    plan = _plan(a, axis)
    idx = [i for i, _, _ in plan]
    lengths = [n if n is not None else a.axes[i].size for i, n, _ in plan]
    if len(plan) == 1 and (axis is None or isinstance(axis, Axis | str)):
        raw = fn1(a.array, n=plan[0][1], axis=idx[0])
    else:
        raw = fnn(a.array, s=tuple(lengths), axes=tuple(idx))
    axes = list(a.axes)
    for i, _, new in plan:
        base = new if new is not None else a.axes[i]
        axes[i] = base.resize(raw.shape[i])
    return NamedArray(raw, tuple(axes))


def _norm(fn, norm):
    return lambda arr, **kw: fn(arr, norm=norm, **kw)


def fft(a: NamedArray, axis: FftAxis = None, norm: str | None = None) -> NamedArray:
    """Discrete Fourier transform (`jnp.fft.fft`/`fftn`) over the axes chosen by `axis`."""
    return _run(a, axis, _norm(jnp.fft.fft, norm), _norm(jnp.fft.fftn, norm))


def ifft(a: NamedArray, axis: FftAxis = None, norm: str | None = None) -> NamedArray:
    """Inverse of `fft` (`jnp.fft.ifft`/`ifftn`)."""
    return _run(a, axis, _norm(jnp.fft.ifft, norm), _norm(jnp.fft.ifftn, norm))


def rfft(a: NamedArray, axis: FftAxis = None, norm: str | None = None) -> NamedArray:
    """Real-input FFT; the last transformed axis gets size `n // 2 + 1`."""
    return _run(a, axis, _norm(jnp.fft.rfft, norm), _norm(jnp.fft.rfftn, norm))


def _irfft_axis(a: NamedArray, axis: FftAxis) -> FftAxis:
    """Default output length of the last axis of an inverse real FFT: `2 (m - 1)`."""
    if axis is None:
        last = a.axes[-1]
        return {last.name: 2 * (last.size - 1)}
    if isinstance(axis, str):
        return {axis: 2 * (a.resolve_axis(axis).size - 1)}
    if isinstance(axis, Axis):
        return {axis.name: axis}
    items = list(axis.items()) if isinstance(axis, Mapping) else [(x, None) for x in axis]
    if not items:
        raise AxisError("irfft needs at least one axis")
    key, val = items[-1]
    if val is None and not isinstance(key, Axis):
        items[-1] = (key, 2 * (a.resolve_axis(axis_name(key)).size - 1))
    elif val is None:
        items[-1] = (key, key)
    return dict(items)


def irfft(a: NamedArray, axis: FftAxis = None, norm: str | None = None) -> NamedArray:
    """Inverse of `rfft`; the last axis has length `2 (m - 1)` unless given."""
    axis = _irfft_axis(a, axis)
    return _run(a, axis, _norm(jnp.fft.irfft, norm), _norm(jnp.fft.irfftn, norm))


def _one_axis(axis: FftAxis, what: str) -> FftAxis:
    if isinstance(axis, Mapping):
        if len(axis) != 1:
            raise AxisError(f"{what} transforms one axis; got {list(axis)}")
        ((key, val),) = axis.items()
        if val is None:
            return key
        return val if isinstance(val, Axis) else Axis(axis_name(key), int(val))
    if isinstance(axis, Sequence) and not isinstance(axis, str):
        raise AxisError(f"{what} transforms one axis; got {axis!r}")
    return axis


def hfft(a: NamedArray, axis: FftAxis = None, norm: str | None = None) -> NamedArray:
    """FFT of a Hermitian-symmetric signal (one axis); output length `2 (m - 1)` unless given."""
    axis = _irfft_axis(a, _one_axis(axis, "hfft"))
    return _run_single(a, axis, _norm(jnp.fft.hfft, norm))


def ihfft(a: NamedArray, axis: FftAxis = None, norm: str | None = None) -> NamedArray:
    """Inverse of `hfft` (one axis); output length `n // 2 + 1`."""
    axis = _one_axis(axis, "ihfft")
    return _run(a, axis, _norm(jnp.fft.ihfft, norm), None)


def _run_single(a: NamedArray, axis: Mapping, fn) -> NamedArray:
    ((key, val),) = axis.items()
    ax = val if isinstance(val, Axis) else Axis(axis_name(key), int(val))
    return _run(a, ax, fn, None)


def _shift(fn, x: NamedArray, axes: AxisSelection | None) -> NamedArray:
    if axes is None:
        return NamedArray(fn(x.array), x.axes)
    sel = (axes,) if isinstance(axes, Axis | str) else tuple(axes)
    return NamedArray(fn(x.array, axes=tuple(x.axis_index(s) for s in sel)), x.axes)


def fftshift(x: NamedArray, axes: AxisSelection | None = None) -> NamedArray:
    """Moves the zero-frequency term to the centre of the given axes (all if None)."""
    return _shift(jnp.fft.fftshift, x, axes)


def ifftshift(x: NamedArray, axes: AxisSelection | None = None) -> NamedArray:
    """Inverse of `fftshift`."""
    return _shift(jnp.fft.ifftshift, x, axes)


def fftfreq(axis: Axis, d: float = 1.0) -> NamedArray:
    """Sample frequencies of an `fft` along `axis` (sample spacing `d`)."""
    return NamedArray(jnp.fft.fftfreq(axis.size, d), (axis,))


def rfftfreq(axis: Axis, d: float = 1.0) -> NamedArray:
    """Sample frequencies of an `rfft` of `axis.size` samples; axis size `n // 2 + 1`."""
    return NamedArray(jnp.fft.rfftfreq(axis.size, d), (axis.resize(axis.size // 2 + 1),))
