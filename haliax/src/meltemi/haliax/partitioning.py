"""Sharding by name: one `ResourceMapping` from logical axis names to mesh axes decides it all.

A NamedArray axis named `embed` is sharded over the mesh axes that `mapping["embed"]` names (a
mesh axis name, a tuple of them, or None for replicated). FSDP, tensor and data parallelism are
just different mappings; model code does not change.

An axis whose size is not divisible by the product of its mesh axes is an error that names the
axis, its size, the mesh axes and the fix (JAX requires even shards, and silently replicating a
large axis such as a vocabulary costs memory nobody asked for). `uneven="replicate"` (an
argument of `axis_mapping`, `shard`, `pspec_for_axis` and `infer_resource_partitions`) keeps
such axes whole instead, for code that uses one mapping across models of odd sizes.

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
from typing import Any, Literal, TypeAlias

import equinox as eqx
import jax
from jax._src import mesh as _jax_mesh  # `with mesh:` blocks have no public accessor
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from meltemi.haliax._core import Axis, AxisSelector, NamedArray, axis_name, is_named_array

__all__ = [
    "ResourceMapping",
    "PhysicalAxisSpec",
    "axis_mapping",
    "current_thread_local_mapping",
    "current_mesh",
    "make_mesh",
    "pspec_for_axis",
    "pspec_for",
    "physical_axis_name",
    "physical_axis_size",
    "infer_resource_partitions",
    "shard",
    "named_jit",
    "ShardingError",
    "UnevenPolicy",
    "ResourceAxis",
    "set_mesh",
    "auto_sharded",
    "shard_with_axis_mapping",
    "round_axis_for_partitioning",
    "fsdp",
    "shard_map",
]

PhysicalAxisSpec: TypeAlias = str | Sequence[str] | None
ResourceMapping: TypeAlias = Mapping[str, PhysicalAxisSpec]
"""Logical axis name -> mesh axis name(s)."""
UnevenPolicy: TypeAlias = Literal["error", "replicate"]
_UNEVEN = ("error", "replicate")


class ShardingError(ValueError):
    """A mapping or mesh that cannot shard the given arrays."""


_local = threading.local()


def current_thread_local_mapping() -> ResourceMapping | None:
    """The mapping set by the innermost `axis_mapping` context, if any."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def _current_uneven() -> UnevenPolicy | None:
    stack = getattr(_local, "uneven", None)
    return stack[-1] if stack else None


def _check_uneven(uneven: str | None) -> None:
    if uneven is not None and uneven not in _UNEVEN:
        raise ShardingError(f"uneven={uneven!r} must be one of {_UNEVEN} (or None to inherit)")


@contextlib.contextmanager
def axis_mapping(
    mapping: ResourceMapping, *, merge: bool = False, uneven: UnevenPolicy | None = None
) -> Iterator[ResourceMapping]:
    """Sets the default mapping for `shard` and `named_jit` inside the block.

    `merge=True` layers `mapping` over the enclosing one. `uneven` sets what an axis that its
    mesh axes do not divide does inside the block: `"error"` (the default) or `"replicate"`
    (`None` inherits the enclosing block's choice).
    """
    _check_uneven(uneven)
    if not hasattr(_local, "stack"):
        _local.stack = []
        _local.uneven = []
    if merge and _local.stack:
        mapping = {**_local.stack[-1], **mapping}
    _local.stack.append(dict(mapping))
    _local.uneven.append(uneven if uneven is not None else _current_uneven())
    try:
        yield mapping
    finally:
        _local.stack.pop()
        _local.uneven.pop()


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


def _legacy_mesh() -> Mesh | None:
    """The mesh of a `with mesh:` block (JAX's older context, which Haliax code still uses)."""
    env = getattr(getattr(_jax_mesh, "thread_resources", None), "env", None)
    m = getattr(env, "physical_mesh", None)
    return m if m is not None and not m.empty else None


def _mesh(mesh: Mesh | None) -> Mesh | None:
    """The explicit mesh, else named_jit's, else `jax.set_mesh`'s (abstract inside jit), else
    that of an enclosing `with mesh:` block."""
    if mesh is not None:
        return mesh
    stack = getattr(_local, "meshes", None)
    if stack and stack[-1] is not None:
        return stack[-1]
    try:
        m = jax.sharding.get_mesh()
    except ValueError:  # inside jax.jit only the abstract mesh is visible
        m = jax.sharding.get_abstract_mesh()
    if m is not None and not m.empty:
        return m
    return _legacy_mesh()


