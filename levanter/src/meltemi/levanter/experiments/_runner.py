"""Runs of a sweep as fray actors: one process per worker, one run at a time each.

A run is the ordinary trainer (`meltemi.levanter.trainer.train`) in its own run directory.
When it finishes, the worker writes `result.json` there (atomically) with the run's config
digest; a rerun of the sweep skips every run whose `result.json` matches its config, and a
run without one (killed, preempted) is started again, which resumes from its newest
checkpoint. A worker process that dies is replaced and its run tried once more. Workers
outlive one `run_all` when given a `WorkerPool` (the sweep's workers then train the
verification run, imports and compiled programs warm).
"""

from __future__ import annotations

import fcntl
import json
import os
import pathlib
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from meltemi import data as md
from meltemi import fray
from meltemi.levanter.checkpoint import CheckpointError
from meltemi.levanter.config import ConfigError, ResolvedConfig, RunSpec, resolve
from meltemi.levanter.trainer import Hook, build_parts, train

RESULT = "result.json"
_USER_ERRORS = (ConfigError, CheckpointError, md.StoreError)


def read_result(run_dir: pathlib.Path, digest: str) -> dict[str, Any] | None:
    """The finished run's record if `run_dir` holds one for this config digest.

    Raises:
        ValueError: the run finished under another config (its result would be mixed in).
    """
    path = pathlib.Path(run_dir) / RESULT
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    if record.get("config_digest") != digest:
        raise ValueError(
            f"{run_dir} finished with another config (digest {record.get('config_digest')!r:.14}"
            f", now {digest:.12}); use a new --config.run_dir, or delete {run_dir} to retrain it."
        )
    return record


class SweepWorker:
    """A fray actor that trains one run per call (in its own process under LocalCluster)."""

    def run(
        self,
        config_json: str,
        digest: str,
        hooks: Callable[[RunSpec], Sequence[Hook]] | None = None,
    ) -> dict[str, Any]:
        """Trains (or resumes) the run, writes its `result.json`, returns the record.

        `hooks(spec)` -> more step-boundary hooks for the run's trainer (a module-level
        function, pickled by reference), or None.
        """
        resolved = ResolvedConfig.from_json(config_json)
        start, cpu = time.perf_counter(), time.process_time()
        spec = resolve(resolved)
        # The driver built the stores (a finished one opens without a lock); should one not be
        # finished, build_store refuses a second builder instead of waiting, so the workers of
        # a sweep set up their runs one at a time.
        lock = pathlib.Path(spec.run_dir).parent / ".stores.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        with open(lock, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            parts = build_parts(spec)
        result = train(spec, parts, hooks=hooks(spec) if hooks is not None else ())
        record = {
            "config_digest": digest,
            "step": result.step,
            "start_step": result.start_step,
            "finished": result.step == int(resolved.config.trainer.num_train_steps),
            "eval": result.eval,
            "final_train_loss": result.losses[max(result.losses)] if result.losses else None,
            "seconds": time.perf_counter() - start,
            # CPU seconds of the worker process (every thread): on a busy machine, a better
            # guide than `seconds` to what the run costs on an idle one.
            "cpu_s": time.process_time() - cpu,
            "compile_s": result.compile_s,
            "tokens_per_s": result.tokens_per_s,
            "pid": os.getpid(),
        }
        if record["finished"]:
            path = pathlib.Path(result.run_dir) / RESULT
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
            tmp.replace(path)
        return record


def make_cluster(kind: str, env: dict[str, str] | None = None) -> fray.Cluster:
    """`local` (one process per worker), `ray` (`meltemi.fray.ray`) or `inprocess` (threads,
    which run one at a time)."""
    if kind == "local":
        return fray.LocalCluster(call_timeout=None, heartbeat_timeout_s=600.0, env=env)
    if kind == "ray":
        from meltemi.fray.ray import RayCluster  # noqa: PLC0415 (the optional backend)

        return RayCluster(call_timeout=None, heartbeat_timeout_s=600.0)
    if kind == "inprocess":
        return fray.InProcessCluster(call_timeout=None)
    raise ValueError(f"--cluster={kind!r}: one of local, ray, inprocess")


