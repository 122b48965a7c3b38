"""What makes a job's bookkeeping survive a kill: an atomic JSON write, an exclusive lock on a
directory, and JSON-lines ledgers (one line per finished task, a torn last line ignored).

`build_store` (build.json, meta.json, `.build.lock`, its shard ledger) and the pipeline
(pipeline.json, report.json, `.pipeline.lock`, `StageLedger`) share these, so the two agree on
what "written" means: a reader sees the old file or the whole new one, never half of it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
from collections.abc import Iterator
from typing import IO, Any

__all__ = [
    "StageLedger",
    "append_json_line",
    "exclusive_lock",
    "read_json_lines",
    "write_json",
]


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Writes `obj` as JSON (indent 1, keys sorted) so that readers never see half of it.

    The text goes to a hidden temporary file beside `path`, is fsynced, then renamed over
    `path`; if anything fails on the way, the temporary file is removed and `path` is left
    as it was.
    """
    path = os.fspath(path)
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "w") as fh:
            json.dump(obj, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike, busy: Exception) -> Iterator[None]:
    """Holds an exclusive `flock` on the file `path` (created if missing) for the block.

    Args:
        path: the lock file, e.g. `DIR/.pipeline.lock`.
        busy: raised (from the `BlockingIOError`) when another process holds the lock; it
            should say who holds it and what to do.
    """
    fh = open(path, "a+")
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            raise busy from e
        yield
    finally:
        fh.close()


def read_json_lines(path: str | os.PathLike) -> Iterator[dict]:
    """The objects of a JSON-lines file in order; nothing if it does not exist.

    A line that does not parse (torn by a kill, or blank) is skipped: the task it recorded
    is redone.
    """
    if not os.path.exists(path):
        return
    with open(path) as fh:
        for line in fh:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def append_json_line(fh: IO[str], obj: dict, *, sync: bool = True) -> None:
    """Appends `obj` (keys sorted) as one line to the open file `fh`.

    The line is flushed at once, so a killed process loses nothing written; `sync=False`
    leaves the fsync (what a power cut needs) to the caller, e.g. once per batch of lines.
    """
    fh.write(json.dumps(obj, sort_keys=True) + "\n")
    fh.flush()
    if sync:
        os.fsync(fh.fileno())


class StageLedger:
    """The pipeline's `DIR/ledger.jsonl`: one line per finished (stage, shard).

    A line is `{"stage", "shard", "output", "attempts", ...counts}`, or with `quarantined`
    and `error` for a shard that failed every attempt, or `{"stage", "plan"}` for a global
    step's statistics. On open, a line whose `output` is gone is dropped (that task is
    redone), as is a torn last line.
    """

    def __init__(self, root: str):
        self.path = os.path.join(root, "ledger.jsonl")
        self.entries: dict[tuple[str, int], dict] = {}
        self.plans: dict[str, dict] = {}
        for entry in read_json_lines(self.path):
            if "plan" in entry:
                self.plans[entry["stage"]] = entry["plan"]
            elif entry.get("quarantined") or os.path.exists(entry["output"]):
                self.entries[(entry["stage"], entry["shard"])] = entry

    def add(self, entry: dict, sync: bool = True) -> None:
        """Appends `entry` (written through at once, so a kill loses nothing); `sync=False`
        leaves the fsync to a later `sync()` (one per stage, not one per task)."""
        with open(self.path, "a") as fh:
            append_json_line(fh, entry, sync=sync)
        if "plan" in entry:
            self.plans[entry["stage"]] = entry["plan"]
        else:
            self.entries[(entry["stage"], entry["shard"])] = entry

    def sync(self) -> None:
        """fsyncs the lines appended with `sync=False`."""
        if os.path.exists(self.path):
            with open(self.path, "a") as fh:
                os.fsync(fh.fileno())

    def done(self, stage: str, shard: int) -> dict | None:
        """The line of (stage, shard), finished or quarantined; None: still to do."""
        return self.entries.get((stage, shard))
