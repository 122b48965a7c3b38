"""`run_dir/status.json`: the job's state and one row per slice, rewritten atomically."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import time
from typing import Any

#: starting: the first gang is being formed; running: training on `num_slices` slices;
#: reforming: a slice was lost or rejoined, the gang restarts at a new size from the newest
#: checkpoint; done: trained to the end; stopped: fewer slices than `mesh.min_slices` or a
#: preemption of the whole job (exit 75, start it again to resume); failed: an error.
JOB_STATES = ("starting", "running", "reforming", "done", "stopped", "failed")
#: running: in the current gang; lost: its process died or was preempted (retried with
#: backoff); rejoining: its replacement is up and joins at the next checkpoint boundary;
#: done: the job ended.
SLICE_STATES = ("running", "lost", "rejoining", "done")

STATUS_FILE = "status.json"


@dataclasses.dataclass
class SliceStatus:
    """One slice (a process holding that slice's devices) of the job."""

    index: int
    state: str = "running"
    pid: int | None = None
    restarts: int = 0
    last_exit: str = ""  # e.g. "exit 1", "SIGKILL", "preempted (SIGTERM)"
    started_at: float | None = None  # wall time of its current process
    ended_at: float | None = None
    peak_rss_mb: float | None = None
    step: int = 0  # its current step: the job's while in the gang, its last when it left
    reason: str = ""
    standby_pid: int | None = None  # its warm spare process, if one is ready

    def duration_s(self, now: float | None = None) -> float | None:
        if self.started_at is None:
            return None
        end = self.ended_at if self.ended_at is not None else (now or time.time())
        return max(0.0, end - self.started_at)


@dataclasses.dataclass
class JobStatus:
    """The whole job: its state, slice counts and the slices (see `JOB_STATES`)."""

    state: str
    target_slices: int
    min_slices: int
    num_slices: int = 0  # of the current gang
    step: int = 0  # the newest step in metrics.jsonl when the status was written
    generation: int = 0  # gangs formed so far
    reason: str = ""
    updated_at: float = 0.0
    launcher_pid: int = 0
    slices: list[SliceStatus] = dataclasses.field(default_factory=list)
    events: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        now = time.time()
        for row, s in zip(out["slices"], self.slices, strict=True):
            row["duration_s"] = s.duration_s(now)
        return out

    def write(self, run_dir: str | os.PathLike) -> pathlib.Path:
        """Rewrites `run_dir/status.json` atomically (readers never see half a file)."""
        self.updated_at = time.time()
        path = pathlib.Path(run_dir) / STATUS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{STATUS_FILE}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1))
        os.replace(tmp, path)
        return path


def read_status(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The status the launcher last wrote in `run_dir`.

    Raises:
        FileNotFoundError: naming the path and what writes it.
    """
    path = pathlib.Path(run_dir) / STATUS_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path}: no status file; it is written by a multislice job "
            "(mesh.num_slices > 1) while it runs. Check --run_dir."
        ) from None


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def format_status(status: dict[str, Any]) -> str:
    """The status as a header line and a fixed-width table of slices."""
    started = {s["index"]: s.get("started_at") for s in status["slices"]}
    head = (
        f"job {status['state']}: {status['num_slices']}/{status['target_slices']} slices "
        f"(min {status['min_slices']}), step {status['step']}, gang #{status['generation']}"
    )
    if status.get("reason"):
        head += f" - {status['reason']}"
    cols = ("index", "state", "pid", "restarts", "last_exit", "started", "duration", "peak_mb",
            "standby")  # fmt: skip
    rows = []
    for s in status["slices"]:
        start = started[s["index"]]
        rows.append((
            str(s["index"]),
            s["state"],
            str(s["pid"] or "-"),
            str(s["restarts"]),
            s["last_exit"] or "-",
            time.strftime("%H:%M:%S", time.localtime(start)) if start else "-",
            _age(s.get("duration_s")),
            f"{s['peak_rss_mb']:.0f}" if s.get("peak_rss_mb") else "-",
            str(s.get("standby_pid") or "-"),
        ))  # fmt: skip
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c)
              for i, c in enumerate(cols)]  # fmt: skip
    lines = [head, "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    for event in status.get("events", [])[-5:]:
        when = time.strftime("%H:%M:%S", time.localtime(event["time"]))
        lines.append(f"{when} {event['kind']}: {event['reason']}")
    return "\n".join(line.rstrip() for line in lines)
