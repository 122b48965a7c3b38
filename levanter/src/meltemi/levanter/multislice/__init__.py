"""meltemi.levanter.multislice: the status of an elastic multislice job (no JAX needed).

The launcher (`meltemi.levanter.trainer.launch_multislice`) rewrites `run_dir/status.json`
whenever the job or a slice changes; `read_status` / `format_status` read and print it
(`bazel run //levanter:status -- --run_dir=DIR`).
"""

from meltemi.levanter.multislice._status import (
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
