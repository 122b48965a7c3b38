"""Shardings of the train state and batch from logical axis names (through haliax).

A parameter that is a haliax `NamedArray` is sharded by its axis names through the rules
(e.g. `embed -> fsdp`, `mlp -> tensor`); any other array is replicated. A mesh axis is used
at most once per array, and a dimension whose size it does not divide stays whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import meltemi.haliax as hax
from meltemi.levanter.mesh import BATCH_AXES

Rules = Mapping[str, str | tuple[str, ...] | None]


def tree_shardings(tree: Any, mesh: Mesh, rules: Rules) -> Any:
    """A NamedSharding for every array of `tree`: NamedArrays by axis name, others replicated.

    The result is a prefix tree of `tree`, usable as `jax.jit(in_shardings=...)`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import meltemi.haliax as hax
        >>> mesh = jax.make_mesh((1,), ("fsdp",))
        >>> w = hax.named(jnp.zeros((4, 3)), ("embed", "mlp"))
        >>> tree_shardings({"w": w}, mesh, {"embed": "fsdp"})["w"].array.spec
        P('fsdp', None)
    """
    return hax.partitioning.infer_resource_partitions(tree, rules, mesh=mesh, uneven="replicate")


def with_shardings(shardings: Any, abstract: Any) -> Any:
    """Attaches `shardings` (a prefix tree) to the ShapeDtypeStructs of `abstract`."""

    def attach(sharding, subtree):
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), subtree
        )

    return jax.tree.map(attach, shardings, abstract)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Batch arrays are split along their first dimension over every data-parallel axis."""
    axes = tuple(a for a in BATCH_AXES if mesh.shape[a] > 1)
    return NamedSharding(mesh, PartitionSpec(axes if axes else None))


def global_batch(local: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Assembles this process's rows of a batch into global arrays sharded over the mesh."""
    sharding = batch_sharding(mesh)
    out = {}
    for key, value in local.items():
        value = np.asarray(value)
        global_shape = (value.shape[0] * jax.process_count(),) + value.shape[1:]
        out[key] = jax.make_array_from_process_local_data(sharding, value, global_shape)
    return out
