"""The device mesh (`mesh.ici`, `mesh.dcn`, `mesh.num_slices`) and logical-axis rules.

Example:
    >>> from meltemi.levanter.mesh import MeshShape
    >>> MeshShape.resolve({"data": -1}, {"data": -1}, 8, 1).sizes["data"]
    8
"""

from meltemi.levanter.mesh._mesh import (
    BATCH_AXES,
    COMPUTE_RULES,
    MESH_AXES,
    PARAMETER_RULES,
    MeshConfigError,
    MeshShape,
    check_sequence_split,
    check_sizes,
    data_parallel_size,
    make_mesh,
)

__all__ = [
    "BATCH_AXES",
    "COMPUTE_RULES",
    "MESH_AXES",
    "PARAMETER_RULES",
    "MeshConfigError",
    "MeshShape",
    "check_sequence_split",
    "check_sizes",
    "data_parallel_size",
    "make_mesh",
]