def current_mesh() -> Mesh | None:
    """The mesh `shard` and `named_jit` would use now (`jax.set_mesh`'s), or None."""
    return _mesh(None)


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
    axes: Sequence[Axis],
    mapping: ResourceMapping | None = None,
    mesh: Mesh | None = None,
    *,
    uneven: UnevenPolicy | None = None,
) -> PartitionSpec:
    """The PartitionSpec for an array with `axes` under `mapping` (checked against `mesh`).

    Args:
        axes: the array's axes, in order.
        mapping: logical axis name -> mesh axis (or tuple of mesh axes, or None). None uses
            the active `axis_mapping`.
        mesh: the mesh to check mesh-axis names and divisibility against; None skips checks.
        uneven: what to do with an axis whose size its mesh axes do not divide:
            `"error"` (the default) or `"replicate"` (keep it whole); None uses the policy of
            the enclosing `axis_mapping`.

    Raises:
        ShardingError: a mapped mesh axis is not in `mesh`, or (unless `uneven="replicate"`,
            here or in the enclosing `axis_mapping`) an axis's size is not divisible by the
            product of its mesh axes' sizes.
    """
    _check_uneven(uneven)
    mapping = _mapping(mapping)
    policy = uneven or _current_uneven() or "error"
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
            parts = math.prod(mesh.shape[n] for n in names)
            if ax.size % parts:
                if policy == "replicate":
                    spec.append(None)
                    continue
                sizes = ", ".join(f"{n!r}={mesh.shape[n]}" for n in names)
                raise ShardingError(
                    f"axis {ax.name!r} of size {ax.size} cannot be split evenly over mesh "
                    f"axis {sizes} ({ax.size} % {parts} = {ax.size % parts}). Fix: make "
                    f"{ax.name!r} a multiple of {parts} (e.g. pad it to "
                    f"{-(-ax.size // parts) * parts}), map it to a smaller mesh axis or to None "
                    f"({{{ax.name!r}: None, ...}}), or keep such axes whole with "
                    f'uneven="replicate" (hax.axis_mapping(mapping, uneven="replicate"))'
                )
        clash = [n for n in names if n in used]
        if clash:
            spec.append(None)  # a mesh axis may shard only one dimension of an array
            continue
        for n in names:
            used[n] = ax.name
        spec.append(names[0] if len(names) == 1 else names)
    return PartitionSpec(*spec)


def pspec_for(
    tree: Any,
    mapping: ResourceMapping | None = None,
    mesh: Mesh | None = None,
    *,
    uneven: UnevenPolicy | None = None,
) -> Any:
    """A PartitionSpec for each NamedArray of `tree` (None for other leaves).

    Args:
        tree: any pytree; NamedArray leaves get a NamedArray-shaped node holding the spec.
        mapping: logical axis name -> mesh axis; None uses the active `axis_mapping`.
        mesh: the mesh to check against; None uses the active mesh (if any).
        uneven: what to do with an axis whose size its mesh axes do not divide:
            `"error"` (the default) or `"replicate"` (keep it whole); None uses the policy of
            the enclosing `axis_mapping`.
    """
    m = _mesh(mesh)

    def one(x):
        if isinstance(x, NamedArray):
            spec = pspec_for_axis(x.axes, mapping, m, uneven=uneven)
            return NamedArray(spec, x.axes)  # type: ignore[arg-type]
        return None

    return jax.tree.map(one, tree, is_leaf=is_named_array)


