"""Sharding by name: one `ResourceMapping` from logical axis names to mesh axes decides it all.

A NamedArray axis named `embed` is sharded over the mesh axes that `mapping["embed"]` names (a
mesh axis name, a tuple of them, or None for replicated). FSDP, tensor and data parallelism are
just different mappings; model code does not change.

Axes whose size is not divisible by the product of their mesh axes are left replicated (JAX
requires even shards), so odd sizes such as a vocabulary of 11 never fail.

The mesh comes from the `mesh=` argument or else from `jax.set_mesh(mesh)`. Build meshes with
`make_mesh`, whose axes are `AxisType.Auto` (the compiler propagates shardings).

>>> import jax
>>> import meltemi.haliax as hax
>>> from meltemi.haliax import partitioning as P
>>> P.pspec_for_axis((hax.Axis("batch", 4), hax.Axis("embed", 8)), {"batch": "data"})
P('data', None)
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeAlias

import equinox as eqx
import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from meltemi.haliax._core import Axis, AxisSelector, NamedArray, axis_name, is_named_array

__all__ = [
    "ResourceMapping",
    "PhysicalAxisSpec",
    "axis_mapping",
    "current_thread_local_mapping",
    "make_mesh",
    "pspec_for_axis",
    "pspec_for",
    "physical_axis_name",
    "physical_axis_size",
    "infer_resource_partitions",
    "shard",
    "named_jit",
    "ShardingError",
]

PhysicalAxisSpec: TypeAlias = str | Sequence[str] | None
ResourceMapping: TypeAlias = Mapping[str, PhysicalAxisSpec]
"""Logical axis name -> mesh axis name(s)."""


class ShardingError(ValueError):
    """A mapping or mesh that cannot shard the given arrays."""


_local = threading.local()


def current_thread_local_mapping() -> ResourceMapping | None:
    """The mapping set by the innermost `axis_mapping` context, if any."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def axis_mapping(mapping: ResourceMapping, *, merge: bool = False) -> Iterator[ResourceMapping]:
    """Sets the default mapping for `shard` and `named_jit` inside the block.

    `merge=True` layers `mapping` over the enclosing one.
    """
    if not hasattr(_local, "stack"):
        _local.stack = []
    if merge and _local.stack:
        mapping = {**_local.stack[-1], **mapping}
    _local.stack.append(dict(mapping))
    try:
        yield mapping
    finally:
        _local.stack.pop()


def make_mesh(shape: Mapping[str, int], devices: Sequence[Any] | None = None) -> Mesh:
    """A mesh with `AxisType.Auto` axes: `make_mesh({"data": 4, "model": 2})`."""
    names = tuple(shape)
    sizes = tuple(shape.values())
    n = math.prod(sizes)
    devices = list(devices) if devices is not None else jax.devices()[:n]
    if len(devices) < n:
        raise ShardingError(
            f"make_mesh: mesh {dict(shape)} needs {n} devices but only {len(devices)} exist "
            f"(for CPU tests set XLA_FLAGS=--xla_force_host_platform_device_count={n})"
        )
    return jax.make_mesh(
        sizes, names, axis_types=(AxisType.Auto,) * len(names), devices=devices[:n]
    )


def _mesh(mesh: Mesh | None) -> Mesh | None:
    """The explicit mesh, else named_jit's, else `jax.set_mesh`'s (abstract inside jit)."""
    if mesh is not None:
        return mesh
    stack = getattr(_local, "meshes", None)
    if stack:
        return stack[-1]
    try:
        m = jax.sharding.get_mesh()
    except ValueError:  # inside jax.jit only the abstract mesh is visible
        m = jax.sharding.get_abstract_mesh()
    return m if m is not None and not m.empty else None


@contextlib.contextmanager
def _using_mesh(mesh: Mesh | None) -> Iterator[None]:
    if not hasattr(_local, "meshes"):
        _local.meshes = []
    _local.meshes.append(mesh)
    try:
        yield
    finally:
        _local.meshes.pop()


def _mapping(mapping: ResourceMapping | None) -> ResourceMapping:
    if mapping is None:
        mapping = current_thread_local_mapping()
    return {} if mapping is None else mapping


def physical_axis_name(axis: AxisSelector, mapping: ResourceMapping | None = None):
    """The mesh axis (or axes) a logical axis maps to, or None."""
    return _mapping(mapping).get(axis_name(axis))  # type: ignore[arg-type]


def physical_axis_size(axis: AxisSelector, mapping: ResourceMapping | None = None, mesh=None):
    """How many shards the mapping cuts `axis` into on the mesh (1 if unmapped)."""
    phys = physical_axis_name(axis, mapping)
    m = _mesh(mesh)
    if phys is None or m is None:
        return 1
    names = (phys,) if isinstance(phys, str) else tuple(phys)
    return math.prod(m.shape[n] for n in names)


def pspec_for_axis(
    axes: Sequence[Axis], mapping: ResourceMapping | None = None, mesh: Mesh | None = None
) -> PartitionSpec:
    """The PartitionSpec for an array with `axes` under `mapping` (checked against `mesh`)."""
    mapping = _mapping(mapping)
    used: dict[str, str] = {}
    spec = []
    for ax in axes:
        phys = mapping.get(ax.name)
        if phys is None:
            spec.append(None)
            continue
        names = (phys,) if isinstance(phys, str) else tuple(phys)
        if mesh is not None:
            for n in names:
                if n not in mesh.shape:
                    raise ShardingError(
                        f"mapping sends axis {ax.name!r} to mesh axis {n!r}, but the mesh has "
                        f"axes {dict(mesh.shape)}; fix the ResourceMapping"
                    )
            if ax.size % math.prod(mesh.shape[n] for n in names):
                spec.append(None)  # uneven: keep replicated (see module docstring)
                continue
        clash = [n for n in names if n in used]
        if clash:
            spec.append(None)  # a mesh axis may shard only one dimension of an array
            continue
        for n in names:
            used[n] = ax.name
        spec.append(names[0] if len(names) == 1 else names)
    return PartitionSpec(*spec)