class WorkerPool:
    """`SweepWorker` actors of one cluster, kept alive between calls of `run_all`.

    Args:
        cluster: where the workers live; `shutdown()` shuts it down.
    """

    def __init__(self, cluster: fray.Cluster):
        self.cluster = cluster
        self._idle: list[fray.ActorHandle] = []
        self._lock = threading.Lock()

    def take(self) -> fray.ActorHandle:
        """An idle worker, else a new one."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self.cluster.spawn(SweepWorker, name=f"isoflop-worker-{time.monotonic_ns()}")

    def give(self, handle: fray.ActorHandle) -> None:
        """Returns a live worker for the next call."""
        with self._lock:
            self._idle.append(handle)

    def shutdown(self) -> None:
        """Stops every worker and the cluster."""
        with self._lock:
            self._idle.clear()
        self.cluster.shutdown()


def run_all(
    jobs: Sequence[tuple[str, str, str]],
    cluster: fray.Cluster | WorkerPool,
    *,
    parallel: int,
    on_done: Callable[[str, dict[str, Any]], None] | None = None,
    retries: int = 1,
    hooks: Callable[[RunSpec], Sequence[Hook]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Runs `(name, config_json, digest)` jobs on `parallel` workers; returns records by name.

    Args:
        jobs: the runs to train, largest first is best (they start in this order).
        cluster: where the workers live; a `WorkerPool` lends its workers and keeps them
            (a bare cluster's workers are stopped at the end).
        parallel: workers (processes) at once.
        on_done: called with `(name, record)` as each run finishes.
        retries: extra attempts for a run whose worker died (the run resumes).
        hooks: `hooks(spec)` -> more step-boundary hooks for each run (see `SweepWorker.run`).

    Raises:
        RuntimeError: a run failed (its error and which run), after the others finished.
    """
    pool = cluster if isinstance(cluster, WorkerPool) else None
    cluster = pool.cluster if pool is not None else cluster
    if isinstance(cluster, fray.InProcessCluster):
        # Threads of one process share orbax's event loop and signal threads, and a failed
        # save releases them process-wide: concurrent in-process runs would break each other's
        # checkpoints. One at a time (use `local` or `ray` for parallel runs).
        parallel = 1
    todo: queue.Queue = queue.Queue()
    for job in jobs:
        todo.put((job, 0))
    records: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    lock = threading.Lock()

    def spawn(rank: int) -> fray.ActorHandle:
        if pool is not None:
            return pool.take()
        return cluster.spawn(SweepWorker, name=f"isoflop-worker-{rank}-{time.monotonic_ns()}")

    def work(rank: int) -> None:
        handle = None
        while True:
            try:
                (name, config_json, digest), attempt = todo.get_nowait()
            except queue.Empty:
                break
            try:
                handle = handle or spawn(rank)
                record = handle.run.options(timeout=None)(config_json, digest, hooks)
            except (fray.ActorDied, fray.ConnectionLost, fray.ActorRestarted) as e:
                handle = None
                if attempt < retries:
                    print(f"isoflop: worker died during {name} ({e}); retrying", file=sys.stderr)
                    todo.put(((name, config_json, digest), attempt + 1))
                else:
                    with lock:
                        errors.append(f"{name}: {e}")
                continue
            except fray.RemoteError as e:
                with lock:
                    if not errors and not isinstance(e.cause, _USER_ERRORS):  # a bug: show once
                        print(f"isoflop: {name} raised:\n{e.traceback}", file=sys.stderr)
                    errors.append(f"{name}: {e.type_name.rsplit('.', 1)[-1]}: {e.message}")
                continue
            with lock:
                records[name] = record
            if on_done is not None:
                on_done(name, record)
        if handle is not None:
            if pool is not None:
                pool.give(handle)
            else:
                cluster.kill(handle)

    threads = [threading.Thread(target=work, args=(r,), daemon=True) for r in range(parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("runs failed: " + "; ".join(errors))
    return records
