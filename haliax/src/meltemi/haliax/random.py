"""Random numbers with named shapes: `hax.random.normal(key, (Batch, Embed))`.

>>> import jax
>>> import meltemi.haliax as hax
>>> x = hax.random.normal(jax.random.key(0), (hax.Axis("a", 2), hax.Axis("b", 3)))
>>> x.shape
{'a': 2, 'b': 3}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from meltemi.haliax._core import (
    Axis,
    AxisError,
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
    "poisson",
    "exponential",
    "gamma",
    "beta",
    "laplace",
    "cauchy",
    "logistic",
    "ball",
    "choice",
    "rademacher",
    "t",
    "weibull_min",
    "pareto",
    "loggamma",
]


def _shape(shape: AxisSpec):
    if isinstance(shape, Mapping):  # Haliax's ShapeDict: {"batch": 3, "embed": 5}
        shape = tuple(Axis(n, s) for n, s in shape.items())
    axes = tuple(_as_tuple(shape))
    _check_unique([a.name for a in axes], "random shape")  # type: ignore[union-attr]
    return axes, tuple(a.size for a in axes)  # type: ignore[union-attr]


def _raw(x: Any, axes) -> Any:
    return broadcast_to(x, axes).array if isinstance(x, NamedArray) else x


def _flat(sample, s: tuple[int, ...], *params: Any) -> jax.Array:
    """`sample(*params, shape)` drawn over the flat size, then reshaped to `s`.

    The values are the same as drawing at shape `s` (the PRNG counters are row-major in both
    threefry modes), but XLA:CPU compiles the rank-1 generator in well under a second, where a
    rank-4 one with small dims, e.g. (2, 3, 4, 12), took 11 s: every `Linear.init` pays that.
    """
    n = math.prod(s)
    flat = [p if jnp.ndim(p) == 0 else jnp.broadcast_to(p, s).reshape(n) for p in params]
    return sample(*flat, (n,)).reshape(s)


def normal(key: jax.Array, shape: AxisSpec, dtype: Any = float) -> NamedArray:
    """Standard normal samples over `shape`."""
    axes, s = _shape(shape)
    return NamedArray(_flat(lambda sh: jax.random.normal(key, sh, dtype), s), axes)


def uniform(
    key: jax.Array, shape: AxisSpec, dtype: Any = float, minval: Any = 0.0, maxval: Any = 1.0
) -> NamedArray:
    """Uniform samples in `[minval, maxval)`; bounds may be NamedArrays (aligned by name).

    Args:
        key: PRNG key.
        shape: result axes.
        dtype: float dtype.
        minval: lower bound (scalar or NamedArray).
        maxval: upper bound (scalar or NamedArray).
    """
    axes, s = _shape(shape)
    draw = lambda lo, hi, sh: jax.random.uniform(key, sh, dtype, lo, hi)  # noqa: E731
    return NamedArray(_flat(draw, s, _raw(minval, axes), _raw(maxval, axes)), axes)


def truncated_normal(
    key: jax.Array, shape: AxisSpec, lower: Any, upper: Any, dtype: Any = float
) -> NamedArray:
    """Normal samples truncated to `[lower, upper]`.

    Args:
        key: PRNG key.
        shape: result axes.
        lower: lower bound.
        upper: upper bound.
        dtype: float dtype.
    """
    axes, s = _shape(shape)
    draw = lambda lo, hi, sh: jax.random.truncated_normal(key, lo, hi, sh, dtype)  # noqa: E731
    return NamedArray(_flat(draw, s, _raw(lower, axes), _raw(upper, axes)), axes)


def bernoulli(key: jax.Array, shape: AxisSpec, p: Any = 0.5) -> NamedArray:
    """Boolean samples that are True with probability `p`."""
    axes, s = _shape(shape)
    return NamedArray(jax.random.bernoulli(key, _raw(p, axes), s), axes)


def randint(
    key: jax.Array, shape: AxisSpec, minval: Any, maxval: Any, dtype: Any = jnp.int32
) -> NamedArray:
    """Integers in `[minval, maxval)`.

    Args:
        key: PRNG key.
        shape: result axes.
        minval: lowest value (inclusive).
        maxval: highest value (exclusive).
        dtype: integer dtype.
    """
    axes, s = _shape(shape)
    return NamedArray(
        jax.random.randint(key, s, _raw(minval, axes), _raw(maxval, axes), dtype), axes
    )


def gumbel(key: jax.Array, shape: AxisSpec, dtype: Any = float) -> NamedArray:
    axes, s = _shape(shape)
    return NamedArray(jax.random.gumbel(key, s, dtype), axes)


def categorical(
    key: jax.Array, logits: NamedArray, axis: AxisSelector, shape: AxisSpec | None = None
) -> NamedArray:
    """Samples indices along `axis` with probabilities `softmax(logits)`; the axis is removed.

    `shape` (default: the logits' other axes) may add axes to draw more samples; it must contain
    the logits' other axes and not `axis`.

    Args:
        key: PRNG key.
        logits: unnormalised log-probabilities.
        axis: the category axis.
        shape: result axes (default: the logits' other axes).
    """
    ax = logits.resolve_axis(axis)
    out_axes = tuple(a for a in logits.axes if a != ax) if shape is None else _shape(shape)[0]
    if any(a.name == ax.name for a in out_axes):
        raise AxisError(f"categorical: the sampled axis {ax.name!r} cannot be in shape {out_axes}")
    # Haliax's layout (so the same key draws the same samples): missing axes go in front; the
    # category axis stays in place unless `shape`'s order needs a transpose, then it goes last.
    names = {a.name for a in logits.axes}
    full = tuple(a for a in out_axes if a.name not in names) + logits.axes
    order = [a.name for a in full if a.name != ax.name]
    if order != [a.name for a in out_axes]:
        full = (*out_axes, ax)
    lg = broadcast_to(logits, full)
    index = [a.name for a in full].index(ax.name)
    out = jax.random.categorical(key, lg.array, axis=index, shape=tuple(a.size for a in out_axes))
    return NamedArray(out, out_axes)


def permutation(
    key: jax.Array, x: NamedArray, axis: AxisSelector, independent: bool = False
) -> NamedArray:
    """`x` shuffled along `axis` (each slice separately when `independent`).

    Args:
        key: PRNG key.
        x: the array.
        axis: the axis to shuffle.
        independent: shuffle each slice with its own permutation.
    """
    i = x.axis_index(axis)
    out = jax.random.permutation(key, x.array, axis=i, independent=independent)
    return NamedArray(out, x.axes)


def poisson(key: jax.Array, shape: AxisSpec, lam: Any, dtype: Any = int) -> NamedArray:
    """Poisson counts with rate `lam`.

    Args:
        key: PRNG key.
        shape: result axes.
        lam: rate (scalar or NamedArray).
        dtype: integer dtype.
    """
    axes, s = _shape(shape)
    return NamedArray(jax.random.poisson(key, _raw(lam, axes), s, dtype), axes)


def exponential(key: jax.Array, shape: AxisSpec, dtype: Any = float) -> NamedArray:
    """Exponential samples with rate 1."""
    axes, s = _shape(shape)
    return NamedArray(jax.random.exponential(key, s, dtype), axes)


def gamma(key: jax.Array, shape: AxisSpec, a: Any, dtype: Any = float) -> NamedArray:
    """Gamma samples with shape parameter `a` (scale 1).

    Args:
        key: PRNG key.
        shape: result axes.
        a: shape parameter.
        dtype: float dtype.
    """
    axes, s = _shape(shape)
    return NamedArray(jax.random.gamma(key, _raw(a, axes), s, dtype), axes)


def beta(key: jax.Array, shape: AxisSpec, a: Any, b: Any, dtype: Any = float) -> NamedArray:
    """Beta(a, b) samples.

    Args:
        key: PRNG key.
        shape: result axes.
        a: first shape parameter.
        b: second shape parameter.
        dtype: float dtype.
    """
    axes, s = _shape(shape)
    return NamedArray(jax.random.beta(key, _raw(a, axes), _raw(b, axes), s, dtype), axes)


def laplace(key: jax.Array, shape: AxisSpec, dtype: Any = float) -> NamedArray:
    """Standard Laplace samples."""
    axes, s = _shape(shape)
    return NamedArray(jax.random.laplace(key, s, dtype), axes)


def cauchy(key: jax.Array, shape: AxisSpec, dtype: Any = float) -> NamedArray:
    """Standard Cauchy samples."""
    axes, s = _shape(shape)
    return NamedArray(jax.random.cauchy(key, s, dtype), axes)


def logistic(key: jax.Array, shape: AxisSpec, dtype: Any = float) -> NamedArray:
    """Standard logistic samples."""
    axes, s = _shape(shape)
    return NamedArray(jax.random.logistic(key, s, dtype), axes)


def rademacher(key: jax.Array, shape: AxisSpec, dtype: Any = float) -> NamedArray:
    """+1 or -1 with equal probability."""
    axes, s = _shape(shape)
    return NamedArray(jax.random.rademacher(key, s, dtype), axes)


def t(key: jax.Array, shape: AxisSpec, df: Any, dtype: Any = float) -> NamedArray:
    """Student's t samples with `df` degrees of freedom.

    Args:
        key: PRNG key.
        shape: result axes.
        df: degrees of freedom.
        dtype: float dtype.
    """
    axes, s = _shape(shape)
    return NamedArray(jax.random.t(key, _raw(df, axes), s, dtype), axes)


def weibull_min(
    key: jax.Array, shape: AxisSpec, scale: Any, concentration: Any, dtype: Any = float
) -> NamedArray:
    """Weibull samples with `scale` and `concentration`.

    Args:
        key: PRNG key.
        shape: result axes.
        scale: scale parameter.
        concentration: shape parameter.
        dtype: float dtype.
    """
    axes, s = _shape(shape)
    out = jax.random.weibull_min(key, _raw(scale, axes), _raw(concentration, axes), s, dtype)
    return NamedArray(out, axes)


def pareto(key: jax.Array, shape: AxisSpec, b: Any, dtype: Any = float) -> NamedArray:
    """Pareto samples with shape `b`.

    Args:
        key: PRNG key.
        shape: result axes.
        b: shape parameter.
        dtype: float dtype.
    """
    axes, s = _shape(shape)
    return NamedArray(jax.random.pareto(key, _raw(b, axes), s, dtype), axes)


def loggamma(key: jax.Array, shape: AxisSpec, a: Any, dtype: Any = float) -> NamedArray:
    """`log` of Gamma(a) samples, accurate for small `a`.

    Args:
        key: PRNG key.
        shape: result axes.
        a: shape parameter.
        dtype: float dtype.
    """
    axes, s = _shape(shape)
    return NamedArray(jax.random.loggamma(key, _raw(a, axes), s, dtype), axes)


def ball(
    key: jax.Array, shape: AxisSpec, D: Axis, p: float = 2.0, dtype: Any = float
) -> NamedArray:
    """Points uniform in the unit `p`-norm ball of dimension `D.size`; axes `shape + (D,)`.

    Args:
        key: PRNG key.
        shape: axes of the batch of points.
        D: the coordinate axis (the dimension).
        p: the norm.
        dtype: float dtype.
    """
    axes, s = _shape(shape)
    return NamedArray(jax.random.ball(key, D.size, p, s, dtype), (*axes, D))


def choice(
    key: jax.Array,
    shape: AxisSpec,
    a: NamedArray,
    axis: AxisSelector,
    replace: bool = True,
    p: NamedArray | None = None,
) -> NamedArray:
    """Draws slices of `a` along `axis`; axes `shape + (a's other axes)`.

    Args:
        key: PRNG key.
        shape: the axes of the draws.
        a: the array to draw from.
        axis: the axis drawn along.
        replace: draw with replacement.
        p: probabilities over `axis` (a NamedArray with just that axis), uniform if None.

    Returns:
        The drawn slices.
    """
    i = a.axis_index(axis)
    axes, s = _shape(shape)
    if p is not None and [x.name for x in p.axes] != [a.axes[i].name]:
        raise AxisError(
            f"choice: p must have exactly the axis {a.axes[i].name!r}, "
            f"got {[x.name for x in p.axes]}"
        )
    out = jax.random.choice(
        key, a.array, s, replace=replace, p=None if p is None else p.array, axis=i
    )
    return NamedArray(out, (*axes, *a.axes[:i], *a.axes[i + 1 :]))
