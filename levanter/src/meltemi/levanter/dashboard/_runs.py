"""What the dashboard knows about runs: the scan, each run's state, files and metrics.

Everything is read from the run directories as the trainer, the multislice launcher,
`//levanter:eval` and `//levanter:isoflop` write them (`docs/design/levanter.md`); nothing is
written. A run's `metrics.jsonl` is parsed once and then only its new lines (`MetricsLog`).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from meltemi.levanter.dashboard._metrics import (
    PREVIEW_ABOVE_BYTES,
    MetricsLog,
    downsample,
    json_values,
)
from meltemi.levanter.dashboard._root import DashboardError, NotFoundError, RunsRoot
from meltemi.levanter.optim import skip_reasons

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
STATUS_FILE = "status.json"  # the multislice launcher's (meltemi.levanter.status)
SWEEP_FILE = "isoflop.json"
#: The nice value of a background parse's thread (Linux: a thread has its own).
BACKGROUND_NICE = 10
#: How long a run without status.json counts as running after metrics.jsonl last changed.
LIVE_WINDOW_S = 120.0
#: How long a scan of the folder is reused (the runs list is polled).
SCAN_TTL_S = 2.0


def lower_thread_priority() -> None:
    """Puts the calling thread below the requests' (a background parse, the start-up index),
    so the pages keep answering while it parses. Only on Linux, where a thread id names that
    thread (elsewhere it could name a process)."""
    if sys.platform == "linux":
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
        except OSError:
            pass


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one dict of dotted keys (lists stay values).

    Example:
        >>> flatten({"a": {"b": 1, "c": [2, 3]}, "d": "x"})
        {'a.b': 1, 'a.c': [2, 3], 'd': 'x'}
    """
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _finite(x: Any) -> Any:
    return x if not isinstance(x, float) or np.isfinite(x) else None


