"""`haliax.core`: NamedArray and its basic functions, at the module path Haliax code imports.

>>> from meltemi.haliax.core import NamedArray, named
>>> import jax.numpy as jnp
>>> named(jnp.zeros((2, 3)), ("a", "b")).axes[1]
Axis(name='b', size=3)
"""

from meltemi.haliax._core import (
    NamedArray,
    are_shape_checks_enabled,
    broadcast_arrays,
    broadcast_axis,
    broadcast_to,
    enable_shape_checks,
    flatten_axes,
    is_named_array,
    named,
    rename,
    split,
    unflatten_axis,
)
from meltemi.haliax._indexing import index, take, updated_slice
from meltemi.haliax._indexing import slice as slice
from meltemi.haliax._ops import flatten, ravel, roll, unbind
from meltemi.haliax._typing import NamedArrayAxes, NamedArrayAxesSpec

__all__ = [
    "NamedArray",
    "NamedArrayAxes",
    "NamedArrayAxesSpec",
    "are_shape_checks_enabled",
    "broadcast_arrays",
    "broadcast_axis",
    "broadcast_to",
    "enable_shape_checks",
    "flatten",
    "flatten_axes",
    "index",
    "is_named_array",
    "named",
    "ravel",
    "rename",
    "roll",
    "slice",
    "split",
    "take",
    "unbind",
    "unflatten_axis",
    "updated_slice",
]
