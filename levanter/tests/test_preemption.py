"""Bitwise reproducibility across preemption: SIGKILL at a random step, restart, compare."""

import random
import signal
import time

import _subprocess
import numpy as np

from meltemi.levanter.checkpoint import read_manifest, restore_arrays, step_dir
from meltemi.levanter.tracking import read_metrics

STEPS = 8
OVERRIDES = (f"--config.trainer.num_train_steps={STEPS}", "--config.checkpoint.save_every_steps=1")


def _final_params(run_dir):
    root = step_dir(run_dir / "checkpoints", STEPS)
    names = {k: v for k, v in read_manifest(root)["arrays"].items() if k.startswith("params.")}
    import jax

    templates = {k: jax.ShapeDtypeStruct(tuple(v["shape"]), v["dtype"]) for k, v in names.items()}
    return {k: np.asarray(v).tobytes() for k, v in restore_arrays(root, templates).items()}


def _losses(run_dir):
    return {r["step"]: r["train/loss"] for r in read_metrics(run_dir / "metrics.jsonl")}


def test_sigkill_at_a_random_step_then_restart_is_bitwise_identical(tmp_path):
    cache = tmp_path / "cache"
    full = _subprocess.run(tmp_path / "full", cache, *OVERRIDES)
    assert full.returncode == 0, full.stderr[-2000:]

    kill_at = random.Random().randint(2, STEPS - 2)
    cut = tmp_path / "cut"
    proc = _subprocess.start(cut, cache, *OVERRIDES)
    deadline = time.monotonic() + 300
    while max(_losses(cut), default=0) < kill_at:
        assert proc.poll() is None, f"finished before step {kill_at}: {proc.stdout.read()[-2000:]}"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = max(_losses(cut))

    resumed = _subprocess.run(cut, cache, *OVERRIDES)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stderr, f"killed at step {killed_at}"
    assert _losses(cut) == _losses(tmp_path / "full"), f"killed at step {killed_at}"
    assert _final_params(cut) == _final_params(tmp_path / "full"), f"killed at step {killed_at}"