class Runs:
    """The runs and sweeps under a `RunsRoot`, read on demand and cached.

    Args:
        root: the runs folder.
        live_window_s: a run without `status.json` whose metrics changed this recently is
            running.
        clock: the wall clock (tests pass a fake one).
    """

    def __init__(
        self,
        root: RunsRoot,
        *,
        live_window_s: float = LIVE_WINDOW_S,
        clock: Callable[[], float] = time.time,
    ):
        self.root = root
        self.live_window_s = live_window_s
        self.clock = clock
        self._lock = threading.Lock()
        self._logs: dict[str, MetricsLog] = {}
        self._parsing: set[str] = set()  # logs being parsed in a background thread
        self._json: dict[str, tuple[float, int, Any]] = {}
        self._scanned: tuple[float, list[str], list[str]] | None = None

    # -- the folder

    def scan(self) -> tuple[list[str], list[str]]:
        """(run ids, sweep ids), sorted; reused for `SCAN_TTL_S`."""
        now = time.monotonic()
        with self._lock:
            if self._scanned and now - self._scanned[0] < SCAN_TTL_S:
                return self._scanned[1], self._scanned[2]
        runs, sweeps = [], []
        for top, found in self.root.walk((METRICS_FILE, CONFIG_FILE, SWEEP_FILE)):
            rel = self.root.rel(top)
            if SWEEP_FILE in found:
                sweeps.append(rel if rel != "." else "")
            if found & {METRICS_FILE, CONFIG_FILE}:
                runs.append(rel if rel != "." else "")
        with self._lock:
            self._scanned = (now, sorted(runs), sorted(sweeps))
        return sorted(runs), sorted(sweeps)

    def run_path(self, run_id: str) -> str:
        """The full path of a run directory (403 outside the folder, 404 if not a run)."""
        full = self.root.path(run_id)
        if self.root.stat(self.root.path(run_id, METRICS_FILE)) is None and (
            self.root.stat(self.root.path(run_id, CONFIG_FILE)) is None
        ):
            raise NotFoundError(f"run {run_id!r}: no metrics.jsonl or config.json there.")
        return full

    def read_json(self, run_id: str, *names: str) -> Any:
        """A JSON file of a run (cached by size and mtime); None if absent or unreadable."""
        full = self.root.path(run_id, *names)
        stat = self.root.stat(full)
        if stat is None:
            return None
        cached = self._json.get(full)
        if cached and cached[:2] == (stat.mtime, stat.size):
            return cached[2]
        text = self.root.read_text(full)
        try:
            value = json.loads(text) if text is not None else None
        except ValueError:
            value = None  # half-written by a writer that does not replace atomically
        self._json[full] = (stat.mtime, stat.size, value)
        return value

    def log(self, run_id: str, *, wait: bool = False) -> MetricsLog:
        """The run's metrics, refreshed to the end of the file.

        More than `PREVIEW_ABOVE_BYTES` left to parse (a long run not opened before): the
        parse goes on in a background thread and this returns its `preview()` (`partial`)
        at once, unless `wait`.
        """
        self.run_path(run_id)
        with self._lock:
            log = self._logs.get(run_id)
            if log is None:
                log = self._logs[run_id] = MetricsLog(
                    self.root, self.root.path(run_id, METRICS_FILE)
                )
        if not wait and log.pending_bytes() > PREVIEW_ABOVE_BYTES:
            preview = log.preview()  # first: the parse would slow it down
            self._parse_in_background(run_id, log)
            return preview
        log.refresh()
        return log

    def _parse_in_background(self, run_id: str, log: MetricsLog) -> None:
        with self._lock:
            if run_id in self._parsing:
                return
            self._parsing.add(run_id)

        def parse() -> None:
            lower_thread_priority()
            try:
                log.refresh()
            finally:
                with self._lock:
                    self._parsing.discard(run_id)

        threading.Thread(target=parse, name=f"dashboard-parse-{run_id}", daemon=True).start()

    def index_all(self) -> int:
        """Parses every run's metrics, most recently updated first (the server does this in
        a background thread at start, so that opening a long run finds it parsed)."""
        run_ids, _ = self.scan()

        def updated(run_id: str) -> float:
            stat = self.root.stat(self.root.path(run_id, METRICS_FILE))
            return stat.mtime if stat else 0.0

        for run_id in sorted(run_ids, key=updated, reverse=True):
            self.log(run_id, wait=True)
        return len(run_ids)

    # -- one run

    def config(self, run_id: str) -> dict[str, Any]:
        """config.json: {"config", "provenance", "spec", "overrides"} (empty if absent)."""
        saved = self.read_json(run_id, CONFIG_FILE)
        return saved if isinstance(saved, dict) else {}

    def summary(self, run_id: str, sweeps: Sequence[str] | None = None) -> dict[str, Any]:
        """The runs-list row of one run (see B_api.md, RunSummary)."""
        return self._summary(run_id, self.log(run_id), sweeps)

    def _summary(
        self, run_id: str, log: MetricsLog, sweeps: Sequence[str] | None = None
    ) -> dict[str, Any]:
        saved = self.config(run_id)
        config = saved.get("config") or {}
        trainer = config.get("trainer") or {}
        total = trainer.get("num_train_steps")
        status = self.read_json(run_id, STATUS_FILE)
        metrics_stat = self.root.stat(self.root.path(run_id, METRICS_FILE))
        status_stat = self.root.stat(self.root.path(run_id, STATUS_FILE))
        config_stat = self.root.stat(self.root.path(run_id, CONFIG_FILE))
        updated = max([s.mtime for s in (metrics_stat, status_stat) if s] or [0.0]) or None
        step = log.last_step
        state = self._state(log, status, total, updated)
        tokens_per_s = log.last.get("throughput/tokens_per_second")
        eta = None
        if state in ("running", "degraded") and tokens_per_s and total:
            rows = log.last.get("batch_size") or trainer.get("train_batch_size") or 0
            seq_len = (config.get("data") or {}).get("seq_len") or 0
            if rows and seq_len:
                eta = max(0, total - step) * rows * seq_len / tokens_per_s
        if sweeps is None:
            sweeps = self.scan()[1]
        sweep = next((s for s in sweeps if run_id.startswith(s + "/") or not s), None)
        return {
            "id": run_id,
            "name": config.get("name") or run_id.rsplit("/", 1)[-1],
            "config_name": saved.get("spec", ""),
            "state": state,
            "step": step,
            "total_steps": total,
            "loss": _finite(log.last.get("train/loss")),
            "tokens_per_s": _finite(tokens_per_s),
            "mfu": _finite(log.last.get("throughput/mfu")),
            "eta_s": eta,
            "start_time": config_stat.mtime if config_stat else None,
            "updated": updated,
            "skipped_lines": log.skipped,
            "partial": log.partial,
            "sweep": sweep,
            "elastic": status is not None,
        }

    def _state(self, log: MetricsLog, status: Any, total: Any, updated: float | None) -> str:
        live = updated is not None and self.clock() - updated < self.live_window_s
        if isinstance(status, dict):
            job = status.get("state")
            if job == "done":
                return "finished"
            if job in ("failed", "stopped"):
                return job
            if job in ("starting", "running", "reforming"):
                if not live:
                    return "stopped"
                if (status.get("num_slices") or 0) < (status.get("target_slices") or 0):
                    return "degraded"
                return "running"
        if not log.lines:
            return "unknown"
        if isinstance(total, int) and log.last_step >= total:
            return "finished"
        return "running" if live else "stopped"

    def detail(self, run_id: str) -> dict[str, Any]:
        """Everything about one run (see B_api.md, RunDetail)."""
        log = self.log(run_id)
        saved = self.config(run_id)
        config = saved.get("config") or {}
        slices = self.slices(run_id)
        summary = self._summary(run_id, log)
        mixture, stages = self._mixture(log, config)
        return {
            "id": run_id,
            "summary": summary,
            "status": self.read_json(run_id, STATUS_FILE),
            "config": flatten(config),
            "provenance": dict(saved.get("provenance") or {}),
            "spec": saved.get("spec", ""),
            "overrides": list(saved.get("overrides") or []),
            "checkpoints": self.checkpoints(run_id),
            "eval": [self._table(log, "eval", "eval/"), *self._eval_files(run_id)],
            "harness": [self._table(log, "harness", "harness/")],
            "skip_events": self.skip_events(log),
            "mixture": mixture,
            "mixture_stages": stages,
            "slices": slices["slices"],
            "events": slices["events"],
            "metric_keys": log.keys,
            "lines": log.lines,
            "skipped_lines": log.skipped,
            "partial": log.partial,
        }

    def checkpoints(self, run_id: str) -> list[dict[str, Any]]:
        """Each `checkpoints/step_*` with its step, kind and what its manifest records."""
        out = []
        base = self.root.path(run_id, "checkpoints")
        for name in self.root.listdir(base):
            if not name.startswith("step_") or not name[5:].isdigit():
                continue
            manifest = self.read_json(run_id, "checkpoints", name, "meltemi.json")
            if not isinstance(manifest, dict):
                state, kind, when = "incomplete", None, None
            else:
                arrays = manifest.get("arrays") or {}
                has_sums = any("checksum" in a for a in arrays.values() if isinstance(a, dict))
                state, kind, when = (
                    ("checksums" if has_sums else "sizes"),
                    manifest.get("kind"),
                    manifest.get("time"),
                )
            out.append(
                {
                    "step": int(name[5:]),
                    "path": f"checkpoints/{name}",
                    "kind": kind,
                    "time": when,
                    "checksum_state": state,
                    "eval": self.read_json(run_id, "checkpoints", name, "eval.json"),
                }
            )
        return sorted(out, key=lambda c: c["step"])

    def _eval_files(self, run_id: str) -> list[dict[str, Any]]:
        tables = []
        for ckpt in self.checkpoints(run_id):
            report = ckpt["eval"]
            if not isinstance(report, dict) or not isinstance(report.get("sets"), dict):
                continue
            columns = ["set", "loss", "bpb", "tokens", "bytes"]
            rows = [
                [name, *(_finite(v.get(c)) for c in columns[1:])]
                for name, v in report["sets"].items()
                if isinstance(v, dict)
            ]
            tables.append(
                {"name": f"eval.json step {ckpt['step']}", "columns": columns, "rows": rows}
            )
        return tables

    def _table(self, log: MetricsLog, name: str, prefix: str) -> dict[str, Any]:
        keys = [k for k in log.keys if k.startswith(prefix)]
        by_key = {}
        for k in keys:
            steps, values = log.series(k)
            by_key[k] = dict(zip(steps.tolist(), json_values(values), strict=True))
        steps = sorted({s for d in by_key.values() for s in d})
        rows = [[s, *(by_key[k].get(s) for k in keys)] for s in steps]
        return {"name": name, "columns": ["step", *(k[len(prefix) :] for k in keys)], "rows": rows}

    def skip_events(self, log: MetricsLog) -> list[dict[str, Any]]:
        """The steps the optimizer skipped, with the reasons decoded from `optim/skip/reason`."""
        steps, values = log.series("optim/skipped")
        if not len(steps):
            steps, values = log.series("optim/skip/skipped")
        r_steps, r_values = log.series("optim/skip/reason")
        reason_at = dict(zip(r_steps.tolist(), r_values.tolist(), strict=True))
        out = []
        for step in steps[np.nan_to_num(values) >= 0.5].tolist():
            code = reason_at.get(step)
            reasons = skip_reasons(int(code)) if code is not None and np.isfinite(code) else []
            out.append(
                {"step": step, "reasons": reasons, "reason": ", ".join(reasons) or "unknown"}
            )
        return out

    def _mixture(self, log: MetricsLog, config: Mapping[str, Any]) -> tuple[list, list]:
        data = config.get("data") or {}
        components = data.get("components") or {}
        if data.get("source") != "mixture" or not components:
            return [], []
        stages = [{"step": 0, "weights": {n: c.get("weight") for n, c in components.items()}}]
        for step, weights in data.get("weight_stages") or []:
            stages.append({"step": int(step), "weights": dict(weights)})
        last = log.last_step
        # Stage steps count rows from step 0; metrics step s trains data step s - 1.
        current = [s for s in stages if s["step"] <= max(0, last - 1)][-1]
        out = []
        for name, comp in components.items():
            steps, values = log.series(f"data/{name}/fraction")
            in_stage = steps - 1 >= current["step"]
            out.append(
                {
                    "component": name,
                    "source": comp.get("source"),
                    "weight": current["weights"].get(name, 0.0),
                    "fraction": float(np.mean(values[in_stage])) if in_stage.any() else None,
                    "fraction_all": float(np.mean(values)) if len(values) else None,
                }
            )
        return out, stages

    def slices(self, run_id: str) -> dict[str, Any]:
        """The elastic status per slice and the launcher's events (empty without status.json)."""
        self.run_path(run_id)
        status = self.read_json(run_id, STATUS_FILE)
        if not isinstance(status, dict):
            return {"slices": [], "events": [], "job": None}
        slices = []
        for s in status.get("slices") or []:
            mb = s.get("peak_rss_mb")
            slices.append(
                {
                    "index": s.get("index"),
                    "state": s.get("state"),
                    "pid": s.get("pid"),
                    "last_exit": s.get("last_exit", ""),
                    "restarts": s.get("restarts", 0),
                    "peak_memory_bytes": int(mb * 2**20) if isinstance(mb, (int, float)) else None,
                    "peak_rss_mb": mb,
                    "step": s.get("step", status.get("step")),  # older files: the job's
                    "started_at": s.get("started_at"),
                    "ended_at": s.get("ended_at"),
                    "duration_s": s.get("duration_s"),
                    "reason": s.get("reason", ""),
                }
            )
        job = {
            k: status.get(k)
            for k in (
                "state",
                "num_slices",
                "target_slices",
                "min_slices",
                "generation",
                "step",
                "reason",
                "updated_at",
            )
        }
        events = [
            {"time": e.get("time"), "kind": e.get("kind"), "reason": e.get("reason", "")}
            for e in status.get("events") or []
            if isinstance(e, dict)
        ]
        return {"slices": slices, "events": events, "job": job}

    # -- metrics

    def metrics(
        self,
        run_id: str,
        keys: Sequence[str] | None = None,
        *,
        max_points: int = 2000,
        since_step: int | None = None,
    ) -> dict[str, Any]:
        """Downsampled series of a run (see B_api.md, metrics)."""
        if not 10 <= max_points <= 100_000:
            raise DashboardError(
                f"max_points={max_points}: must be between 10 and 100000; e.g. max_points=2000."
            )
        log = self.log(run_id)
        series, downsampled = {}, False
        for key in keys if keys else log.keys:
            steps, values = log.series(key)
            if since_step is not None:
                cut = np.searchsorted(steps, since_step, side="right")
                steps, values = steps[cut:], values[cut:]
            if len(steps) > max_points:
                steps, values = downsample(steps, values, max_points)
                downsampled = True
            series[key] = {"steps": steps.tolist(), "values": json_values(values)}
        return {
            "keys": log.keys,
            "series": series,
            "last_step": log.last_step,
            "lines": log.lines,
            "skipped_lines": log.skipped,
            "downsampled": downsampled,
            "partial": log.partial,
        }

    # -- several runs

    def compare(self, run_ids: Sequence[str], *, all_keys: bool = False) -> dict[str, Any]:
        """The config of several runs key by key, with where each value came from."""
        if len(run_ids) < 2:
            raise DashboardError(
                f"runs={','.join(run_ids)!r}: compare needs at least two run ids, comma-separated;"
                " e.g. runs=a,b."
            )
        configs, sources = [], []
        for run_id in run_ids:
            self.run_path(run_id)
            saved = self.config(run_id)
            configs.append(flatten(saved.get("config") or {}))
            sources.append(dict(saved.get("provenance") or {}))
        keys = sorted(set().union(*configs))
        diff, same = [], 0
        for key in keys:
            values = [c.get(key) for c in configs]
            equal = all(v == values[0] for v in values[1:])
            same += equal
            if all_keys or not equal:
                diff.append(
                    {"key": key, "values": values, "sources": [_source(s, key) for s in sources]}
                )
        return {"runs": list(run_ids), "diff": diff, "same": same}


def _source(provenance: Mapping[str, str], key: str) -> str | None:
    """Where a key's value came from; a nested key (a mixture component's weight) takes its
    nearest recorded parent's."""
    parts = key.split(".")
    for i in range(len(parts), 0, -1):
        found = provenance.get(".".join(parts[:i]))
        if found is not None:
            return found
    return None
