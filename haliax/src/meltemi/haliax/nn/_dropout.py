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

__all__ = ["Dropout", "dropout"]


def dropout(
    x: NamedArray,
    pdrop: float,
    broadcast_axes: AxisSpec | None = None,
    *,
    inference: bool,
    key: jax.Array | None = None,
) -> NamedArray:
    """Zeroes each element with probability `pdrop` and rescales the rest by `1/(1-pdrop)`.

    Elements along `broadcast_axes` share one draw (e.g. drop whole positions). `pdrop=1`
    zeroes everything; `inference=True` or `pdrop=0` returns `x` unchanged.

    Args:
        x: the input.
        pdrop: probability of zeroing an element.
        broadcast_axes: axes that share one draw.
        inference: if True, return `x` unchanged.
        key: PRNG key (needed unless inference or pdrop is 0).
    """
    if inference or (isinstance(pdrop, int | float) and pdrop == 0):
        return x
    if isinstance(pdrop, int | float) and pdrop == 1:
        return NamedArray(jnp.zeros_like(x.array), x.axes)
    if key is None:
        raise ValueError(
            "dropout needs a PRNG key in training mode: pass key=... or inference=True"
        )
    names = {a.name for a in _as_tuple(broadcast_axes or ())}  # type: ignore[union-attr]
    shape = tuple(a for a in x.axes if a.name not in names)
    keep = hrandom.bernoulli(key, shape, 1.0 - pdrop)
    q = jnp.asarray(1.0 - pdrop, x.dtype)
    return where(keep, x / q, jnp.zeros((), x.dtype))


class Dropout(eqx.Module):
    """Zeroes each element with probability `pdrop` and rescales the rest by `1/(1-pdrop)`.

    Elements along `broadcast_axes` share one draw (e.g. drop whole positions).
    """

    pdrop: float = eqx.field(static=True, default=0.1)
    broadcast_axes: AxisSpec | None = eqx.field(static=True, default=None)
    inference: bool = eqx.field(static=True, default=False)

    def __post_init__(self):
        if not 0.0 <= self.pdrop <= 1.0:
            raise ValueError(f"Dropout: pdrop must be in [0, 1], got {self.pdrop}")

    def __call__(
        self, x: NamedArray, *, inference: bool | None = None, key: jax.Array | None = None
    ) -> NamedArray:
        inference = self.inference if inference is None else inference
        if not inference and self.pdrop != 0.0 and key is None:
            raise ValueError(
                "Dropout needs a PRNG key in training mode: call it with key=... or pass "
                "inference=True"
            )
        return dropout(x, self.pdrop, self.broadcast_axes, inference=inference, key=key)

    @property
    def is_active(self) -> bool:
        """Whether calling it draws random numbers (and so needs a key)."""
        return not self.inference and self.pdrop > 0