def pspec_for(tree: Any, mapping: ResourceMapping | None = None, mesh: Mesh | None = None) -> Any:
    """A PartitionSpec for each NamedArray of `tree` (None for other leaves)."""
    m = _mesh(mesh)

    def one(x):
        if isinstance(x, NamedArray):
            return NamedArray(pspec_for_axis(x.axes, mapping, m), x.axes)  # type: ignore[arg-type]
        return None

    return jax.tree.map(one, tree, is_leaf=is_named_array)


def infer_resource_partitions(
    tree: Any,
    mapping: ResourceMapping | None = None,
    *,
    mesh: Mesh | None = None,
    preserve_existing_shardings: bool = False,
) -> Any:
    """A NamedSharding for every array leaf (NamedArrays by name; other arrays replicated).

    NamedArray leaves get a NamedArray-shaped tree node, so the result is a prefix of `tree`
    suitable for `jax.jit(in_shardings=...)` or `jax.device_put`.
    """
    m = _mesh(mesh)
    if m is None:
        raise ShardingError(
            "no mesh: pass mesh=... or run inside `with jax.set_mesh(mesh):` "
            "(build one with hax.partitioning.make_mesh({'data': n}))"
        )

    def one(x):
        if isinstance(x, NamedArray):
            if preserve_existing_shardings and isinstance(
                getattr(x.array, "sharding", None), NamedSharding
            ):
                s = x.array.sharding
            else:
                s = NamedSharding(m, pspec_for_axis(x.axes, mapping, m))
            return NamedArray(s, x.axes)  # type: ignore[arg-type]
        if isinstance(x, jax.Array | jax.ShapeDtypeStruct) or hasattr(x, "shape"):
            return NamedSharding(m, PartitionSpec())
        return None

    return jax.tree.map(one, tree, is_leaf=is_named_array)


def _is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def shard(x: Any, mapping: ResourceMapping | None = None, mesh: Mesh | None = None) -> Any:
    """Places (outside jit) or constrains (inside jit) every NamedArray of `x` by name.

    With no mesh available this is the identity, so model code can call it unconditionally.
    """
    m = _mesh(mesh)
    if m is None:
        return x
    mapping = _mapping(mapping)

    def one(leaf):
        if not isinstance(leaf, NamedArray):
            return leaf
        s = NamedSharding(m, pspec_for_axis(leaf.axes, mapping, m))
        arr = leaf.array
        if _is_tracer(arr):
            arr = jax.lax.with_sharding_constraint(arr, s)
        elif isinstance(arr, jax.Array):
            if arr.sharding != s:
                arr = jax.device_put(arr, s)
        else:
            return leaf
        return NamedArray(arr, leaf.axes)

    return jax.tree.map(one, x, is_leaf=is_named_array)


def named_jit(
    fn: Callable | None = None,
    axis_resources: ResourceMapping | None = None,
    *,
    in_axis_resources: ResourceMapping | None = None,
    out_axis_resources: ResourceMapping | None = None,
    mesh: Mesh | None = None,
    donate_args: bool = False,
) -> Callable:
    """`eqx.filter_jit` that shards inputs and outputs by name.

    Inside `fn`, `axis_resources` is the active `axis_mapping` (so `hax.shard(x)` uses it).
    Inputs are constrained with `in_axis_resources` and outputs with `out_axis_resources` (both
    default to `axis_resources`). Non-array arguments are static, as in `eqx.filter_jit`.
    `donate_args=True` donates every array argument (haliax takes a per-argument prefix).
    Typical FSDP: parameters' `embed` -> "data" for storage, batch -> "data" for compute.

    >>> import jax.numpy as jnp
    >>> import meltemi.haliax as hax
    >>> f = hax.named_jit(lambda x: x * 2, {"batch": "data"})
    >>> f(hax.ones(hax.Axis("batch", 3))).array
    Array([2., 2., 2.], dtype=float32)
    """
    if fn is None:
        return functools.partial(
            named_jit,
            axis_resources=axis_resources,
            in_axis_resources=in_axis_resources,
            out_axis_resources=out_axis_resources,
            mesh=mesh,
            donate_args=donate_args,
        )
    compute = axis_resources
    in_map = in_axis_resources if in_axis_resources is not None else compute
    out_map = out_axis_resources if out_axis_resources is not None else compute

    def inner(mesh_, *args, **kwargs):
        mapping = compute if compute is not None else _mapping(None)
        with axis_mapping(mapping), _using_mesh(mesh_):
            if in_map is not None:
                args, kwargs = shard((args, kwargs), in_map, mesh)
            out = fn(*args, **kwargs)
            if out_map is not None:
                out = shard(out, out_map, mesh)
        return out

    donate = "all" if donate_args else "none"
    jitted = eqx.filter_jit(inner, donate=donate)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        m = _mesh(mesh)
        if in_map is not None and m is not None:
            # place concrete inputs first so the compiled function sees their final shardings
            args, kwargs = shard((args, kwargs), in_map, m)
        return jitted(m, *args, **kwargs)

    call.lower = lambda *a, **k: jitted.lower(_mesh(mesh), *a, **k)  # type: ignore[attr-defined]
    return call