def infer_resource_partitions(
    tree: Any,
    mapping: ResourceMapping | None = None,
    *,
    mesh: Mesh | None = None,
    preserve_existing_shardings: bool = False,
    uneven: UnevenPolicy | None = None,
) -> Any:
    """A NamedSharding for every array leaf (NamedArrays by name; other arrays replicated).

    NamedArray leaves get a NamedArray-shaped tree node, so the result is a prefix of `tree`
    suitable for `jax.jit(in_shardings=...)` or `jax.device_put`.

    Args:
        tree: any pytree of NamedArrays, arrays and other leaves (the latter map to None).
        mapping: logical axis name -> mesh axis; None uses the active `axis_mapping`.
        mesh: the mesh; None uses the active mesh, and with neither this raises.
        preserve_existing_shardings: keep a NamedArray's current `NamedSharding` instead of
            recomputing it from `mapping`.
        uneven: what to do with an axis whose size its mesh axes do not divide:
            `"error"` (the default) or `"replicate"` (keep it whole); None uses the policy of
            the enclosing `axis_mapping`.
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
                s = NamedSharding(m, pspec_for_axis(x.axes, mapping, m, uneven=uneven))
            return NamedArray(s, x.axes)  # type: ignore[arg-type]
        if isinstance(x, jax.Array | jax.ShapeDtypeStruct) or hasattr(x, "shape"):
            return NamedSharding(m, PartitionSpec())
        return None

    return jax.tree.map(one, tree, is_leaf=is_named_array)


def _freeze(mapping: ResourceMapping | None) -> tuple | None:
    """A hashable form of a mapping (a static jit argument)."""
    if mapping is None:
        return None
    return tuple(
        sorted((k, v if v is None or isinstance(v, str) else tuple(v)) for k, v in mapping.items())
    )


def _is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def shard(
    x: Any,
    mapping: ResourceMapping | None = None,
    mesh: Mesh | None = None,
    *,
    uneven: UnevenPolicy | None = None,
) -> Any:
    """Places (outside jit) or constrains (inside jit) every NamedArray of `x` by name.

    With no mesh available this is the identity, so model code can call it unconditionally.

    Args:
        x: any pytree; only NamedArray leaves are placed or constrained.
        mapping: logical axis name -> mesh axis; None uses the active `axis_mapping`.
        mesh: the mesh; None uses the active mesh (no mesh: identity).
        uneven: what to do with an axis whose size its mesh axes do not divide:
            `"error"` (the default) or `"replicate"` (keep it whole); None uses the policy of
            the enclosing `axis_mapping`.
    """
    m = _mesh(mesh)
    if m is None:
        return x
    mapping = _mapping(mapping)

    def one(leaf):
        if not isinstance(leaf, NamedArray):
            return leaf
        s = NamedSharding(m, pspec_for_axis(leaf.axes, mapping, m, uneven=uneven))
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

    Inside `fn`, `axis_resources` is the active `axis_mapping` (so `hax.shard(x)` uses it);
    without it, the `axis_mapping` active at each *call* is used, and a call under a different
    mapping compiles anew with that mapping's layouts. Inputs are constrained with
    `in_axis_resources` and outputs with `out_axis_resources` (both default to the compute
    mapping). Non-array arguments are static, as in `eqx.filter_jit`.
    `donate_args=True` donates every array argument (haliax takes a per-argument prefix).
    Typical FSDP: parameters' `embed` -> "data" for storage, batch -> "data" for compute.

    Args:
        fn: the function to compile (or None, to use `named_jit(...)` as a decorator).
        axis_resources: the compute mapping active inside `fn`; None uses the mapping
            active at each call.
        in_axis_resources: the mapping inputs are constrained to (default: the compute one).
        out_axis_resources: the mapping outputs are constrained to (default: the compute one).
        mesh: the mesh; None uses the active mesh at each call.
        donate_args: donate every array argument's buffer to the computation.

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

    def resolve(explicit: ResourceMapping | None, default: ResourceMapping | None):
        return explicit if explicit is not None else default

    def inner(mesh_, maps, *args, **kwargs):
        *frozen, uneven = maps
        compute, in_map, out_map = (None if m is None else dict(m) for m in frozen)
        with axis_mapping(compute or {}, uneven=uneven), _using_mesh(mesh_):
            if in_map is not None:
                args, kwargs = shard((args, kwargs), in_map, mesh)
            out = fn(*args, **kwargs)
            if out_map is not None:
                out = shard(out, out_map, mesh)
        return out

    donate = "all" if donate_args else "none"
    jitted = eqx.filter_jit(inner, donate=donate)

    def maps_now() -> tuple[Any, ...]:
        # Read the ambient mapping at *call* time and make it part of the jit cache key (a
        # static argument), so a later call under another `axis_mapping` retraces with it.
        compute = resolve(axis_resources, current_thread_local_mapping())
        in_map = resolve(in_axis_resources, compute)
        out_map = resolve(out_axis_resources, compute)
        return (*(_freeze(m) for m in (compute, in_map, out_map)), _current_uneven())

    @functools.wraps(fn)
    def call(*args, **kwargs):
        m = _mesh(mesh)
        maps = maps_now()
        if maps[1] is not None and m is not None:
            # place concrete inputs first so the compiled function sees their final shardings
            args, kwargs = shard((args, kwargs), dict(maps[1]), m, uneven=maps[3])
        return jitted(m, maps, *args, **kwargs)

    call.lower = lambda *a, **k: _Lowered(jitted.lower(_mesh(mesh), maps_now(), *a, **k))  # type: ignore[attr-defined]
    return call


class _Lowered:
    """What `named_jit(f).lower(...)` returns: equinox's `Lowered` (`.lowered`, `.compile()`),
    which also answers the methods of JAX's `jax.stages.Lowered` (`cost_analysis`, ...) that
    Haliax's `named_jit` returns."""

    def __init__(self, eqx_lowered: Any):
        self._eqx = eqx_lowered

    def __getattr__(self, name: str) -> Any:
        if hasattr(self._eqx, name):
            return getattr(self._eqx, name)
        return getattr(self._eqx.lowered, name)


