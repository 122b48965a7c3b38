"""Elastic multislice on one machine: one process per slice, joined by `jax.distributed`.

`launch_multislice` keeps a gang of slice processes (`SliceWorker` fray actors, one per
slice) training. Every worker initialises `jax.distributed` against a coordinator on
127.0.0.1 (CPU collectives over gloo), builds the mesh of the gang's size (the `dcn` axes
span the processes) and runs the ordinary training loop; process 0 writes metrics and
checkpoint manifests. A step's batch is a function of the step alone, the same rows at any
slice count, so a job that shrinks and grows trains on exactly the rows of one that did not.

The job (`mesh.num_slices` is the target, `mesh.min_slices` the floor):

* a slice process dies (or is preempted: SIGTERM, it saves first): the other slices are
  stopped and the gang re-forms at once on the live slices (>= `min_slices`) from the newest
  intact checkpoint; `jax.distributed` cannot change its process count in place, so a new
  gang is a new set of processes: each slice's warm standby (a spare process started ahead
  of time, imports done) takes its place, and the pool refills once the new gang is up;
* the lost slice is retried with backoff; when its replacement is up, the running gang stops
  at the next step boundary (saving a checkpoint there) and re-forms at the larger size;
* fewer live slices than `min_slices` and no replacement within the retry budget: the job
  stops with exit status 75 ("try again later"); starting it again resumes;
* SIGTERM to the launcher: every slice saves and stops, exit status 75;
* a slice raises: the job stops with that error's status (74 for an I/O failure such as a
  full disk, 2 for a config or checkpoint mistake, each one `error:` line; 1 for a bug).

Every change is logged with its reason and written to `run_dir/status.json` (see
`meltemi.levanter.multislice`). The same launcher runs on fray's Ray backend:
pass `cluster=RayCluster(...)`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from meltemi import fray
from meltemi.levanter import _exit
from meltemi.levanter.checkpoint import latest_complete_step
from meltemi.levanter.config import ResolvedConfig, RunSpec, as_spec
from meltemi.levanter.multislice._slice_worker import RESIZE_SIGNAL, SliceWorker
from meltemi.levanter.status import JobStatus, SliceStatus
from meltemi.levanter.trainer import PREEMPTED_EXIT_CODE, Hook

logger = logging.getLogger(__name__)

__all__ = ["SliceWorker", "devices_per_slice", "launch_multislice"]


def devices_per_slice(spec: RunSpec) -> int:
    """Local devices of each slice process: the ici mesh size when fixed, else 1."""
    fixed = spec.mesh.fixed_devices
    return 1 if fixed is None else fixed // spec.mesh.num_slices


def launch_multislice(
    spec: RunSpec | ResolvedConfig,
    *,
    cluster: fray.Cluster | None = None,
    max_restarts: int = 3,
    on_start: Callable[[fray.Cluster, list, int], None] | None = None,
    available: Callable[[int, int], bool] | None = None,
    backoff_s: float = 0.5,
    standby: bool = True,
    hooks: Callable[[RunSpec], Sequence[Hook]] | None = None,
) -> int:
    """Runs the job on up to `mesh.num_slices` slice processes; returns the exit status.

    Args:
        spec: the checked config (its `mesh.num_slices` > 1; a `ResolvedConfig` is resolved).
        cluster: the fray cluster to use (default: a `LocalCluster` for this call).
        max_restarts: replacement attempts per lost slice before it is given up.
        on_start: called with `(cluster, handles, generation)` each time a gang is up
            (tests use it to interrupt the job).
        available: called with `(slice_index, attempt)` before a replacement is started;
            False means "no capacity for it now" (tests simulate a slice that stays away).
        backoff_s: wait before the first replacement attempt (doubling, at most 30 s).
        standby: keep one warm spare process per live slice (imports done, waiting for its
            assignment), so a re-form starts no cold process for the survivors.
        hooks: `hooks(spec)` -> step-boundary hooks each slice adds to its trainer (a
            module-level function, pickled by reference; `meltemi.levanter.main` passes the
            lm-evaluation-harness hook this way), or None.
    """
    spec = as_spec(spec)
    owned = cluster is None
    cluster = cluster or fray.LocalCluster(heartbeat_timeout_s=600.0)
    job = _ElasticJob(spec, cluster, max_restarts, available, backoff_s, standby, hooks)
    try:
        with _forward_sigterm(job):
            return job.run(on_start)
    finally:
        job.close()
        if owned:
            cluster.shutdown()


@contextlib.contextmanager
def _forward_sigterm(job: _ElasticJob):
    """SIGTERM to the launcher is passed to every slice process: each saves and stops."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: job.terminate())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _describe(error: BaseException) -> str:
    sig = getattr(error, "signal", None)
    code = getattr(error, "exit_code", None)
    if sig:
        with contextlib.suppress(ValueError):
            return signal.Signals(sig).name
        return f"signal {sig}"
    if code is not None:
        return f"exit {code}"
    return type(error).__name__


