"""Pytree helpers that treat NamedArrays as leaves, and `resize_axis` for whole models.

>>> import jax.numpy as jnp
>>> import meltemi.haliax as hax
>>> tree = {"w": hax.ones((hax.Axis("a", 3),)), "n": 2}
>>> hax.tree_util.tree_map(lambda x: x * 2, tree)["w"].array
Array([2., 2., 2.], dtype=float32)
>>> len(hax.tree_util.tree_leaves(tree))
2
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax

from meltemi.haliax import random as hrandom
from meltemi.haliax._core import AxisSelector, NamedArray, broadcast_to, is_named_array
from meltemi.haliax._hof import vmap
from meltemi.haliax._ops import concatenate
from meltemi.haliax._reductions import mean, std
from meltemi.haliax.nn._scan import Stacked

__all__ = [
    "tree_map",
    "scan_aware_tree_map",
    "tree_flatten",
    "tree_unflatten",
    "tree_leaves",
    "tree_structure",
    "resize_axis",
    "hashable_partition",
    "hashable_combine",
]


def _leaf_fn(is_leaf: Callable[[Any], bool] | None) -> Callable[[Any], bool]:
    if is_leaf is None:
        return is_named_array
    return lambda x: is_named_array(x) or is_leaf(x)


def tree_map(fn: Callable, tree: Any, *rest: Any, is_leaf: Callable[[Any], bool] | None = None):
    """`jax.tree.map` with NamedArrays as leaves (so `fn` sees the NamedArray, not its array)."""
    return jax.tree.map(fn, tree, *rest, is_leaf=_leaf_fn(is_leaf))


def scan_aware_tree_map(
    fn: Callable, tree: Any, *rest: Any, is_leaf: Callable[[Any], bool] | None = None
):
    """`tree_map` that applies `fn` to each layer of a `Stacked` (vmapped over its layer axis),
    so `fn` sees per-layer arrays without the `Layers` axis."""

    def leaf(x):
        return isinstance(x, Stacked) or (is_leaf is not None and is_leaf(x))

    def visit(x, *xs):
        if isinstance(x, Stacked):
            inner = vmap(lambda s, *ss: scan_aware_tree_map(fn, s, *ss, is_leaf=is_leaf), x.Block)(
                x.stacked, *[r.stacked for r in xs]
            )
            return eqx.tree_at(lambda m: m.stacked, x, inner)
        return fn(x, *xs)

    return tree_map(visit, tree, *rest, is_leaf=leaf)


def tree_flatten(tree: Any, is_leaf: Callable[[Any], bool] | None = None):
    """`jax.tree_util.tree_flatten` with NamedArrays as leaves."""
    return jax.tree_util.tree_flatten(tree, is_leaf=_leaf_fn(is_leaf))


def tree_unflatten(treedef: Any, leaves: Any) -> Any:
    """`jax.tree_util.tree_unflatten` (the inverse of `tree_flatten`)."""
    return jax.tree_util.tree_unflatten(treedef, leaves)


def tree_leaves(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> list[Any]:
    """`jax.tree_util.tree_leaves` with NamedArrays as leaves."""
    return jax.tree_util.tree_leaves(tree, is_leaf=_leaf_fn(is_leaf))


def tree_structure(tree: Any, is_leaf: Callable[[Any], bool] | None = None):
    """`jax.tree_util.tree_structure` with NamedArrays as leaves."""
    return jax.tree_util.tree_structure(tree, is_leaf=_leaf_fn(is_leaf))


def resize_axis(
    tree: Any, old_axis: AxisSelector, new_size: int, key: jax.Array | None = None
) -> Any:
    """Every NamedArray in `tree` with `old_axis` resized to `new_size` along it.

    Shrinking keeps the first `new_size` entries. Growing appends entries equal to the mean
    along the axis, or, given `key`, drawn from a normal truncated at +-2 with that mean and
    standard deviation. Modules that also store the Axis itself need it updated by hand.

    Args:
        tree: a pytree of NamedArrays (e.g. a model).
        old_axis: the axis to resize.
        new_size: its new size.
        key: PRNG key for new entries (None: new entries are the mean).
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=is_named_array)
    keys = [None] * len(leaves) if key is None else list(jax.random.split(key, max(len(leaves), 1)))

    def resize(x, k):
        if not isinstance(x, NamedArray) or not x.has_axis(old_axis):
            return x
        ax = x.resolve_axis(old_axis)
        if new_size <= ax.size:
            return x.slice(ax, start=0, length=new_size) if new_size < ax.size else x
        pad_axes = tuple(ax.resize(new_size - ax.size) if a == ax else a for a in x.axes)
        mu = mean(x, ax)
        if k is None:
            pad = broadcast_to(mu, pad_axes)
        else:
            noise = hrandom.truncated_normal(k, pad_axes, -2, 2, dtype=x.dtype)
            pad = broadcast_to(noise * std(x, ax) + mu, pad_axes)
        return concatenate(ax.name, [x, pad.astype(x.dtype)])

    return jax.tree_util.tree_unflatten(treedef, [resize(x, k) for x, k in zip(leaves, keys)])


def hashable_partition(pytree: Any, filter_spec: Any) -> tuple[Any, Any]:
    """`eqx.partition`, with the static part as a hashable `(leaves tuple, treedef)`."""
    dynamic, static = eqx.partition(pytree, filter_spec)
    leaves, treedef = jax.tree_util.tree_flatten(static)
    return dynamic, (tuple(leaves), treedef)


def hashable_combine(dynamic: Any, static: Any) -> Any:
    """The inverse of `hashable_partition`."""
    leaves, treedef = static
    return eqx.combine(dynamic, jax.tree_util.tree_unflatten(treedef, leaves))
