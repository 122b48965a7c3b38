"""`mesh.*`: axis sizes within a slice (ici) and across slices (dcn), slices and elasticity."""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from meltemi.levanter.config._checks import AtLeast, InSection, check_int
from meltemi.levanter.config._errors import ConfigError
from meltemi.levanter.config._keys import key, read
from meltemi.levanter.mesh import MESH_AXES, MeshConfigError, check_sequence_split, check_sizes

_SIZES = {a: (-1 if a == "data" else 1) for a in MESH_AXES}


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshSpec:
    """`mesh.*`: axis sizes within a slice (ici) and across slices (dcn); -1 fills the rest."""

    num_slices: int = key(1, "Slices the job trains on.", AtLeast(1, example=2))
    min_slices: int = key(
        0,
        "Elastic multislice: the fewest slices the job keeps training on when slices are lost "
        "(it grows back to num_slices as replacements join). 0: num_slices (a lost slice is "
        "waited for).",
        InSection(wrong=-1),
    )
    ici: tuple[tuple[str, int], ...] = key(
        _SIZES,
        "Axis sizes within a slice, one key per axis (mesh.ici.data, ...); -1 fills the rest.",
        InSection(wrong={"data": -1, "fsdp": 0}),
    )
    dcn: tuple[tuple[str, int], ...] = key(
        _SIZES,
        "Axis sizes across slices, one key per axis (mesh.dcn.data, ...); -1 fills the rest.",
        InSection(wrong={"data": -1, "fsdp": 0}),
    )

    @property
    def ici_sizes(self) -> dict[str, int]:
        return dict(self.ici)

    @property
    def dcn_sizes(self) -> dict[str, int]:
        return dict(self.dcn)

    @property
    def fixed_devices(self) -> int | None:
        """Devices the mesh needs when no ici axis is -1 (else None: every device)."""
        if any(s == -1 for _, s in self.ici):
            return None
        n = 1
        for _, s in self.ici:
            n *= s
        return n * self.num_slices


def mesh_spec(c: ml_collections.ConfigDict) -> MeshSpec:
    """The checked `mesh` section."""
    v = read(MeshSpec, c, "mesh.")
    num_slices = v["num_slices"]
    try:
        ici = check_sizes(v["ici"], "ici")
        dcn = check_sizes(v["dcn"], "dcn")
    except MeshConfigError as e:
        raise ConfigError(str(e)) from None
    fixed_dcn = [s for s in dcn.values() if s != -1]
    product = 1
    for s in fixed_dcn:
        product *= s
    if -1 not in dcn.values() and product != num_slices:
        raise ConfigError(
            f"mesh.dcn: sizes {dcn} multiply to {product}, but mesh.num_slices={num_slices}; "
            f"set one dcn axis to -1 (e.g. --config.mesh.dcn.data=-1)."
        )
    if -1 in dcn.values() and num_slices % product:
        raise ConfigError(
            f"mesh.dcn: the fixed sizes multiply to {product}, which does not divide "
            f"mesh.num_slices={num_slices}."
        )
    min_slices = _min_slices(v["min_slices"], num_slices, product if -1 in dcn.values() else None)
    return MeshSpec(
        ici=tuple((a, ici[a]) for a in MESH_AXES),
        dcn=tuple((a, dcn[a]) for a in MESH_AXES),
        num_slices=num_slices,
        min_slices=min_slices,
    )


def _min_slices(value: Any, num_slices: int, fixed_dcn: int | None) -> int:
    """`mesh.min_slices` checked against `mesh.num_slices` (0: num_slices, not elastic)."""
    value = check_int("mesh.min_slices", value, minimum=0, example=max(1, num_slices - 1))
    if value == 0:
        return num_slices
    if value > num_slices:
        raise ConfigError(
            f"mesh.min_slices={value}: more than mesh.num_slices={num_slices}; the floor must "
            f"be at most the target, e.g. --config.mesh.min_slices={max(1, num_slices - 1)}."
        )
    if value < num_slices and fixed_dcn is None:
        raise ConfigError(
            f"mesh.min_slices={value} < mesh.num_slices={num_slices}, but every mesh.dcn axis "
            "has a fixed size, so the mesh cannot shrink; set one dcn axis to -1 "
            "(e.g. --config.mesh.dcn.data=-1)."
        )
    bad = [n for n in range(value, num_slices + 1) if fixed_dcn and n % fixed_dcn]
    if bad:
        raise ConfigError(
            f"mesh.min_slices={value}: the job may run on {bad[0]} slices, which the fixed "
            f"mesh.dcn sizes (product {fixed_dcn}) do not divide; raise mesh.min_slices to "
            f"a multiple of {fixed_dcn}."
        )
    return value


def check_sequence(mesh: MeshSpec, seq_len: int, strategy: str) -> None:
    """The `sequence` split against `data.seq_len` and `model.sequence_parallel`, at load when
    its size is fixed (with a -1 it is known once devices are: `plan` checks it again)."""
    ici, dcn = mesh.ici_sizes["sequence"], mesh.dcn_sizes["sequence"]
    if ici == -1 or dcn == -1:
        return
    try:
        check_sequence_split(ici * dcn, seq_len, strategy)
    except MeshConfigError as e:
        raise ConfigError(str(e)) from None
