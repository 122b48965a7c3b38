"""Bitwise reproducibility across preemption: SIGKILL at a seeded random step, restart, compare."""

import random
import signal
import time

import _subprocess
import jax
import numpy as np

from meltemi.levanter.checkpoint import read_manifest, restore_arrays, step_dir
from meltemi.levanter.tracking import read_metrics

STEPS = 8
SEED = 21
OVERRIDES = (
    f"--config.trainer.num_train_steps={STEPS}",
    "--config.checkpoint.save_every_steps=1",
    "--config.eval.num_batches=0",  # what is compared is the training, not the evaluation
)


def _final_params(run_dir):
    root = step_dir(run_dir / "checkpoints", STEPS)
    names = {k: v for k, v in read_manifest(root)["arrays"].items() if k.startswith("params.")}
    templates = {k: jax.ShapeDtypeStruct(tuple(v["shape"]), v["dtype"]) for k, v in names.items()}
    return {k: np.asarray(v).tobytes() for k, v in restore_arrays(root, templates).items()}


def _losses(run_dir):
    return {r["step"]: r["train/loss"] for r in read_metrics(run_dir / "metrics.jsonl")}


def _interrupt(run_dir, cache, at_step, sig):
    proc = _subprocess.start(run_dir, cache, *OVERRIDES)
    deadline = time.monotonic() + 300
    while max(_losses(run_dir), default=0) < at_step:
        assert proc.poll() is None, f"finished before step {at_step}: {proc.stdout.read()[-2000:]}"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(sig)
    return proc.wait(timeout=120), proc.stdout.read()


def test_interrupted_then_restarted_runs_are_bitwise_identical(tmp_path):
    cache = tmp_path / "cache"
    full = _subprocess.run(tmp_path / "full", cache, *OVERRIDES)
    assert full.returncode == 0, full.stderr[-2000:]
    reference = _losses(tmp_path / "full"), _final_params(tmp_path / "full")

    # SIGKILL at a step drawn from a fixed seed (reproducible; change SEED to try another):
    # resume from the last periodic checkpoint.
    kill_at = random.Random(SEED).randint(2, STEPS - 2)
    _interrupt(tmp_path / "killed", cache, kill_at, signal.SIGKILL)
    resumed = _subprocess.run(tmp_path / "killed", cache, *OVERRIDES)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stderr, f"killed at step {kill_at}"
    killed = _losses(tmp_path / "killed"), _final_params(tmp_path / "killed")
    assert killed == reference, f"killed at step {kill_at}"

    # SIGTERM (preemption): a checkpoint is saved, the binary exits with status 75.
    status, output = _interrupt(tmp_path / "term", cache, 3, signal.SIGTERM)
    assert status == 75, output[-2000:]
    assert "preempted (checkpoint saved)" in output
    resumed = _subprocess.run(tmp_path / "term", cache, *OVERRIDES)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (_losses(tmp_path / "term"), _final_params(tmp_path / "term")) == reference
