"""Multislice on one machine: one process per slice, joined by `jax.distributed` on loopback.

`launch_multislice` spawns `mesh.num_slices` `SliceWorker` actors as one fray gang (each a
process of its own). Every worker initialises `jax.distributed` against a coordinator on
127.0.0.1 (CPU collectives over gloo), builds the same mesh (the `dcn` axes span the
processes) and runs the ordinary training loop; process 0 writes metrics and checkpoint
manifests. If any slice process dies, fray stops and restarts the whole gang and the
launcher starts the run again: it resumes from the newest intact checkpoint, and since a
step's batch is a function of the step alone, no data is skipped or repeated.

The same launcher runs on fray's Ray backend: pass `cluster=RayCluster(...)`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

import jax

from meltemi import fray
from meltemi.levanter.config import ResolvedConfig, RunSpec, as_spec
from meltemi.levanter.trainer._preemption import PREEMPTED_EXIT_CODE, install_sigterm_handler
from meltemi.levanter.trainer._trainer import train

logger = logging.getLogger(__name__)


class SliceWorker:
    """One slice of a multislice job: a process holding that slice's devices."""

    def __init__(self):
        # The constructor runs in the actor process's main thread, calls in worker threads:
        # only here can SIGTERM be turned into "save a checkpoint and stop".
        install_sigterm_handler()

    def run(
        self,
        slice_index: int,
        num_slices: int,
        coordinator: str,
        config_json: str,
        local_devices: int,
    ) -> dict[str, Any]:
        """Joins the job, trains (or resumes) to the end, and returns a small result."""
        os.environ["MELTEMI_SLICE_INDEX"] = str(slice_index)
        # The launcher's fake-device flag (tests) must not leak into the slice processes:
        # each slice has `local_devices` devices.
        flags = os.environ.get("XLA_FLAGS", "").split()
        flags = [f for f in flags if not f.startswith("--xla_force_host_platform_device_count")]
        os.environ["XLA_FLAGS"] = " ".join(flags)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        if jax.config.jax_platforms in (None, "", "cpu"):
            jax.config.update("jax_num_cpu_devices", local_devices)
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=num_slices,
            process_id=slice_index,
            initialization_timeout=120,
        )
        result = train(ResolvedConfig.from_json(config_json))
        jax.distributed.shutdown()
        return {
            "slice": slice_index,
            "start_step": result.start_step,
            "step": result.step,
            "preempted": result.preempted,
            "losses": result.losses,
            "summary": result.summary,
        }


def devices_per_slice(spec: RunSpec) -> int:
    """Local devices of each slice process: the ici mesh size when fixed, else 1."""
    fixed = spec.mesh.fixed_devices
    return 1 if fixed is None else fixed // spec.mesh.num_slices


def launch_multislice(
    spec: RunSpec | ResolvedConfig,
    *,
    cluster: fray.Cluster | None = None,
    max_restarts: int = 3,
    on_start: Any = None,
) -> int:
    """Runs the job as `mesh.num_slices` processes; returns the exit status.

    Args:
        spec: the checked config (its `mesh.num_slices` > 1; a `ResolvedConfig` is resolved).
        cluster: the fray cluster to use (default: a `LocalCluster` for this call).
        max_restarts: gang restarts allowed after a slice process dies.
        on_start: called with `(cluster, group, attempt)` once the slices are up (tests use
            it to kill a slice).
    """
    spec = as_spec(spec)
    num_slices = spec.mesh.num_slices
    local = devices_per_slice(spec)
    owned = cluster is None
    cluster = cluster or fray.LocalCluster(heartbeat_timeout_s=600.0)
    policy = fray.RestartPolicy(
        max_failures=max_restarts, max_preemptions=max_restarts, backoff_initial_s=0.5
    )
    try:
        group = cluster.spawn_group(SliceWorker, num_slices, name="slice", restart=policy)
        attempt = 0
        while True:
            coordinator = f"127.0.0.1:{fray.free_port()}"
            print(
                f"multislice: {num_slices} slice processes x {local} device(s), coordinator "
                f"{coordinator}" + (f" (restart {attempt})" if attempt else ""),
                file=sys.stderr,
                flush=True,
            )
            futures = [
                handle.run.options(timeout=None).remote(
                    rank, num_slices, coordinator, spec.to_json(), local
                )
                for rank, handle in enumerate(group)
            ]
            if on_start is not None:
                on_start(cluster, group, attempt)
            try:
                with _forward_sigterm(cluster, group.name):
                    results = [f.result() for f in futures]
            except (fray.ActorRestarted, fray.ActorDied, fray.ConnectionLost) as e:
                if isinstance(e, fray.ActorDied) and "will not be restarted" in str(e):
                    print(f"multislice: giving up: {e}", file=sys.stderr)
                    return 1
                attempt += 1
                print(f"multislice: a slice died ({e}); restarting the gang", file=sys.stderr)
                group = _restarted(cluster, group.name, attempt)
                continue
            first = results[0]
            print(first["summary"], flush=True)
            return PREEMPTED_EXIT_CODE if first["preempted"] else 0
    finally:
        if owned:
            cluster.shutdown()


@contextlib.contextmanager
def _forward_sigterm(cluster: fray.Cluster, name: str):
    """SIGTERM to the launcher is passed to every slice process: each saves and stops."""

    def forward(signum, frame):
        for actor in cluster.actors():
            if actor.group == name and actor.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(actor.pid, signal.SIGTERM)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, forward)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _restarted(cluster: fray.Cluster, name: str, epoch: int, timeout: float = 120.0):
    """Fresh handles to the gang once every member is alive at `epoch` or later."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = [r for r in cluster.actors() if r.group == name]
        if rows and all(r.state == "alive" and r.epoch >= epoch for r in rows):
            return cluster.get(name)
        if any(r.state in ("dead", "stopped") for r in rows):
            raise RuntimeError(f"the slice gang {name!r} was not restarted: {rows}")
        time.sleep(0.1)
    raise TimeoutError(f"the slice gang {name!r} did not come back within {timeout} s")
