"""Elastic multislice: 3 slice processes (fray LocalCluster) lose one and keep training.

A slice process is killed (SIGKILL, its pid read from status.json) or preempted (SIGTERM:
it saves first) mid-run: the job shrinks to 2 slices (timed; the survivors' warm standby
processes take their places) without restarting from step 0, the replacement rejoins and
the run ends on 3 slices. Every step 1..N is logged once,
with the `data/batch_hash` and (to 1e-5) the loss of an uninterrupted 3-slice run of the
same layout in this process. Losing more slices than `mesh.min_slices` allows stops the job
with exit status 75, and starting it again resumes. The SIGKILL case runs on fray's Ray
backend too (`RayCluster`). One job per test (one test per shard).
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=3"
)

import json  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from _subprocess import DEFAULT  # noqa: E402

from meltemi import fray  # noqa: E402
from meltemi.levanter.config import load_config  # noqa: E402
from meltemi.levanter.mesh import make_mesh  # noqa: E402
from meltemi.levanter.multislice import (
    launch_multislice,  # noqa: E402
    read_status,  # noqa: E402
)
from meltemi.levanter.tracking import read_metrics  # noqa: E402
from meltemi.levanter.trainer import Trainer, build_parts  # noqa: E402

STEPS = 8
INTERRUPT_AT = 2


def _shrink_bound(load: float) -> float:
    """The issue's bound, kill -> a step on fewer slices within 30 s, when the machine was
    idle enough at the kill (1-minute load at most one per core; a re-form here compiles for
    the new slice count). Under heavier load (tests in parallel) the bound is loose, so a
    hang or a restart from step 0 still fails. `MELTEMI_ELASTIC_SHRINK_S` overrides both."""
    if "MELTEMI_ELASTIC_SHRINK_S" in os.environ:
        return float(os.environ["MELTEMI_ELASTIC_SHRINK_S"])
    return 30.0 if load <= (os.cpu_count() or 1) else 240.0


def _resolved(run_dir, cache, slices=3, min_slices=2):
    return load_config(
        f"{DEFAULT}:multislice",
        [
            ("run_dir", str(run_dir)),
            ("data.cache_dir", str(cache)),
            ("mesh.num_slices", str(slices)),
            ("mesh.min_slices", str(min_slices)),
            ("trainer.num_train_steps", str(STEPS)),
            ("trainer.train_batch_size", "6"),  # splits over 3 and over 2 slices
            ("trainer.progress_bar", "false"),
            ("data.seq_len", "16"),
            ("model.hidden_dim", "16"),
            ("model.intermediate_dim", "24"),
            ("model.num_layers", "1"),
            ("model.head_dim", "8"),
            ("eval.num_batches", "0"),
            ("checkpoint.save_every_steps", "1"),
            ("trainer.peak_flops_per_device", "1e9"),
        ],
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 3-slice layout in this process (3 fake devices)."""
    root = tmp_path_factory.mktemp("reference")
    single = _resolved(root / "single", root / "cache")
    mesh = make_mesh({"data": 1}, {"data": -1}, num_slices=3, devices=jax.devices()[:3])
    Trainer(single, build_parts(single.config), mesh).run()
    records = read_metrics(root / "single" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    return records, root / "cache"


def _watch(run_dir, until, action, timeout=300.0):
    """Calls `action(records)` (in a thread) once `until(records)` holds for metrics.jsonl."""

    def loop():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            records = read_metrics(run_dir / "metrics.jsonl")
            if records and until(records):
                action(records)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def _hold_until(run_dir, pid, ready, timeout=60.0):
    """Pauses process `pid` (SIGSTOP: its gang waits in the next collective) until
    `ready(status)` holds, so that an 8-step run is long enough for a cold replacement.
    (Well under jax.distributed's 100 s heartbeat timeout, after which the others abort.)"""
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not ready(read_status(run_dir)):
            time.sleep(0.05)
    finally:
        os.kill(pid, signal.SIGCONT)


def _interrupt_one_slice(run_dir, signum, events):
    """At step INTERRUPT_AT, sends `signum` to slice 1 (pid from status.json) and times how
    long until a step completes on 2 slices; then holds the 2-slice gang until the
    replacement and the survivors' new standbys are up, so that it grows back."""

    def shrunk(records):
        return any(r.get("mesh/num_slices") == 2 for r in records)

    def grow_ready(status):
        rows = status["slices"]
        return rows[1]["state"] == "rejoining" and rows[0]["standby_pid"] and rows[2]["standby_pid"]

    def on_shrunk(records):
        events["shrink_s"] = time.monotonic() - events["killed_at"]
        status = read_status(run_dir)
        events["pids_after"] = [s["pid"] for s in status["slices"]]
        _hold_until(run_dir, status["slices"][0]["pid"], grow_ready)

    def interrupt(records):
        status = read_status(run_dir)
        events["standby_before"] = [s["standby_pid"] for s in status["slices"]]
        events["load"] = os.getloadavg()[0]
        events["killed_at"] = time.monotonic()
        os.kill(status["slices"][1]["pid"], signum)
        events["at_step"] = records[-1]["step"]
        _watch(run_dir, shrunk, on_shrunk)

    def on_start(cluster, handles, generation):
        if generation == 0:
            _watch(run_dir, lambda r: r[-1]["step"] >= INTERRUPT_AT, interrupt)

    return on_start


def _check_run(run_dir, reference_records, events):
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1)), events
    assert [r["data/batch_hash"] for r in records] == [
        r["data/batch_hash"] for r in reference_records
    ]
    np.testing.assert_allclose(
        [r["train/loss"] for r in records],
        [r["train/loss"] for r in reference_records],
        rtol=1e-5,
    )
    sizes = [r["mesh/num_slices"] for r in records]
    # It ran on 3, shrank to 2 (not from step 0) and ended on 3 again.
    assert sizes[0] == 3 and sizes[-1] == 3 and 2 in sizes, sizes
    first_small = sizes.index(2) + 1
    assert first_small > events["at_step"] - 1, (sizes, events)
    status = read_status(run_dir)
    assert status["state"] == "done" and status["num_slices"] == 3, status
    assert [s["state"] for s in status["slices"]] == ["done"] * 3
    assert status["slices"][1]["restarts"] == 1, status["slices"]
    kinds = [e["kind"] for e in status["events"]]
    assert "shrink" in kinds and "rejoining" in kinds and "grow" in kinds, kinds
    # The survivors' places went to their warm standby processes (started with the first gang).
    before, after = events["standby_before"], events["pids_after"]
    assert before[0] and before[2] and [after[0], after[2]] == [before[0], before[2]], events
    # The goal of the issue: kill -> a step on fewer slices within 30 s (checked last, so a
    # slow machine reports every other property first).
    bound = _shrink_bound(events["load"])
    print(f"elastic shrink: kill -> first step on fewer slices in {events['shrink_s']:.1f} s "
          f"(bound {bound:g} s, load {events['load']:.1f})")  # fmt: skip
    assert events["shrink_s"] <= bound, events
    return status


