"""`run_dir/metrics.jsonl`: one JSON object per step."""

from __future__ import annotations

import json
import math
import os
import pathlib
from collections.abc import Mapping
from typing import Any

REQUIRED_KEYS = (
    "step",
    "train/loss",
    "throughput/tokens_per_second",
    "optim/grad_norm",
    "optim/update_norm",
    "optim/skipped",
)


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep the fact visible
    return value


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """Reads a metrics.jsonl file (a torn last line, from a kill mid-write, is ignored).

    Example:
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "metrics.jsonl"
        >>> with MetricsWriter(path) as w:
        ...     w.write({"step": 1, "train/loss": 2.5})
        >>> read_metrics(path)
        [{'step': 1, 'train/loss': 2.5}]
    """
    records = []
    path = pathlib.Path(path)
    if not path.exists():
        return records
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


class MetricsWriter:
    """Appends one JSON object per line, flushed at once, so a killed run loses nothing.

    Args:
        path: the metrics.jsonl file.
        resume_step: when resuming from the checkpoint after this many steps, records of later
            steps (written by the run that was interrupted) are dropped first, so the file holds
            each step exactly once.
    """

    def __init__(self, path: str | os.PathLike, *, resume_step: int | None = None):
        self.path = pathlib.Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and self.path.exists():
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
            os.replace(tmp, self.path)
        elif resume_step is None and self.path.exists():
            self.path.unlink()
        self._file = self.path.open("a")

    def write(self, record: Mapping[str, Any]) -> None:
        """Writes one record (values may be numpy/JAX scalars)."""
        self._file.write(json.dumps({k: _plain(v) for k, v in record.items()}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
