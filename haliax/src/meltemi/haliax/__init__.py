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

from meltemi.haliax import (
    axis,
    core,
    debug,
    haxtyping,
    jax_utils,
    nn,
    partitioning,
    quantization,
    random,
    state_dict,
    tree_util,
    util,
)
from meltemi.haliax._axis_specs import (
    concat_axis_specs,
    eliminate_axes,
    make_axes,
    replace_axis,
    resolve_axis,
)
from meltemi.haliax._bitwise import *  # noqa: F403 - bitwise ops (see _bitwise.__all__)
from meltemi.haliax._bitwise import __all__ as _bitwise_all
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
    are_shape_checks_enabled,
    axis_name,
    axis_size,
    broadcast_arrays,
    broadcast_axis,
    broadcast_to,
    check_axes_match,
    concat_axes,
    enable_shape_checks,
    flatten_axes,
    is_named_array,
    named,
    rename,
    selects_axis,
    split,
    unflatten_axis,
    without_axes,
)
from meltemi.haliax._dot import dot, einsum
from meltemi.haliax._einops import rearrange, repeat, tile, unflatten
from meltemi.haliax._fft import *  # noqa: F403 - fft, ifft, rfft, ... (see _fft.__all__)
from meltemi.haliax._fft import __all__ as _fft_all
from meltemi.haliax._field import field
from meltemi.haliax._hof import fold, map, scan, vmap
from meltemi.haliax._indexing import dblock, ds, dslice, index, take, updated_slice
from meltemi.haliax._indexing import slice as slice
from meltemi.haliax._ops import *  # noqa: F403 - the elementwise ops (see _ops.__all__)
from meltemi.haliax._ops import __all__ as _ops_all
from meltemi.haliax._poly import *  # noqa: F403 - poly, polyadd, ... (see _poly.__all__)
from meltemi.haliax._poly import __all__ as _poly_all
from meltemi.haliax._reductions import *  # noqa: F403 - sum, mean, nansum, ... (see __all__)
from meltemi.haliax._reductions import __all__ as _reductions_all
from meltemi.haliax._ref import NamedRef, freeze, get, new_ref, swap
from meltemi.haliax._remat import ScanCheckpointPolicy, tree_checkpoint_name
from meltemi.haliax._setops import *  # noqa: F403 - unique, bincount, ... (see _setops.__all__)
from meltemi.haliax._setops import __all__ as _setops_all
from meltemi.haliax._typing import (
    Named,
    NamedArrayAxes,
    NamedArrayAxesSpec,
    ReductionFunction,
    SimpleReductionFunction,
)
from meltemi.haliax.partitioning import (
    auto_sharded,
    axis_mapping,
    fsdp,
    named_jit,
    set_mesh,
    shard,
    shard_map,
    shard_with_axis_mapping,
)

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "Axis",
    "axis",
    "core",
    "haxtyping",
    "jax_utils",
    "AxisError",
    "AxisNotFoundError",
    "AxisSelection",
    "AxisSelector",
    "AxisSizeMismatchError",
    "AxisSpec",
    "DuplicateAxisError",
    "Named",
    "NamedArray",
    "NamedArrayAxes",
    "NamedArrayAxesSpec",
    "NamedRef",
    "ReductionFunction",
    "ScanCheckpointPolicy",
    "SimpleReductionFunction",
    "are_shape_checks_enabled",
    "auto_sharded",
    "axis_mapping",
    "axis_name",
    "axis_size",
    "broadcast_arrays",
    "broadcast_axis",
    "broadcast_to",
    "check_axes_match",
    "concat_axes",
    "concat_axis_specs",
    "dblock",
    "debug",
    "dot",
    "ds",
    "dslice",
    "einsum",
    "eliminate_axes",
    "enable_shape_checks",
    "field",
    "flatten_axes",
    "fold",
    "fsdp",
    "freeze",
    "get",
    "index",
    "is_named_array",
    "make_axes",
    "map",
    "named",
    "named_jit",
    "new_ref",
    "nn",
    "partitioning",
    "quantization",
    "random",
    "rearrange",
    "repeat",
    "tile",
    "unflatten",
    "rename",
    "replace_axis",
    "resolve_axis",
    "scan",
    "selects_axis",
    "set_mesh",
    "shard",
    "shard_map",
    "shard_with_axis_mapping",
    "slice",
    "split",
    "state_dict",
    "swap",
    "take",
    "tree_checkpoint_name",
    "tree_util",
    "unflatten_axis",
    "updated_slice",
    "util",
    "vmap",
    "without_axes",
    *_bitwise_all,
    *_fft_all,
    *_ops_all,
    *_poly_all,
    *_reductions_all,
    *_setops_all,
]