def _kill_one_slice(cluster, tmp_path, reference) -> dict:
    """Runs the 3-slice job on `cluster`, SIGKILLs slice 1 mid-run, checks the run (see
    `_check_run`) and returns its final status."""
    records, cache = reference
    run_dir = tmp_path / "run"
    events = {}
    with cluster:
        status = launch_multislice(
            _resolved(run_dir, cache),
            cluster=cluster,
            on_start=_interrupt_one_slice(run_dir, signal.SIGKILL, events),
        )
    assert status == 0, events
    return _check_run(run_dir, records, events)


def test_a_killed_slice_shrinks_the_job_and_its_replacement_grows_it_back(tmp_path, reference):
    final = _kill_one_slice(fray.LocalCluster(heartbeat_timeout_s=600.0), tmp_path, reference)
    assert final["slices"][1]["last_exit"] == "SIGKILL", final["slices"]


def test_a_preempted_slice_saves_then_the_job_shrinks_and_grows_back(tmp_path, reference):
    records, cache = reference
    run_dir = tmp_path / "run"
    events = {}
    with fray.LocalCluster(heartbeat_timeout_s=600.0) as cluster:
        status = launch_multislice(
            _resolved(run_dir, cache),
            cluster=cluster,
            on_start=_interrupt_one_slice(run_dir, signal.SIGTERM, events),
        )
    assert status == 0, events
    final = _check_run(run_dir, records, events)
    assert final["slices"][1]["last_exit"] == "preempted (SIGTERM)", final["slices"]
    # The preempted slice saved with the others: the 2-slice gang resumed from the very step
    # it stopped at (no step was trained twice, none lost).
    lost = next(e for e in final["events"] if e["kind"] == "lost")
    assert "preempted" in lost["reason"], lost


def test_losing_more_slices_than_min_slices_stops_with_75_and_resumes(tmp_path, reference, capfd):
    records, cache = reference
    run_dir = tmp_path / "run"
    resolved = _resolved(run_dir, cache, slices=2, min_slices=2)
    events = {}

    def kill(records):
        pid = next(s["pid"] for s in read_status(run_dir)["slices"] if s["index"] == 1)
        os.kill(pid, signal.SIGKILL)
        events["at_step"] = records[-1]["step"]

    def on_start(cluster, handles, generation):
        if generation == 0:
            _watch(run_dir, lambda r: r[-1]["step"] >= INTERRUPT_AT, kill)

    with fray.LocalCluster(heartbeat_timeout_s=600.0) as cluster:
        status = launch_multislice(
            resolved,
            cluster=cluster,
            on_start=on_start,
            available=lambda index, attempt: False,  # the lost slice does not come back
            max_restarts=2,
            backoff_s=0.05,
        )
    assert status == 75, events
    err = capfd.readouterr().err
    assert "1 of 2 slices alive, below mesh.min_slices=2" in err, err
    assert "Start the job again to resume" in err, err
    stopped = read_status(run_dir)
    assert stopped["state"] == "stopped" and "min_slices" in stopped["reason"], stopped
    assert [s["state"] for s in stopped["slices"]] == ["done", "lost"], stopped["slices"]
    before = max(r["step"] for r in read_metrics(run_dir / "metrics.jsonl"))
    assert 0 < before < STEPS

    with fray.LocalCluster(heartbeat_timeout_s=600.0) as cluster:
        assert launch_multislice(resolved, cluster=cluster) == 0
    logged = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in logged] == list(range(1, STEPS + 1))
    assert [r["data/batch_hash"] for r in logged] == [r["data/batch_hash"] for r in records]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "done"


def test_a_killed_slice_shrinks_and_grows_back_on_ray(tmp_path, reference):
    """The same job on fray's Ray backend: each slice process is a Ray actor's worker."""
    from meltemi.fray.ray import RayCluster

    cluster = RayCluster(num_cpus=2, include_dashboard=False, heartbeat_timeout_s=600.0)
    final = _kill_one_slice(cluster, tmp_path, reference)
    # Ray's raylet, not the launcher, is the worker's parent: the launcher sees the actor
    # die, not the signal that killed it.
    lost = next(e for e in final["events"] if e["kind"] == "lost")
    assert lost["reason"].startswith("slice 1 died"), lost
