"""meltemi.levanter.multislice: elastic multislice jobs, and the status file they keep.

`launch_multislice` keeps a gang of slice processes (`SliceWorker` fray actors, one per
slice) training with the ordinary trainer; it rewrites `run_dir/status.json` whenever the job
or a slice changes, and `read_status` / `format_status` (from `meltemi.levanter.status`, a
bottom floor with no JAX) read and print it. This floor sits above the trainer.
"""

from meltemi.levanter.multislice._launch import devices_per_slice, launch_multislice
from meltemi.levanter.multislice._slice_worker import (
    RESIZE_SIGNAL,
    SliceWorker,
    write_compile_cache_from_every_rank,
)
from meltemi.levanter.status import (
    JOB_STATES,
    SLICE_STATES,
    JobStatus,
    SliceStatus,
    format_status,
    read_status,
)

__all__ = [
    "JOB_STATES",
    "RESIZE_SIGNAL",
    "SLICE_STATES",
    "JobStatus",
    "SliceStatus",
    "SliceWorker",
    "devices_per_slice",
    "format_status",
    "launch_multislice",
    "read_status",
    "write_compile_cache_from_every_rank",
]
