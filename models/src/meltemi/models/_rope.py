"""Rotary position embeddings with every Hugging Face scaling (`modeling_rope_utils.py`).

`Rotary(config.rope, head_size)` is what each attention layer calls on its queries and keys:
`rotary(x, positions, "head_size")`. The inverse frequencies follow `transformers` exactly:

| `RopeConfig.scaling` | inverse frequencies | cos/sin scale |
|---|---|---|
| `default` | `theta ** (-2i / d)` | 1 |
| `linear` | default `/ factor` | 1 |
| `dynamic` | default, `theta` grown past `original_max_position` (NTK) | 1 |
| `yarn` | ramp between interpolated and extrapolated (`beta_fast/slow`) | `attention_factor` |
| `llama3` | long wavelengths slowed by `llama3_factor`, smoothly | 1 |
| `longrope` | `short_factor` / `long_factor` per frequency, by length | `attention_factor` |

The default `attention_factor` is `0.1 ln(factor) + 1` for YaRN (or from `mscale`,
`mscale_all_dim`) and `sqrt(1 + ln(factor) / ln(original_max_position))` for LongRoPE.
`d` is the rotated size, `int(head_size * partial_rotary_factor)`: only the first `d` entries
of each head are rotated (rotate-half layout), the rest pass through, as in Phi-3 / GPT-NeoX.
`dynamic` and `longrope` depend on the longest position in the call (`max(positions) + 1`),
as `transformers` computes them per forward pass.

>>> import meltemi.haliax as hax
>>> from meltemi.models._config import RopeConfig
>>> rope = Rotary(RopeConfig(scaling="linear", factor=4.0), head_size=8)
>>> Pos, Head = hax.Axis("position", 3), hax.Axis("head_size", 8)
>>> rope(hax.ones((Pos, Head)), hax.arange(Pos), "head_size").axes == (Pos, Head)
True
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

import meltemi.haliax as hax
import meltemi.haliax.nn as hnn
from meltemi.models._config import ConfigError, RopeConfig


def rotary_dim(rope: RopeConfig, head_size: int) -> int:
    """Entries of each head that are rotated: `int(head_size * partial_rotary_factor)`."""
    dim = int(head_size * rope.partial_rotary_factor)
    if dim <= 0 or dim % 2:
        raise ConfigError(
            f"RopeConfig.partial_rotary_factor={rope.partial_rotary_factor!r}: rotates {dim} of "
            f"head_size={head_size} entries; the rotated size must be even and > 0. Fix: pick a "
            "factor making int(head_size * factor) even"
        )
    return dim


def _exponents(dim: int) -> np.ndarray:
    # As transformers: arange(0, dim, 2) as int64, then float32, divided by dim.
    return np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim


def _powers(theta: float, dim: int) -> np.ndarray:
    # `theta ** exponents` as torch computes a Python float to the power of a float32 tensor:
    # in float64, rounded once to float32 (numpy's float32 pow is 1 ulp off on some entries,
    # which at position 131,072 moves an angle by 0.008 rad).
    return (np.float64(theta) ** _exponents(dim).astype(np.float64)).astype(np.float32)


def _default(theta: float, dim: int) -> np.ndarray:
    return (np.float32(1.0) / _powers(theta, dim)).astype(np.float32)


def _yarn(rope: RopeConfig, dim: int) -> tuple[np.ndarray, float]:
    base, factor, old = rope.theta, rope.factor, rope.original_max_position

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = rope.attention_factor
    if attention is None:
        if rope.mscale and rope.mscale_all_dim:
            attention = float(mscale(factor, rope.mscale) / mscale(factor, rope.mscale_all_dim))
        else:
            attention = mscale(factor)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(old / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: avoids a division by zero
    pos_freqs = _powers(base, dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (np.float32(factor) * pos_freqs)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    keep = (1 - ramp).astype(np.float32)
    inv = interpolation * (1 - keep) + extrapolation * keep
    return inv.astype(np.float32), float(attention)


def _longrope_attention(rope: RopeConfig) -> float:
    if rope.attention_factor is not None:
        return rope.attention_factor
    if rope.factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(rope.factor) / math.log(rope.original_max_position))


@dataclasses.dataclass(frozen=True)
class Rotary:
    """RoPE of one config over heads of `head_size` (callable like `hnn.RotaryConfig`)."""

    rope: RopeConfig
    head_size: int

    def __post_init__(self) -> None:
        dim = rotary_dim(self.rope, self.head_size)  # validates the rotated size
        if self.rope.scaling == "longrope":
            for name in ("short_factor", "long_factor"):
                factors = getattr(self.rope, name)
                if len(factors) != dim // 2:
                    raise ConfigError(
                        f"RopeConfig.{name} has {len(factors)} entries; LongRoPE needs one per "
                        f"frequency, {dim // 2} for a rotated size of {dim}. Fix: give "
                        f"{dim // 2} factors"
                    )

    @property
    def dim(self) -> int:
        return rotary_dim(self.rope, self.head_size)

    def static_frequencies(self) -> tuple[np.ndarray, float]:
        """`(inv_freq, cos/sin scale)` for the kinds that do not depend on the sequence length
        (for `dynamic` / `longrope`: their values at or below `original_max_position`)."""
        rope, dim = self.rope, self.dim
        kind = rope.scaling
        if kind == "yarn":
            return _yarn(rope, dim)
        if kind == "llama3":
            scaling = hnn.Llama3RopeScaling(
                factor=rope.llama3_factor,
                low_freq_factor=rope.low_freq_factor,
                high_freq_factor=rope.high_freq_factor,
                original_max_position_embeddings=rope.original_max_position,
            )
            return scaling.scale(_default(rope.theta, dim)).astype(np.float32), 1.0
        if kind == "linear":
            return (_default(rope.theta, dim) / np.float32(rope.factor)).astype(np.float32), 1.0
        if kind == "longrope":
            short = np.asarray(rope.short_factor, np.float32)
            inv = 1.0 / (short * _powers(rope.theta, dim))
            return inv.astype(np.float32), _longrope_attention(rope)
        return _default(rope.theta, dim), 1.0

    def frequencies(self, positions: hax.NamedArray) -> tuple[jax.Array, float]:
        """`(inv_freq, cos/sin scale)` for a call over `positions` (traced for `dynamic` and
        `longrope`, which look at `max(positions) + 1` as transformers does)."""
        rope, dim = self.rope, self.dim
        inv, scale = self.static_frequencies()
        if rope.scaling not in ("dynamic", "longrope"):
            return jnp.asarray(inv), scale
        seq_len = jnp.max(positions.array).astype(jnp.int32) + 1
        old = rope.original_max_position
        if rope.scaling == "dynamic":
            length = jnp.maximum(seq_len, old).astype(jnp.float32)
            factor = jnp.float32(rope.factor)
            base = jnp.float32(rope.theta) * (
                (factor * length / jnp.float32(old)) - (factor - 1)
            ) ** jnp.float32(dim / (dim - 2))
            return 1.0 / (base ** jnp.asarray(_exponents(dim))), scale
        if rope.scaling == "longrope":
            long = np.asarray(rope.long_factor, np.float32)
            long_inv = (1.0 / (long * _powers(rope.theta, dim))).astype(np.float32)
            return jnp.where(seq_len > old, jnp.asarray(long_inv), jnp.asarray(inv)), scale
        return jnp.asarray(inv), scale

    def __call__(
        self,
        x: hax.NamedArray,
        positions: hax.NamedArray,
        HeadSize: hax.AxisSelector,  # noqa: N803
    ) -> hax.NamedArray:
        Head = x.resolve_axis(HeadSize)  # noqa: N806
        if Head.size != self.head_size:
            raise ConfigError(
                f"Rotary(head_size={self.head_size}) applied to an axis of size {Head.size}"
            )
        dim = self.dim
        half = dim // 2
        inv, scale = self.frequencies(positions)
        Half = hax.Axis("__rotary_half__", half)  # noqa: N806
        angles = hax.broadcast_to(positions.astype(jnp.float32), positions.axes + (Half,))
        angles = angles * hax.named(inv, (Half,))
        cos = hax.named(jnp.cos(angles.array) * scale, angles.axes).astype(x.dtype)
        sin = hax.named(jnp.sin(angles.array) * scale, angles.axes).astype(x.dtype)
        i = x.axis_index(Head)
        arr = x.array
        rest = x.axes[:i] + (Half,) + x.axes[i + 1 :]
        x1 = hax.named(jax.lax.slice_in_dim(arr, 0, half, axis=i), rest)
        x2 = hax.named(jax.lax.slice_in_dim(arr, half, dim, axis=i), rest)
        order = [a.name for a in rest]
        out1 = (x1 * cos - x2 * sin).rearrange(order).array
        out2 = (x2 * cos + x1 * sin).rearrange(order).array
        parts = [out1, out2]
        if dim < Head.size:
            parts.append(jax.lax.slice_in_dim(arr, dim, Head.size, axis=i))
        return hax.named(jnp.concatenate(parts, axis=i), x.axes)
