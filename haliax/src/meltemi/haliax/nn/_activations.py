"""Activations, softmax and one-hot over named axes.

>>> import meltemi.haliax as hax
>>> V = hax.Axis("vocab", 3)
>>> hax.nn.softmax(hax.zeros(V), axis=V).array
Array([0.333..., 0.333..., 0.333...], dtype=float32)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from meltemi.haliax._core import (
    Axis,
    AxisError,
    AxisSelection,
    AxisSelector,
    NamedArray,
    _as_tuple,
    broadcast_to,
)
from meltemi.haliax._reductions import logsumexp

__all__ = [
    "relu",
    "relu6",
    "gelu",
    "quick_gelu",
    "silu",
    "swish",
    "sigmoid",
    "tanh",
    "softplus",
    "elu",
    "leaky_relu",
    "celu",
    "selu",
    "glu",
    "hard_sigmoid",
    "hard_silu",
    "hard_swish",
    "hard_tanh",
    "log_sigmoid",
    "soft_sign",
    "relu_squared",
    "softmax",
    "log_softmax",
    "logsumexp",
    "standardize",
    "one_hot",
]


def _unary(fn, name):
    def act(x: Any, *args, **kwargs):
        if isinstance(x, NamedArray):
            return NamedArray(fn(x.array, *args, **kwargs), x.axes)
        return fn(x, *args, **kwargs)

    act.__name__ = name
    act.__qualname__ = name
    act.__doc__ = f"Elementwise `jax.nn.{name}` (axes are kept)."
    return act


relu = _unary(jax.nn.relu, "relu")
relu6 = _unary(jax.nn.relu6, "relu6")
silu = _unary(jax.nn.silu, "silu")
swish = _unary(jax.nn.swish, "swish")
sigmoid = _unary(jax.nn.sigmoid, "sigmoid")
tanh = _unary(jnp.tanh, "tanh")
softplus = _unary(jax.nn.softplus, "softplus")
elu = _unary(jax.nn.elu, "elu")
leaky_relu = _unary(jax.nn.leaky_relu, "leaky_relu")
celu = _unary(jax.nn.celu, "celu")
selu = _unary(jax.nn.selu, "selu")
hard_sigmoid = _unary(jax.nn.hard_sigmoid, "hard_sigmoid")
hard_silu = _unary(jax.nn.hard_silu, "hard_silu")
hard_swish = _unary(jax.nn.hard_swish, "hard_swish")
hard_tanh = _unary(jax.nn.hard_tanh, "hard_tanh")
log_sigmoid = _unary(jax.nn.log_sigmoid, "log_sigmoid")
soft_sign = _unary(jax.nn.soft_sign, "soft_sign")


def relu_squared(x: Any) -> Any:
    """`relu(x) ** 2` (Primer's activation)."""
    return _unary(lambda a: jnp.square(jax.nn.relu(a)), "relu_squared")(x)


def glu(x: NamedArray, axis: AxisSelector) -> NamedArray:
    """Gated linear unit: splits `axis` into halves `a, b` and returns `a * sigmoid(b)`.

    The axis keeps its name and is halved (it must have even size).
    """
    i = x.axis_index(axis)
    ax = x.axes[i]
    if ax.size % 2:
        raise AxisError(f"glu: axis {ax.name!r} has odd size {ax.size}; it is split in halves")
    out = jax.nn.glu(x.array, axis=i)
    return NamedArray(out, x.axes[:i] + (ax.resize(ax.size // 2),) + x.axes[i + 1 :])


def gelu(x: NamedArray, approximate: bool = True) -> NamedArray:
    """GELU; `approximate=False` is the exact erf form (HF `gelu`), True the tanh form."""
    return NamedArray(jax.nn.gelu(x.array, approximate=approximate), x.axes)


def quick_gelu(x: NamedArray) -> NamedArray:
    return NamedArray(x.array * jax.nn.sigmoid(1.702 * x.array), x.axes)


def _idx(x: NamedArray, axis: AxisSelection) -> tuple[int, ...]:
    return tuple(x.axis_index(a) for a in _as_tuple(axis))


def softmax(x: NamedArray, axis: AxisSelection, *, where: Any = None) -> NamedArray:
    """Softmax over the named axis (or axes)."""
    kw = {}
    if where is not None:
        kw["where"] = where.broadcast_to(x.axes).array if isinstance(where, NamedArray) else where
    return NamedArray(jax.nn.softmax(x.array, axis=_idx(x, axis), **kw), x.axes)


def log_softmax(x: NamedArray, axis: AxisSelection) -> NamedArray:
    """Log-softmax over the named axis (or axes)."""
    return NamedArray(jax.nn.log_softmax(x.array, axis=_idx(x, axis)), x.axes)


def standardize(
    x: NamedArray,
    axis: AxisSelection,
    *,
    mean: NamedArray | None = None,
    variance: NamedArray | None = None,
    epsilon: float = 1e-5,
    where: NamedArray | None = None,
) -> NamedArray:
    """`(x - mean) / sqrt(variance + epsilon)` over `axis` (`jax.nn.standardize` by name).

    Args:
        x: the array.
        axis: the axis or axes the statistics are taken over.
        mean: precomputed mean (aligned by name); None computes it.
        variance: precomputed variance (aligned by name); None computes it.
        epsilon: added to the variance.
        where: bool mask of the elements that enter the statistics (aligned by name).
    """
    idx = _idx(x, axis)

    def raw(a: NamedArray | None) -> Any:
        return None if a is None else broadcast_to(a, x.axes).array

    out = jax.nn.standardize(
        x.array, idx, mean=raw(mean), variance=raw(variance), epsilon=epsilon, where=raw(where)
    )
    return NamedArray(out, x.axes)


def one_hot(x: NamedArray | int, axis: Axis, *, dtype: Any = jnp.float32) -> NamedArray:
    """One-hot encoding along a new trailing axis `axis`: a NamedArray's out-of-range indices
    give all zeros; a scalar index counts from the end when negative (Haliax's behaviour).

    >>> import meltemi.haliax as hax
    >>> one_hot(1, hax.Axis("v", 3)).array
    Array([0., 1., 0.], dtype=float32)
    """
    if isinstance(x, NamedArray):  # out-of-range indices (negative ones too) give all zeros
        return NamedArray(jax.nn.one_hot(x.array, axis.size, dtype=dtype), x.axes + (axis,))
    raw = jnp.asarray(x)
    if raw.ndim != 0:
        raise TypeError(
            f"one_hot expects a scalar integer or a NamedArray, got an unnamed array of shape "
            f"{raw.shape}; name its axes with hax.named"
        )
    # a scalar index wraps like Python indexing (-1 is the last class), as in Haliax
    return NamedArray(jnp.zeros(axis.size, dtype=dtype).at[raw].set(1), (axis,))
