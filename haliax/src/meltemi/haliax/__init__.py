"""meltemi.haliax: named-axis tensors on JAX and equinox.

Axes are values (`Axis("embed", 8)`), ops contract and broadcast by name, and one mapping from
logical axis names to mesh axes decides sharding (`meltemi.haliax.partitioning`).

>>> import jax.numpy as jnp
>>> import meltemi.haliax as hax
>>> Batch, Embed = hax.Axis("batch", 3), hax.Axis("embed", 5)
>>> x = hax.named(jnp.ones((3, 5)), (Batch, Embed))
>>> hax.sum(x, axis=Embed).array
Array([5., 5., 5.], dtype=float32)
>>> hax.__version__
'0.1.0'
"""

from meltemi.haliax import _methods as _methods  # installs NamedArray operators and methods
from meltemi.haliax import nn, partitioning, random, state_dict
from meltemi.haliax._core import (
    Axis,
    AxisError,
    AxisNotFoundError,
    AxisSelection,
    AxisSelector,
    AxisSizeMismatchError,
    AxisSpec,
    DuplicateAxisError,
    NamedArray,
    axis_name,
    axis_size,
    broadcast_arrays,
    broadcast_axis,
    broadcast_to,
    check_axes_match,
    concat_axes,
    flatten_axes,
    is_named_array,
    named,
    rearrange,
    rename,
    selects_axis,
    split,
    unflatten_axis,
    without_axes,
)
from meltemi.haliax._dot import dot, einsum
from meltemi.haliax._hof import fold, map, scan, vmap
from meltemi.haliax._indexing import ds, dslice, index, take, updated_slice
from meltemi.haliax._indexing import slice as slice  # noqa: A004
from meltemi.haliax._ops import *  # noqa: F403 - the elementwise ops (see _ops.__all__)
from meltemi.haliax._ops import __all__ as _ops_all
from meltemi.haliax._reductions import (
    all,
    any,
    argmax,
    argmin,
    count_nonzero,
    logsumexp,
    max,
    mean,
    min,
    prod,
    std,
    sum,
    var,
)
from meltemi.haliax._remat import ScanCheckpointPolicy
from meltemi.haliax.partitioning import axis_mapping, named_jit, shard

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "Axis",
    "AxisError",
    "AxisNotFoundError",
    "AxisSelection",
    "AxisSelector",
    "AxisSizeMismatchError",
    "AxisSpec",
    "DuplicateAxisError",
    "NamedArray",
    "ScanCheckpointPolicy",
    "all",
    "any",
    "argmax",
    "argmin",
    "axis_mapping",
    "axis_name",
    "axis_size",
    "broadcast_arrays",
    "broadcast_axis",
    "broadcast_to",
    "check_axes_match",
    "concat_axes",
    "count_nonzero",
    "dot",
    "ds",
    "dslice",
    "einsum",
    "flatten_axes",
    "fold",
    "index",
    "is_named_array",
    "logsumexp",
    "map",
    "max",
    "mean",
    "min",
    "named",
    "named_jit",
    "nn",
    "partitioning",
    "prod",
    "random",
    "rearrange",
    "rename",
    "scan",
    "selects_axis",
    "shard",
    "slice",
    "split",
    "state_dict",
    "std",
    "sum",
    "take",
    "unflatten_axis",
    "updated_slice",
    "var",
    "vmap",
    "without_axes",
    *_ops_all,
]
