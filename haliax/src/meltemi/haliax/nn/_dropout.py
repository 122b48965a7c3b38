"""Dropout with optional broadcast axes.

>>> import jax
>>> import meltemi.haliax as hax
>>> E = hax.Axis("embed", 4)
>>> hax.nn.Dropout(0.5)(hax.ones(E), inference=True).array
Array([1., 1., 1., 1.], dtype=float32)
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from meltemi.haliax import random as hrandom
from meltemi.haliax._core import AxisSpec, NamedArray, _as_tuple
from meltemi.haliax._ops import where

__all__ = ["Dropout"]


class Dropout(eqx.Module):
    """Zeroes each element with probability `pdrop` and rescales the rest by `1/(1-pdrop)`.

    Elements along `broadcast_axes` share one draw (e.g. drop whole positions).
    """

    pdrop: float = eqx.field(static=True, default=0.1)
    broadcast_axes: AxisSpec | None = eqx.field(static=True, default=None)
    inference: bool = eqx.field(static=True, default=False)

    def __post_init__(self):
        if not 0.0 <= self.pdrop < 1.0:
            raise ValueError(f"Dropout: pdrop must be in [0, 1), got {self.pdrop}")

    def __call__(
        self, x: NamedArray, *, inference: bool | None = None, key: jax.Array | None = None
    ) -> NamedArray:
        inference = self.inference if inference is None else inference
        if inference or self.pdrop == 0.0:
            return x
        if key is None:
            raise ValueError(
                "Dropout needs a PRNG key in training mode: call it with key=... or pass "
                "inference=True"
            )
        names = {a.name for a in _as_tuple(self.broadcast_axes or ())}  # type: ignore[union-attr]
        shape = tuple(a for a in x.axes if a.name not in names)
        keep = hrandom.bernoulli(key, shape, 1.0 - self.pdrop)
        return where(keep, x / (1.0 - self.pdrop), jnp.zeros((), x.dtype))
