"""Pytree helpers shared by the optimizers: named-array leaves and parameter paths.

A haliax `NamedArray` is a pytree node holding one array (`.array`) and static axes (`.axes`,
each with `.name` and `.size`). The optimizers treat it as one parameter: masks and labels are
decided per NamedArray, and Muon reads its axis names. The check is duck-typed so that any
object with `.array` and `.axes` (haliax's `NamedArray` or a look-alike) works.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax


def is_named_array(x: Any) -> bool:
    """True for a named-array leaf: an object carrying `.array` and `.axes` (not a raw array).

    Example:
        >>> import jax.numpy as jnp
        >>> is_named_array(jnp.ones(3))
        False
    """
    if isinstance(x, jax.Array) or x is None:
        return False
    return hasattr(x, "array") and hasattr(x, "axes")


def axis_names(x: Any) -> tuple[str, ...] | None:
    """The axis names of a named-array leaf, or None for a plain array.

    Example:
        >>> import jax.numpy as jnp
        >>> axis_names(jnp.ones((3, 5))) is None
        True
    """
    if not is_named_array(x):
        return None
    return tuple(str(getattr(a, "name", a)) for a in x.axes)


def raw(x: Any) -> jax.Array:
    """The array inside a named-array leaf (or the leaf itself)."""
    return x.array if is_named_array(x) else x


def rewrap(like: Any, array: jax.Array) -> Any:
    """A leaf of the same kind as `like` holding `array` (a NamedArray keeps its axes)."""
    if not is_named_array(like):
        return array
    leaves, treedef = jax.tree_util.tree_flatten(like)
    if len(leaves) != 1:
        raise ValueError(
            f"a named array must hold exactly one array leaf, got {len(leaves)} in {type(like)}"
        )
    return jax.tree_util.tree_unflatten(treedef, [array])


def path_str(path: tuple[Any, ...]) -> str:
    """A `/`-joined string for a jax key path, e.g. `layers/0/bias`.

    Example:
        >>> import jax
        >>> paths = [path_str(p) for p, _ in jax.tree_util.tree_leaves_with_path({"a": [1, 2]})]
        >>> paths
        ['a/0', 'a/1']
    """
    parts = []
    for k in path:
        if isinstance(k, jax.tree_util.DictKey):
            parts.append(str(k.key))
        elif isinstance(k, jax.tree_util.GetAttrKey):
            parts.append(k.name)
        elif isinstance(k, jax.tree_util.SequenceKey):
            parts.append(str(k.idx))
        elif isinstance(k, jax.tree_util.FlattenedIndexKey):
            parts.append(str(k.key))
        else:
            parts.append(str(k).strip(".[]'\""))
    return "/".join(parts)


def map_params_with_path(fn: Callable[[str, Any], Any], params: Any) -> Any:
    """Maps `fn(path, leaf)` over parameters, a NamedArray counting as one leaf.

    The result is a prefix tree of `params` (one value per array or NamedArray), the shape that
    `optax.masked` and `optax.multi_transform` accept as a mask or label tree.
    """
    return jax.tree_util.tree_map_with_path(
        lambda p, x: fn(path_str(p), x), params, is_leaf=is_named_array
    )
