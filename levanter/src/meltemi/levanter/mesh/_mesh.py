"""The device mesh from `mesh.ici` / `mesh.dcn`, and the logical-axis rules onto it."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import jax
import numpy as np

from meltemi.levanter.config import MESH_AXES


class MeshConfigError(ValueError):
    """`mesh.*` values that cannot be laid out on the available devices."""


def _fill(sizes: Mapping[str, int], total: int, what: str) -> dict[str, int]:
    unknown = [a for a in sizes if a not in MESH_AXES]
    if unknown:
        raise MeshConfigError(f"mesh.{what}.{unknown[0]}: unknown mesh axis; axes are {MESH_AXES}.")
    sizes = {a: int(sizes.get(a, 1)) for a in MESH_AXES}
    free = [a for a, s in sizes.items() if s == -1]
    bad = [a for a, s in sizes.items() if s == 0 or s < -1]
    if bad:
        raise MeshConfigError(
            f"mesh.{what}.{bad[0]}={sizes[bad[0]]}: sizes are positive, or -1 to fill the rest."
        )
    if len(free) > 1:
        raise MeshConfigError(
            f"mesh.{what}: {free} are all -1; at most one axis may fill the rest "
            f"(set e.g. --config.mesh.{what}.{free[1]}=1)."
        )
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


def _slices(devices: Sequence[jax.Device], num_slices: int) -> list[list[jax.Device]]:
    if num_slices == 1:
        return [list(devices)]
    if all(hasattr(d, "slice_index") for d in devices):
        groups: dict[int, list] = {}
        for d in devices:
            groups.setdefault(d.slice_index, []).append(d)
        if len(groups) == num_slices:
            return [groups[k] for k in sorted(groups)]
    by_process: dict[int, list] = {}
    for d in devices:
        by_process.setdefault(d.process_index, []).append(d)
    if len(by_process) == num_slices:
        return [by_process[k] for k in sorted(by_process)]
    # One process holding several (fake) slices: consecutive device ids form a slice.
    per = len(devices) // num_slices
    ordered = sorted(devices, key=lambda d: d.id)
    return [ordered[i * per : (i + 1) * per] for i in range(num_slices)]


def make_mesh(
    ici: Mapping[str, int],
    dcn: Mapping[str, int] | None = None,
    *,
    num_slices: int = 1,
    devices: Sequence[jax.Device] | None = None,
) -> jax.sharding.Mesh:
    """Builds a mesh with axes `MESH_AXES`; each axis is dcn-major, ici-minor.

    Devices of one slice (TPU `slice_index`, else one process per slice, else consecutive
    ids) share the dcn coordinates, so only the dcn axes cross the slow network.

    Example:
        >>> mesh = make_mesh({"data": -1})
        >>> mesh.axis_names
        ('replica', 'data', 'fsdp', 'expert', 'tensor')
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = MeshShape.resolve(ici, dcn or {}, len(devices), num_slices)
    slices = _slices(devices, num_slices)
    ici_shape = [shape.ici[a] for a in MESH_AXES]
    per_slice = []
    for slice_devices in slices:
        try:
            from jax.experimental import mesh_utils

            grid = mesh_utils.create_device_mesh(
                ici_shape, devices=slice_devices, allow_split_physical_axes=True
            )
        except Exception:  # CPU and other backends without a physical topology
            grid = np.asarray(slice_devices, dtype=object).reshape(ici_shape)
        per_slice.append(grid)
    n = len(MESH_AXES)
    grid = np.stack(per_slice).reshape([shape.dcn[a] for a in MESH_AXES] + ici_shape)
    # (dcn_0..dcn_n, ici_0..ici_n) -> (dcn_0, ici_0, dcn_1, ici_1, ...) -> merge pairs.
    grid = grid.transpose([i for pair in zip(range(n), range(n, 2 * n)) for i in pair])
    grid = grid.reshape([shape.sizes[a] for a in MESH_AXES])
    return jax.sharding.Mesh(grid, MESH_AXES)


# Logical (model) axis -> mesh axes. Parameters are sharded over `fsdp` along the embedding
# axis and over `tensor` along heads/MLP/vocab, experts over `expert`; activations split the
# batch over every data-parallel axis (replica, data and fsdp) and keep `embed` whole.
BATCH_AXES = ("replica", "data", "fsdp")
PARAMETER_RULES: dict[str, str | tuple[str, ...] | None] = {
    "embed": "fsdp",
    "mlp": "tensor",
    "kv_heads": "tensor",
    "heads": "tensor",
    "vocab": "tensor",
    "experts": "expert",
    "batch": BATCH_AXES,
}
COMPUTE_RULES: dict[str, str | tuple[str, ...] | None] = {**PARAMETER_RULES, "embed": None}


def data_parallel_size(mesh: jax.sharding.Mesh) -> int:
    """How many ways the batch is split: the product of the batch axes' sizes."""
    return math.prod(mesh.shape[a] for a in BATCH_AXES)