# --- Haliax's remaining partitioning names -----------------------------------------------------


class ResourceAxis:
    """Conventional mesh axis names (plain strings: `ResourceAxis.DATA == "data"`)."""

    MODEL = "model"
    DATA = "data"
    REPLICA = "replica"
    REPLICA_DCN = "replica_dcn"
    CONTEXT = "context"


def set_mesh(mesh: Mesh) -> Any:
    """`jax.set_mesh(mesh)`: use as a context manager (`with hax.set_mesh(mesh): ...`)."""
    return jax.set_mesh(mesh)


def auto_sharded(x: Any, mesh: Mesh | None = None) -> Any:
    """`shard(x)` under the ambient `axis_mapping`; the identity when there is none."""
    if current_thread_local_mapping() is None:
        return x
    return shard(x, None, mesh)


def shard_with_axis_mapping(x: Any, mapping: ResourceMapping, mesh: Mesh | None = None) -> Any:
    """Haliax's older name for `shard(x, mapping, mesh)`."""
    return shard(x, mapping, mesh)


def round_axis_for_partitioning(axis: Axis, mapping: ResourceMapping | None = None) -> Axis:
    """`axis` grown to the next multiple of the number of shards it is split into (on the
    current mesh), e.g. to pad a vocabulary so it can be sharded."""
    parts = physical_axis_size(axis, mapping)
    return axis.resize(-(-axis.size // parts) * parts)


def fsdp(*args: Any, **kwargs: Any) -> Any:
    """`named_jit` for FSDP: arguments and results sharded by `parameter_mapping`, the body run
    under `compute_mapping`. `fsdp(fn, parameter_mapping, compute_mapping)`, or as a decorator
    `@fsdp(parameter_mapping, compute_mapping)`."""
    if "fn" in kwargs or (args and callable(args[0])):
        return _fsdp(*args, **kwargs)
    return lambda fn: _fsdp(fn, *args, **kwargs)


def _fsdp(
    fn: Callable, parameter_mapping: ResourceMapping, compute_mapping: ResourceMapping
) -> Callable:
    return named_jit(
        fn,
        compute_mapping,
        in_axis_resources=parameter_mapping,
        out_axis_resources=parameter_mapping,
    )


def _global_axes(local: Sequence[Axis], mapping: ResourceMapping, mesh: Mesh) -> tuple[Axis, ...]:
    """Global axes of a shard_map output whose per-device axes are `local` (each mesh axis
    splits at most one array axis, as in `pspec_for_axis`)."""
    used: set[str] = set()
    out = []
    for ax in local:
        phys = mapping.get(ax.name)
        names = () if phys is None else ((phys,) if isinstance(phys, str) else tuple(phys))
        if any(n in used for n in names):
            names = ()
        used.update(names)
        out.append(ax.resize(ax.size * math.prod(mesh.shape[n] for n in names)))
    return tuple(out)


def shard_map(
    f: Callable | None = None,
    *,
    in_specs: Any = None,
    out_specs: Any = None,
    mesh: Mesh | None = None,
    axis_mapping: ResourceMapping | None = None,
    check_rep: bool = False,
    **shmap_kwargs: Any,
) -> Callable:
    """`jax.shard_map` for NamedArrays: specs come from axis names and the mapping.

    Inside `f`, NamedArrays have their per-device axis sizes (e.g. `batch` of size 8 on 4
    devices is `batch` of size 2); outputs are put back together by name. Non-array arguments
    are passed through unchanged.

    Args:
        f: the per-device function (or None, to use `shard_map(...)` as a decorator).
        in_specs: PartitionSpecs, a prefix of the positional arguments (default: from names).
        out_specs: PartitionSpecs for the outputs (default: from the outputs' axis names).
        mesh: the mesh (default: the current one).
        axis_mapping: logical-to-mesh mapping (default: the ambient `axis_mapping`).
        check_rep: check replication of outputs (`check_vma` of `jax.shard_map`).
        **shmap_kwargs: passed to `jax.shard_map`.

    Returns:
        The wrapped function.
    """
    if f is None:
        return lambda fn: shard_map(
            fn,
            in_specs=in_specs,
            out_specs=out_specs,
            mesh=mesh,
            axis_mapping=axis_mapping,
            check_rep=check_rep,
            **shmap_kwargs,
        )

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        m = _mesh(mesh)
        if m is None:
            raise ShardingError(
                "shard_map needs a mesh: pass mesh=... or call it under jax.set_mesh(mesh)"
            )
        mapping = _mapping(axis_mapping)
        dynamic, static = eqx.partition(
            (args, kwargs), lambda x: is_named_array(x) or eqx.is_array(x), is_leaf=is_named_array
        )
        leaves, treedef = jax.tree_util.tree_flatten(dynamic, is_leaf=is_named_array)
        if in_specs is None:
            specs = [
                pspec_for_axis(x.axes, mapping, m) if isinstance(x, NamedArray) else PartitionSpec()
                for x in leaves
            ]
        else:
            specs = _broadcast_specs((in_specs, {}), dynamic)
        raws = [x.array if isinstance(x, NamedArray) else x for x in leaves]
        metas = [x.axes if isinstance(x, NamedArray) else None for x in leaves]
        out_info: dict[str, Any] = {}

        def inner(*raw: Any) -> Any:
            rebuilt = [
                r if ax is None else NamedArray(r, tuple(a.resize(s) for a, s in zip(ax, r.shape)))
                for r, ax in zip(raw, metas)
            ]
            dyn = jax.tree_util.tree_unflatten(treedef, rebuilt)
            a, kw = eqx.combine(dyn, static, is_leaf=is_named_array)
            out = f(*a, **kw)
            o_leaves, o_tree = jax.tree_util.tree_flatten(out, is_leaf=is_named_array)
            out_info["tree"] = o_tree
            out_info["axes"] = [o.axes if isinstance(o, NamedArray) else None for o in o_leaves]
            return [o.array if isinstance(o, NamedArray) else o for o in o_leaves]

        def run(o_specs: Any) -> Any:
            return jax.shard_map(
                inner,
                mesh=m,
                in_specs=tuple(specs),
                out_specs=o_specs,
                check_vma=check_rep,
                **shmap_kwargs,
            )(*raws)

        if out_specs is None:
            jax.eval_shape(lambda: run(PartitionSpec()))  # per-device output axes
            o_axes = [
                None if ax is None else _global_axes(ax, mapping, m) for ax in out_info["axes"]
            ]
            o_specs = [
                PartitionSpec() if ax is None else pspec_for_axis(ax, mapping, m) for ax in o_axes
            ]
        else:
            o_specs = out_specs
        out_raw = run(o_specs)
        out = [
            r if ax is None else NamedArray(r, tuple(a.resize(s) for a, s in zip(ax, r.shape)))
            for r, ax in zip(out_raw, out_info["axes"])
        ]
        return jax.tree_util.tree_unflatten(out_info["tree"], out)

    return wrapper


def _broadcast_specs(specs: Any, tree: Any) -> list[Any]:
    """One PartitionSpec per array leaf of `tree`, from a prefix tree of specs."""
    out: list[Any] = []

    def expand(spec: Any, sub: Any) -> None:
        n = len(jax.tree_util.tree_leaves(sub, is_leaf=is_named_array))
        out.extend([spec] * n)

    jax.tree.map(expand, specs, tree, is_leaf=lambda s: isinstance(s, PartitionSpec) or s is None)
    return out
