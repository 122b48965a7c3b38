"""The device mesh from `mesh.ici` / `mesh.dcn`, and the logical-axis rules onto it."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils

# Mesh axes, outermost first. `replica` and `data` are pure data parallelism, `fsdp` shards
# parameters and optimizer state too, `tensor` shards within a layer, `expert` shards experts,
# `sequence` splits the positions of every activation (context parallelism: attention then
# exchanges keys and values over it, `model.sequence_parallel`). `sequence` and `tensor` are
# innermost: they talk every layer.
MESH_AXES = ("replica", "data", "fsdp", "expert", "sequence", "tensor")


class MeshConfigError(ValueError):
    """`mesh.*` values that cannot be laid out on the available devices."""


def check_sizes(sizes: Mapping[str, int], what: str) -> dict[str, int]:
    """Checks one level's sizes without devices (axis names, positive or one -1).

    Example:
        >>> check_sizes({"fsdp": -1, "tensor": 2}, "ici")["tensor"]
        2
    """
    unknown = [a for a in sizes if a not in MESH_AXES]
    if unknown:
        raise MeshConfigError(f"mesh.{what}.{unknown[0]}: unknown mesh axis; axes are {MESH_AXES}.")
    bools = [a for a, s in sizes.items() if isinstance(s, bool) or not isinstance(s, int)]
    if bools:
        raise MeshConfigError(
            f"mesh.{what}.{bools[0]}={sizes[bools[0]]!r}: a size is an int (or -1 to fill)."
        )
    sizes = {a: int(sizes.get(a, 1)) for a in MESH_AXES}
    bad = [a for a, s in sizes.items() if s == 0 or s < -1]
    if bad:
        raise MeshConfigError(
            f"mesh.{what}.{bad[0]}={sizes[bad[0]]}: sizes are positive, or -1 to fill the rest."
        )
    free = [a for a, s in sizes.items() if s == -1]
    if len(free) > 1:
        raise MeshConfigError(
            f"mesh.{what}: {free} are all -1; at most one axis may fill the rest "
            f"(set e.g. --config.mesh.{what}.{free[1]}=1)."
        )
    return sizes


def _fill(sizes: Mapping[str, int], total: int, what: str) -> dict[str, int]:
    sizes = check_sizes(sizes, what)
    free = [a for a, s in sizes.items() if s == -1]
    fixed = math.prod(s for s in sizes.values() if s != -1)
    if free:
        if total % fixed:
            raise MeshConfigError(
                f"mesh.{what}: the fixed sizes multiply to {fixed}, which does not divide the "
                f"{total} devices available; pick sizes whose product divides {total}."
            )
        sizes[free[0]] = total // fixed
    elif fixed != total:
        raise MeshConfigError(
            f"mesh.{what}: sizes {sizes} multiply to {fixed}, but there are {total} "
            f"{'slices' if what == 'dcn' else 'devices per slice'}; set one axis to -1 to fill."
        )
    return sizes


@dataclasses.dataclass(frozen=True)
class MeshShape:
    """Sizes of each mesh axis within a slice (ici) and across slices (dcn).

    Example:
        >>> shape = MeshShape.resolve({"fsdp": -1, "tensor": 2}, {"data": -1}, 8, 2)
        >>> shape.ici["fsdp"], shape.dcn["data"], shape.sizes["data"]
        (2, 2, 2)
    """

    ici: Mapping[str, int]
    dcn: Mapping[str, int]

    @classmethod
    def resolve(
        cls, ici: Mapping[str, int], dcn: Mapping[str, int], num_devices: int, num_slices: int
    ) -> MeshShape:
        """Fills the -1 entries so that ici multiplies to devices per slice, dcn to slices."""
        if num_slices < 1 or num_devices % num_slices:
            raise MeshConfigError(
                f"mesh.num_slices={num_slices} does not divide the {num_devices} devices."
            )
        return cls(_fill(ici, num_devices // num_slices, "ici"), _fill(dcn, num_slices, "dcn"))

    @property
    def sizes(self) -> dict[str, int]:
        """The global size of each axis: ici size times dcn size."""
        return {a: self.ici[a] * self.dcn[a] for a in MESH_AXES}


def _granule(devices: Sequence[jax.Device], num_slices: int) -> str | None:
    """What marks a slice: TPU `slice_index`, else one process per slice, else nothing."""
    if all(hasattr(d, "slice_index") for d in devices):
        if len({d.slice_index for d in devices}) == num_slices:
            return "slice"
    if len({d.process_index for d in devices}) == num_slices:
        return "process"
    return None


def make_mesh(
    ici: Mapping[str, int],
    dcn: Mapping[str, int] | None = None,
    *,
    num_slices: int = 1,
    devices: Sequence[jax.Device] | None = None,
) -> jax.sharding.Mesh:
    """Builds a mesh with axes `MESH_AXES`; each axis is dcn-major, ici-minor.

    Devices of one slice (TPU `slice_index`, else one process per slice) share the dcn
    coordinates, so only the dcn axes cross the slow network: that grid is
    `jax.experimental.mesh_utils.create_hybrid_device_mesh`'s. One process holding several
    slices (fake CPU devices, in tests) takes consecutive device ids as a slice.

    Example:
        >>> mesh = make_mesh({"data": -1})
        >>> mesh.axis_names
        ('replica', 'data', 'fsdp', 'expert', 'sequence', 'tensor')
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = MeshShape.resolve(ici, dcn or {}, len(devices), num_slices)
    ici_shape = [shape.ici[a] for a in MESH_AXES]
    dcn_shape = [shape.dcn[a] for a in MESH_AXES]
    granule = _granule(devices, num_slices)
    if num_slices == 1:
        grid = mesh_utils.create_device_mesh(
            ici_shape, devices=devices, allow_split_physical_axes=True
        )
    elif granule is not None:
        grid = mesh_utils.create_hybrid_device_mesh(
            ici_shape,
            dcn_shape,
            devices=devices,
            process_is_granule=granule == "process",
            allow_split_physical_axes=True,
        )
    else:
        per = len(devices) // num_slices
        ordered = sorted(devices, key=lambda d: d.id)
        blocks = np.empty(num_slices, dtype=object)
        for i in range(num_slices):
            blocks[i] = np.asarray(ordered[i * per : (i + 1) * per], dtype=object).reshape(
                ici_shape
            )
        grid = np.block(blocks.reshape(dcn_shape).tolist())
    return jax.sharding.Mesh(grid, MESH_AXES)


