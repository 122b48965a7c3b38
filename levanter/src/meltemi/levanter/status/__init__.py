"""meltemi.levanter.status: the `status.json` an elastic multislice job keeps in its run dir.

`read_status` / `format_status` read and print it (`bazel run //levanter:status --
--run_dir=DIR`); `JobStatus` / `SliceStatus` are what the launcher writes. Standard library
only, on the bottom floor, so reading a job's status imports neither JAX nor the trainer.
"""

from meltemi.levanter.status._status import (
    JOB_STATES,
    SLICE_STATES,
    JobStatus,
    SliceStatus,
    format_status,
    read_status,
)

__all__ = [
    "JOB_STATES",
    "SLICE_STATES",
    "JobStatus",
    "SliceStatus",
    "format_status",
    "read_status",
]
