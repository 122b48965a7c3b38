"""`haliax.jax_utils`: the JAX helpers Haliax code imports from this path.

>>> import jax
>>> maybe_rng_split(None, 3), shaped_rng_split(jax.random.key(0), (2, 3)).shape
([None, None, None], (2, 3))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from meltemi.haliax._core import NamedArray
from meltemi.haliax._remat import tree_checkpoint_name

__all__ = [
    "broadcast_prefix",
    "ensure_scalar",
    "is_in_jit",
    "is_jax_array_like",
    "is_scalarish",
    "maybe_rng_split",
    "named_call",
    "shaped_rng_split",
    "tree_checkpoint_name",
]

F = TypeVar("F", bound=Callable[..., Any])


def maybe_rng_split(key: jax.Array | None, num: int = 2) -> Any:
    """`jax.random.split(key, num)`; `[None] * num` for a None key; shape `(1, ...)` for num 1."""
    if key is None:
        return [None] * num
    if num == 1:
        return jnp.reshape(key, (1,) + key.shape)
    return jax.random.split(key, num)


def shaped_rng_split(key: jax.Array, split_shape: int | Sequence[int] = 2) -> jax.Array:
    """`key` split into an array of keys of shape `split_shape`."""
    shape = (split_shape,) if isinstance(split_shape, int) else tuple(split_shape)
    n = int(np.prod(shape))
    keys = jnp.reshape(key, (1,) + key.shape) if n == 1 else jax.random.split(key, n)
    return jnp.reshape(keys, shape + key.shape)


def is_jax_array_like(x: Any) -> bool:
    """Whether `x` has a shape and a dtype (a jax/numpy array or a ShapeDtypeStruct)."""
    return hasattr(x, "shape") and hasattr(x, "dtype")


def is_in_jit() -> bool:
    """Whether the caller is being traced (inside `jit`, `grad`, `vmap`, ...)."""
    return isinstance(jnp.zeros((), dtype=jnp.float32), jax.core.Tracer)


def is_scalarish(x: Any) -> bool:
    """Whether `x` is a Python/numpy scalar or an array (named or not) with no axes."""
    if isinstance(x, NamedArray):
        return x.ndim == 0
    return bool(jnp.isscalar(x)) or getattr(x, "shape", None) == ()


def ensure_scalar(x: Any, *, name: str = "value") -> Any:
    """`x`, unwrapped if it is a NamedArray without axes; a NamedArray with axes raises."""
    if isinstance(x, NamedArray):
        if x.ndim != 0:
            raise TypeError(f"{name} must be a scalar, got a NamedArray with axes {x.axes}")
        return x.array
    return x


def broadcast_prefix(
    prefix_tree: Any, full_tree: Any, is_leaf: Callable[[Any], bool] | None = None
) -> Any:
    """`prefix_tree` with each leaf repeated over the leaves of its subtree of `full_tree`."""
    out: list[Any] = []

    def add(x: Any, subtree: Any) -> None:
        out.extend([x] * jax.tree_util.tree_structure(subtree).num_leaves)

    jax.tree_util.tree_map(add, prefix_tree, full_tree, is_leaf=is_leaf)
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(full_tree), out)


def named_call(f: Any = None, name: str | None = None) -> Any:
    """`f` under `jax.named_scope(name)` (default: its qualified name); usable as a decorator."""
    if f is None:
        return lambda g: named_call(g, name)
    if name is None:
        name = f.__qualname__
        if f.__name__ == "__call__":
            owner = getattr(f, "__self__", None)
            name = type(owner).__name__ if owner is not None else name.rsplit(".", 1)[0]
    return jax.named_scope(name)(f)
