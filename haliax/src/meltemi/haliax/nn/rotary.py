"""Rotary position embeddings (RoPE), with Llama-3 frequency scaling.

The layout is Hugging Face's "rotate half": the head dimension is split into two halves that
rotate together (not interleaved pairs), so HF checkpoints load without permuting q/k weights.

>>> import meltemi.haliax as hax
>>> Pos, Head = hax.Axis("pos", 3), hax.Axis("head_size", 4)
>>> q = hax.ones((Pos, Head))
>>> rope = RotaryConfig(theta=10000.0)
>>> rope(q, hax.arange(Pos), Head).axes
(Axis(name='pos', size=3), Axis(name='head_size', size=4))
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from meltemi.haliax._core import Axis, AxisError, AxisSelector, NamedArray, broadcast_to

__all__ = ["Llama3RopeScaling", "RotaryConfig", "rotary_inv_frequencies", "apply_rotary"]


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1's `rope_scaling` (HF `rope_type="llama3"`): long wavelengths are slowed."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self):
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"Llama3RopeScaling: high_freq_factor ({self.high_freq_factor}) must be greater "
                f"than low_freq_factor ({self.low_freq_factor})"
            )

    def scale(self, inv_freq: np.ndarray) -> np.ndarray:
        old = self.original_max_position_embeddings
        low_wavelen = old / self.low_freq_factor
        high_wavelen = old / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / self.factor, inv_freq)
        smooth = (old / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, smoothed, scaled)


def rotary_inv_frequencies(
    head_size: int, theta: float = 10000.0, scaling: Llama3RopeScaling | None = None
) -> np.ndarray:
    """`theta ** (-2i / head_size)` for i < head_size / 2 (float32), scaled if asked."""
    if head_size % 2:
        raise AxisError(f"rotary embeddings need an even head size, got {head_size}")
    inv = 1.0 / (
        theta ** (np.arange(0, head_size, 2, dtype=np.int64).astype(np.float32) / head_size)
    )
    if scaling is not None:
        inv = scaling.scale(inv)
    return inv.astype(np.float32)


def apply_rotary(
    x: NamedArray,
    positions: NamedArray,
    HeadSize: AxisSelector,
    *,
    theta: float = 10000.0,
    scaling: Llama3RopeScaling | None = None,
) -> NamedArray:
    """Rotates `x` along `HeadSize` by angles `positions * inv_freq`.

    `positions` holds integer (or float) positions with axes that `x` also has (e.g. `Pos`, or
    `(Batch, Pos)` for packed sequences); they broadcast by name over the other axes (heads).

    Args:
        x: array with the head-size axis.
        positions: integer positions (a NamedArray).
        HeadSize: the axis rotated (even size).
        theta: RoPE base.
        scaling: Llama3RopeScaling or None.
    """
    Head = x.resolve_axis(HeadSize)
    half = Head.size // 2
    inv = jnp.asarray(rotary_inv_frequencies(Head.size, theta, scaling))
    Half = Axis("__rotary_half__", half)
    angles = broadcast_to(positions.astype(jnp.float32), positions.axes + (Half,)) * NamedArray(
        inv, (Half,)
    )
    cos = NamedArray(jnp.cos(angles.array), angles.axes)
    sin = NamedArray(jnp.sin(angles.array), angles.axes)
    i = x.axis_index(Head)
    arr = x.array
    x1 = jax.lax.slice_in_dim(arr, 0, half, axis=i)
    x2 = jax.lax.slice_in_dim(arr, half, Head.size, axis=i)
    rest = x.axes[:i] + (Half,) + x.axes[i + 1 :]
    n1, n2 = NamedArray(x1, rest), NamedArray(x2, rest)
    cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)
    out1 = n1 * cos - n2 * sin
    out2 = n2 * cos + n1 * sin
    order = [a.name for a in rest]
    o1, o2 = out1.rearrange(order).array, out2.rearrange(order).array
    return NamedArray(jnp.concatenate([o1, o2], axis=i), x.axes)


@dataclasses.dataclass(frozen=True)
class RotaryConfig:
    """RoPE settings; calling it applies `apply_rotary`."""

    theta: float = 10000.0
    scaling: Llama3RopeScaling | None = None

    def __call__(self, x: NamedArray, positions: NamedArray, HeadSize: AxisSelector) -> NamedArray:
        return apply_rotary(x, positions, HeadSize, theta=self.theta, scaling=self.scaling)
