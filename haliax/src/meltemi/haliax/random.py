"""Random numbers with named shapes: `hax.random.normal(key, (Batch, Embed))`.

>>> import jax
>>> import meltemi.haliax as hax
>>> x = hax.random.normal(jax.random.key(0), (hax.Axis("a", 2), hax.Axis("b", 3)))
>>> x.shape
{'a': 2, 'b': 3}
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from meltemi.haliax._core import (
    AxisSelector,
    AxisSpec,
    NamedArray,
    _as_tuple,
    _check_unique,
    broadcast_to,
)

__all__ = [
    "normal",
    "uniform",
    "truncated_normal",
    "bernoulli",
    "randint",
    "categorical",
    "gumbel",
    "permutation",
]


def _shape(shape: AxisSpec):
    axes = tuple(_as_tuple(shape))
    _check_unique([a.name for a in axes], "random shape")  # type: ignore[union-attr]
    return axes, tuple(a.size for a in axes)  # type: ignore[union-attr]


def _raw(x: Any, axes) -> Any:
    return broadcast_to(x, axes).array if isinstance(x, NamedArray) else x


def normal(key: jax.Array, shape: AxisSpec, dtype: Any = float) -> NamedArray:
    """Standard normal samples over `shape`."""
    axes, s = _shape(shape)
    return NamedArray(jax.random.normal(key, s, dtype), axes)


def uniform(
    key: jax.Array, shape: AxisSpec, dtype: Any = float, minval: Any = 0.0, maxval: Any = 1.0
) -> NamedArray:
    """Uniform samples in `[minval, maxval)`; bounds may be NamedArrays (aligned by name)."""
    axes, s = _shape(shape)
    return NamedArray(
        jax.random.uniform(key, s, dtype, _raw(minval, axes), _raw(maxval, axes)), axes
    )


def truncated_normal(
    key: jax.Array, shape: AxisSpec, lower: Any, upper: Any, dtype: Any = float
) -> NamedArray:
    """Normal samples truncated to `[lower, upper]`."""
    axes, s = _shape(shape)
    return NamedArray(
        jax.random.truncated_normal(key, _raw(lower, axes), _raw(upper, axes), s, dtype), axes
    )


def bernoulli(key: jax.Array, shape: AxisSpec, p: Any = 0.5) -> NamedArray:
    """Boolean samples that are True with probability `p`."""
    axes, s = _shape(shape)
    return NamedArray(jax.random.bernoulli(key, _raw(p, axes), s), axes)


def randint(
    key: jax.Array, shape: AxisSpec, minval: Any, maxval: Any, dtype: Any = jnp.int32
) -> NamedArray:
    """Integers in `[minval, maxval)`."""
    axes, s = _shape(shape)
    return NamedArray(
        jax.random.randint(key, s, _raw(minval, axes), _raw(maxval, axes), dtype), axes
    )


def gumbel(key: jax.Array, shape: AxisSpec, dtype: Any = float) -> NamedArray:
    axes, s = _shape(shape)
    return NamedArray(jax.random.gumbel(key, s, dtype), axes)


def categorical(key: jax.Array, logits: NamedArray, axis: AxisSelector) -> NamedArray:
    """Samples indices along `axis` with probabilities `softmax(logits)`; the axis is removed."""
    i = logits.axis_index(axis)
    out = jax.random.categorical(key, logits.array, axis=i)
    return NamedArray(out, logits.axes[:i] + logits.axes[i + 1 :])


def permutation(key: jax.Array, x: NamedArray, axis: AxisSelector) -> NamedArray:
    """`x` shuffled along `axis`."""
    i = x.axis_index(axis)
    return NamedArray(jax.random.permutation(key, x.array, axis=i, independent=False), x.axes)
