"""The compute context model code is traced in, and the mesh of a config."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import jax

import meltemi.haliax as hax
from meltemi.levanter.config import ConfigError, RunSpec
from meltemi.levanter.mesh import COMPUTE_RULES, MeshConfigError, make_mesh


def compute_context(mesh: jax.sharding.Mesh) -> contextlib.ExitStack:
    """The mesh and logical-axis mapping model code sees while the step is traced."""
    stack = contextlib.ExitStack()
    stack.enter_context(jax.set_mesh(mesh))
    stack.enter_context(hax.axis_mapping(COMPUTE_RULES, uneven="replicate"))
    return stack


def mesh_of(spec: RunSpec, devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
    """The mesh of `spec.mesh` on `devices` (default: every device); errors are ConfigErrors."""
    try:
        return make_mesh(
            spec.mesh.ici_sizes,
            spec.mesh.dcn_sizes,
            num_slices=spec.mesh.num_slices,
            devices=devices,
        )
    except MeshConfigError as e:
        count = len(devices) if devices is not None else jax.device_count()
        raise ConfigError(f"{e} ({count} devices)") from None