def _vm_hwm_mb(pid: int | None) -> float | None:
    """Peak resident memory of a live local process (Linux), in MiB."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def _last_step(path) -> int:
    """The newest step in metrics.jsonl (reads only the file's tail)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = f.read().splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return int(json.loads(line)["step"])
    return 0


def _resume_step(run_dir) -> int:
    """The step a new gang resumes from: the newest complete checkpoint's (0 if none)."""
    with contextlib.suppress(OSError):  # a listing racing a save or a cleanup
        return latest_complete_step(run_dir / "checkpoints") or 0
    return 0


class _ElasticJob:
    """The launcher's state machine (see the module docstring and docs/design/levanter.md)."""

    def __init__(self, spec, cluster, max_restarts, available, backoff_s, standby, hooks=None):
        self.spec = spec
        self.hooks = hooks
        self.cluster = cluster
        self.target = spec.mesh.num_slices
        self.min_slices = spec.mesh.min_slices or self.target
        self.local = devices_per_slice(spec)
        self.max_restarts = max_restarts
        self.available = available
        self.policy = fray.RestartPolicy(backoff_initial_s=backoff_s, backoff_max_s=30.0)
        self.lock = threading.RLock()
        self.closed = threading.Event()
        self.terminated = threading.Event()
        self.slices = [SliceStatus(i) for i in range(self.target)]
        self.handles: dict[int, Any] = {}  # slice -> its actor (warm or in the gang)
        self.fresh: set[int] = set()  # actors that have not run a gang yet
        self.fill_threads: list[threading.Thread] = []
        self.retrying: dict[int, threading.Thread] = {}
        self.gang: list[int] = []
        # The warm standby pool: per slice, a spare process started ahead of time on that
        # slice's host (imports done), which takes the slice's place in the next gang.
        self.use_standby = standby
        self.standby: dict[int, Any] = {}
        self.filling: set[int] = set()
        self.serial = 0
        self.status = JobStatus(
            "starting", self.target, self.min_slices, launcher_pid=os.getpid(),
            slices=self.slices,
        )  # fmt: skip
        self.metrics = spec.run_dir / "metrics.jsonl"
        # Re-forming restarts processes: a persistent compilation cache (the launcher's, else
        # $JAX_COMPILATION_CACHE_DIR, else one in the run dir) spares compiling a size again.
        self.compile_cache = (
            jax.config.jax_compilation_cache_dir
            or os.environ.get("JAX_COMPILATION_CACHE_DIR")
            or str(spec.run_dir / "compile_cache")
        )
        self.last_write = 0.0

    # -- bookkeeping ---------------------------------------------------------------------------

    def log(self, kind: str, reason: str) -> None:
        """Logs a restart, shrink, grow or stop with its reason (stderr and status.json)."""
        print(f"multislice: {kind}: {reason}", file=sys.stderr, flush=True)
        logger.info("%s: %s", kind, reason)
        with self.lock:
            self.status.events.append({"time": time.time(), "kind": kind, "reason": reason})
            del self.status.events[:-50]
            self.write_status()

    def write_status(self, state: str | None = None, reason: str | None = None) -> None:
        with self.lock:
            if state is not None:
                self.status.state = state
            if reason is not None:
                self.status.reason = reason
            self.status.step = _last_step(self.metrics)
            for s in self.slices:
                if s.state == "running":  # in the gang: at the job's step (a lost one keeps its)
                    s.step = self.status.step
                if s.state in ("running", "rejoining"):
                    peak = _vm_hwm_mb(s.pid)
                    if peak is not None:
                        s.peak_rss_mb = max(peak, s.peak_rss_mb or 0.0)
            self.status.write(self.spec.run_dir)
            self.last_write = time.monotonic()

    def terminate(self) -> None:
        """SIGTERM to the launcher: the whole job is preempted."""
        self.terminated.set()
        self._signal_gang(signal.SIGTERM)

    def _signal_gang(self, signum: int) -> None:
        with self.lock:
            pids = [self.slices[i].pid for i in self.gang]
        for pid in pids:
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)

    def close(self) -> None:
        self.closed.set()
        with self.lock:
            handles = list(self.handles.values()) + list(self.standby.values())
            self.handles.clear()
            self.standby.clear()
        for h in handles:
            self._kill(h)
        for t in list(self.retrying.values()) + list(self.fill_threads):
            t.join(timeout=5)

    # -- slices --------------------------------------------------------------------------------

    def _spawn(self, index: int) -> None:
        """Starts a fresh process for slice `index` (raises fray.ActorDied if it cannot)."""
        name = f"slice-{index}"
        with contextlib.suppress(KeyError, fray.FrayError):
            self.cluster.kill(name)  # an old incarnation still registered under the name
        handle = self.cluster.spawn(SliceWorker, name=name)
        pid = handle.info()["pid"]
        self._enlist(index, handle, pid)

    def _enlist(self, index: int, handle, pid: int) -> None:
        """Makes `handle` slice `index`'s process for the next gang."""
        with self.lock:
            self.handles[index] = handle
            self.fresh.add(index)
            s = self.slices[index]
            s.pid, s.started_at, s.ended_at = pid, time.time(), None

    # -- the warm standby pool ------------------------------------------------------------------

    def _fill_standby(self, indices: list[int]) -> None:
        """Starts a spare process for each of `indices` that has none (in the background)."""
        if not self.use_standby:
            return
        with self.lock:
            todo = [i for i in indices if i not in self.standby and i not in self.filling
                    and self.slices[i].state in ("running", "rejoining")]  # fmt: skip
            self.filling.update(todo)
            threads = [threading.Thread(target=self._start_standby, args=(i,), daemon=True,
                                        name=f"multislice-standby-{i}") for i in todo]  # fmt: skip
            self.fill_threads = [t for t in self.fill_threads if t.is_alive()] + threads
        for t in threads:
            t.start()

    def _start_standby(self, index: int) -> None:
        with self.lock:
            self.serial += 1
            name = f"slice-{index}-standby-{self.serial}"
        handle = None
        try:
            handle = self.cluster.spawn(SliceWorker, name=name)
            pid = handle.info()["pid"]
        except Exception as e:  # no spare then: the next re-form starts a cold process
            if not self.closed.is_set():
                logger.warning("slice %d: standby process did not start: %s", index, e)
            keep = False
        else:
            with self.lock:
                keep = (not self.closed.is_set() and index not in self.standby
                        and self.slices[index].state in ("running", "rejoining"))  # fmt: skip
                if keep:
                    self.standby[index] = handle
                    self.slices[index].standby_pid = pid
        finally:
            with self.lock:
                self.filling.discard(index)
        if keep:
            self.write_status()
        elif handle is not None:
            self._kill(handle)

    def _pop_standby(self, index: int) -> tuple[Any, int | None]:
        """Removes slice `index`'s spare from the pool: `(handle or None, its pid)`."""
        with self.lock:
            handle = self.standby.pop(index, None)
            pid, self.slices[index].standby_pid = self.slices[index].standby_pid, None
        return handle, pid

    def _take_standby(self, index: int) -> bool:
        """Promotes slice `index`'s spare (if it has one) to its process for the next gang."""
        handle, pid = self._pop_standby(index)
        if handle is None:
            return False
        if not _alive(pid):  # it died while standing by
            self._kill(handle)
            return False
        self._enlist(index, handle, pid)
        return True

    def _drop_standby(self, index: int) -> None:
        handle, _ = self._pop_standby(index)
        if handle is not None:
            self._kill(handle)

    def _kill(self, handle) -> None:
        """Stops an actor; one that is already gone (or its cluster) is not an error here."""
        with contextlib.suppress(Exception):
            self.cluster.kill(handle)

    def _retire(self, index: int) -> None:
        """Stops slice `index`'s process (it is lost or its gang is over)."""
        with self.lock:
            handle = self.handles.pop(index, None)
            self.fresh.discard(index)
            s = self.slices[index]
            if s.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(s.pid, signal.SIGKILL)  # may be stuck in a collective
            if s.ended_at is None and s.started_at is not None:
                s.ended_at = time.time()
        if handle is not None:
            self._kill(handle)

    def lose(self, index: int, why: str, last_exit: str) -> None:
        """Marks slice `index` lost and starts retrying its replacement with backoff."""
        with self.lock:
            s = self.slices[index]
            s.state, s.reason, s.last_exit = "lost", why, last_exit
            s.restarts += 1
        self._retire(index)
        self._drop_standby(index)  # it stood by on the same host, which is gone
        self.log("lost", f"slice {index} {why}")
        t = threading.Thread(target=self._replace, args=(index,), daemon=True,
                             name=f"multislice-replace-{index}")  # fmt: skip
        with self.lock:
            self.retrying[index] = t
        t.start()

    def _replace(self, index: int) -> None:
        try:
            for attempt in range(1, self.max_restarts + 1):
                if self.closed.wait(self.policy.backoff(attempt)):
                    return
                if self.available is not None and not self.available(index, attempt):
                    self.log("retry", f"slice {index}: no capacity (attempt {attempt}/"
                                      f"{self.max_restarts})")  # fmt: skip
                    continue
                try:
                    self._spawn(index)
                except Exception as e:  # a failed start, or the cluster closing under us
                    if self.closed.is_set():
                        return
                    self.log("retry", f"slice {index}: replacement failed to start ({e})")
                    continue
                if self.closed.is_set():
                    self._retire(index)
                    return
                with self.lock:
                    self.slices[index].state = "rejoining"
                    self.slices[index].reason = "replacement up; joins at the next checkpoint"
                self.log("rejoining", f"slice {index}: replacement up (attempt {attempt})")
                return
            with self.lock:
                self.slices[index].reason = f"gave up after {self.max_restarts} attempts"
            self.log("given up", f"slice {index}: no replacement after {self.max_restarts} "
                                 "attempts")  # fmt: skip
        finally:
            with self.lock:
                self.retrying.pop(index, None)

    def _live(self) -> list[int]:
        with self.lock:
            return [s.index for s in self.slices if s.state in ("running", "rejoining")]

    def _pending_replacements(self) -> bool:
        with self.lock:
            return bool(self.retrying)

    # -- the job -------------------------------------------------------------------------------

    def run(self, on_start) -> int:
        self.write_status("starting")
        reason = f"start on {self.target} slices"
        while True:
            live = self._wait_for_floor()
            if live is None:
                return self._stop_below_floor()
            gang = self._form(live)
            if gang is None:
                continue  # a process failed to start: it is lost, try again with the rest
            self.status.generation += 1
            self.log("gang", f"#{self.status.generation} on {len(gang)} slice(s) {gang} "
                             f"from step {_last_step(self.metrics)} ({reason})")  # fmt: skip
            outcome, reason = self._run_gang(gang, on_start)
            if outcome is not None:
                for s in self.slices:
                    self._drop_standby(s.index)
                self.write_status()
                return outcome

    def _wait_for_floor(self) -> list[int] | None:
        """The live slices once there are >= min_slices; None if no replacement will come."""
        waited = False
        while True:
            live = self._live()
            if len(live) >= self.min_slices:
                return live
            if not self._pending_replacements() or self.terminated.is_set():
                return None
            if not waited:
                self.write_status(
                    "reforming",
                    f"{len(live)} slice(s) alive, below "
                    f"mesh.min_slices={self.min_slices}: waiting for replacements",
                )
                waited = True
            time.sleep(0.1)

    def _stop_below_floor(self) -> int:
        live = self._live()
        step = _last_step(self.metrics)
        why = (
            f"{len(live)} of {self.target} slices alive, below mesh.min_slices="
            f"{self.min_slices}, and no replacement came within {self.max_restarts} attempts; "
            f"stopped at step {step} (the newest checkpoint is kept). Start the job again to "
            f"resume when slices are available, or lower mesh.min_slices."
        )
        if self.terminated.is_set():
            why = f"preempted (SIGTERM) while re-forming at step {step}; start again to resume"
        for s in self.slices:
            if s.state != "lost":
                s.state = "done"
            self._retire(s.index)
        self.log("stopped", why)
        self.write_status("stopped", why)
        return PREEMPTED_EXIT_CODE

    def _form(self, live: list[int]) -> list[int] | None:
        """Fresh processes for the slices of the next gang: a warm replacement or a standby
        where there is one, else a cold start."""
        with self.lock:
            need = [i for i in live if i not in self.fresh]
        for i in need:
            self._retire(i)
        need = [i for i in need if not self._take_standby(i)]
        self.write_status("reforming" if self.status.generation else "starting")
        if not self.status.generation:
            # The first gang's spares start beside it, so that the first loss finds them.
            self._fill_standby(live)
        failed = []
        with concurrent.futures.ThreadPoolExecutor(max(1, len(need))) as pool:
            futures = {pool.submit(self._spawn, i): i for i in need}
            for fut, i in futures.items():
                try:
                    fut.result()
                except fray.FrayError as e:
                    failed.append((i, e))
        if not self.status.generation:
            for t in list(self.fill_threads):
                t.join()
        for i, e in failed:
            self.lose(i, f"did not start: {e}", _describe(e))
        if failed:
            return None
        with self.lock:
            for i in live:
                self.slices[i].state, self.slices[i].reason = "running", ""
            self.gang = list(live)
        return list(live)

    def _run_gang(self, gang: list[int], on_start) -> tuple[int | None, str]:
        """Runs one gang to its end; returns (exit status or None to re-form, why)."""
        coordinator = f"127.0.0.1:{fray.free_port()}"
        with self.lock:
            handles = [self.handles[i] for i in gang]
            self.fresh.difference_update(gang)
        config = self.spec.to_json()
        futures = [
            h.run.options(timeout=None).remote(
                i,
                rank,
                len(gang),
                coordinator,
                config,
                self.local,
                self.compile_cache,
                self.hooks,
            )  # fmt: skip
            for rank, (i, h) in enumerate(zip(gang, handles, strict=True))
        ]
        self.status.num_slices = len(gang)
        self.write_status("running", "")
        if on_start is not None:
            on_start(self.cluster, handles, self.status.generation - 1)
        # Its first step is the one after the checkpoint it resumes from (metrics.jsonl may
        # hold later steps, which the gang trains again and rewrites).
        start_step = min(_last_step(self.metrics), _resume_step(self.spec.run_dir))
        resize_sent = term_sent = 0.0
        refilled = False
        results: dict[int, dict] = {}
        while True:
            died = []
            for i, fut in zip(gang, futures, strict=True):
                if i in results or not fut.done():
                    continue
                try:
                    results[i] = fut.result()
                except fray.RemoteError as e:
                    # The training itself raised (a bug or a bad config): it would raise again
                    # at any size, so the job fails instead of re-forming.
                    return self._fail(gang, i, e)
                except (fray.FrayError, OSError) as e:
                    died.append((i, e))
            if died:
                return self._after_death(gang, died)
            if len(results) == len(gang):
                return self._after_gang(gang, results)
            # A replacement is up: once this gang has made progress, stop it at the next
            # step boundary (it saves a checkpoint there) and re-form larger.
            now = time.monotonic()
            if self.terminated.is_set() and now - term_sent > 1.0:
                # Again every second: a slice still setting up clears the flag when its loop
                # starts, and one signal might fall before that.
                self._signal_gang(signal.SIGTERM)
                term_sent = now
            progressed = refilled or _last_step(self.metrics) > start_step
            if progressed and not refilled:  # the gang is up: spares for the next re-form
                self._fill_standby(gang)
                refilled = True
            joining = [s.index for s in self.slices if s.state == "rejoining"]
            with self.lock:  # growing can wait for the spares: the gang trains meanwhile
                spares_coming = bool(self.filling.intersection(gang))
            if joining and not self.terminated.is_set() and now - resize_sent > 1.0:
                if progressed and not spares_coming:
                    if not resize_sent:
                        self.log("grow", f"slice(s) {joining} ready: the gang stops at the "
                                         "next step boundary to re-form")  # fmt: skip
                    self._signal_gang(RESIZE_SIGNAL)
                    resize_sent = now
            if now - self.last_write > 2.0:
                self.write_status()
            time.sleep(0.05)

    def _fail(self, gang, index, error) -> tuple[int, str]:
        for i in gang:
            self.slices[i].state = "done"
            self._retire(i)
        # The slice's own status: a full disk is 74 and a config or checkpoint mistake 2 (one
        # `error:` line, as one process would print), anything else a bug (1, its traceback).
        status = _exit.exit_status(error)
        if status == _exit.FAILED:
            why = f"slice {index} raised: {error}"
            self.log("failed", why)
        else:
            why = f"slice {index}: {_exit.error_line(error, self.spec.run_dir)}"
            self.log("failed", why)
            print(f"error: {why}", file=sys.stderr, flush=True)
        self.write_status("failed", why.splitlines()[0])
        return status, why

    def _after_death(self, gang, died) -> tuple[int | None, str]:
        # Others may be dying at the same moment (one machine, several slices): look again.
        time.sleep(0.2)
        lost = {i: e for i, e in died}
        with self.lock:
            handles = {i: self.handles.get(i) for i in gang}
        for i in gang:
            if i in lost:
                continue
            pid = self.slices[i].pid
            if pid and not _alive(pid):
                lost[i] = fray.ActorDied(f"slice-{i}", "its process is gone")
        for i, e in lost.items():
            self.lose(i, f"died ({_describe(e)})", _describe(e))
        survivors = [i for i in gang if i not in lost]
        for i in survivors:
            self._retire(i)  # stuck in a collective with the lost slice: stop now
        del handles
        live = self._live()
        why = f"slice(s) {sorted(lost)} lost; re-forming on {len(live)} slice(s)"
        self.log("shrink" if len(live) < len(gang) else "restart", why)
        return None, why

    def _after_gang(self, gang, results) -> tuple[int | None, str]:
        num_steps = self.spec.trainer.num_train_steps
        first = results[gang[0]]
        for i in gang:
            s = self.slices[i]
            s.peak_rss_mb = max(results[i].get("peak_rss_mb") or 0.0, s.peak_rss_mb or 0.0)
        if first["step"] >= num_steps:
            for i in gang:
                self.slices[i].state = "done"
                self._retire(i)
            print(first["summary"], flush=True)
            self.log("done", f"trained to step {num_steps} on {len(gang)} slice(s)")
            self.write_status("done", "")
            return 0, ""
        if self.terminated.is_set():
            for i in gang:
                self.slices[i].state = "done"
                self._retire(i)
            print(first["summary"], flush=True)
            why = f"preempted (SIGTERM to the launcher) at step {first['step']}; start again"
            self.log("stopped", why)
            self.write_status("stopped", why)
            return PREEMPTED_EXIT_CODE, why
        preempted = [i for i in gang if results[i]["terminated"]]
        for i in preempted:  # a preempted slice saved with the others; its host goes away
            self.lose(i, f"preempted (SIGTERM) at step {first['step']}", "preempted (SIGTERM)")
        for i in gang:
            if i not in preempted:
                self._retire(i)
        if preempted:
            why = f"slice(s) {preempted} preempted; re-forming on {len(self._live())} slice(s)"
            self.log("shrink", why)
        else:
            why = f"grow to {len(self._live())} slice(s) at step {first['step']}"
        return None, why


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped) counts as gone.
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    return True