# Logical (model) axis -> mesh axes. Parameters are sharded over `fsdp` (and `sequence`,
# whose devices would otherwise each hold a whole copy: FSDP over the context-parallel group,
# as torchtitan does) along the embedding axis and over `tensor` along heads/MLP/vocab,
# experts over `expert`; activations split the batch over every data-parallel axis (replica,
# data and fsdp), their positions over `sequence` (a no-op at size 1), and keep `embed` whole.
BATCH_AXES = ("replica", "data", "fsdp", "expert")
PARAMETER_RULES: dict[str, str | tuple[str, ...] | None] = {
    "embed": ("fsdp", "sequence"),
    "mlp": "tensor",
    "kv_heads": "tensor",
    "heads": "tensor",
    "vocab": "tensor",
    "experts": "expert",
    "batch": BATCH_AXES,
}
COMPUTE_RULES: dict[str, str | tuple[str, ...] | None] = {
    **PARAMETER_RULES,
    "embed": None,
    "position": "sequence",
}


def data_parallel_size(mesh: jax.sharding.Mesh) -> int:
    """How many ways the batch is split: the product of the batch axes' sizes."""
    return math.prod(mesh.shape[a] for a in BATCH_AXES)


def check_sequence_split(split: int, seq_len: int, strategy: str) -> int:
    """`split` (the size of the `sequence` mesh axis), checked against the length and strategy.

    Args:
        split: devices the `sequence` axis splits each row over (1: no split).
        seq_len: `data.seq_len`.
        strategy: `model.sequence_parallel` (`none`, `all_gather` or `ring`).

    Raises:
        MeshConfigError: a split without a strategy (attention would gather every key on every
            device behind the user's back), or a length that two chunks per device (causal
            load balancing) do not divide.

    Example:
        >>> check_sequence_split(4, 4096, "ring")
        4
    """
    if split == 1:
        return 1
    if strategy == "none":
        raise MeshConfigError(
            f"mesh sequence axis of {split} devices (mesh.ici.sequence x mesh.dcn.sequence) "
            "with model.sequence_parallel='none': attention needs a strategy to exchange keys "
            "across the split; set --config.model.sequence_parallel=ring (or all_gather), or "
            "--config.mesh.ici.sequence=1."
        )
    if seq_len % (2 * split):
        fit = -(-seq_len // (2 * split)) * (2 * split)
        raise MeshConfigError(
            f"data.seq_len={seq_len} does not split over the mesh sequence axis of {split} "
            f"devices in two chunks each (causal load balancing); use --config.data.seq_len="
            f"{fit} (a multiple of {2 * split})."
        )
    return split
