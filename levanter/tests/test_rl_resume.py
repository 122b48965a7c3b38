"""A SIGKILLed RL trainer (the `//levanter:rl` binary) resumes from its checkpoint with the
same prompt order: every step is logged once and no prompt is trained twice."""

import pathlib
import signal
import subprocess
import sys
import time

import _subprocess

from meltemi.levanter.checkpoint import latest_complete_step
from meltemi.levanter.tracking import read_metrics

RL = pathlib.Path(__file__).parent.parent / "src" / "meltemi" / "levanter" / "main" / "rl.py"
CONFIG = pathlib.Path(__file__).parent.parent / "configs" / "rl_arithmetic.py"
STEPS, PROMPTS = 6, 4
OVERRIDES = (
    "--config.checkpoint.init_from=",  # the prompt order, not the learning, is under test
    f"--config.trainer.num_train_steps={STEPS}",
    "--config.checkpoint.save_every_steps=2",
    "--config.checkpoint.async_save=false",
    "--config.rl.backend=inprocess",
    "--config.rl.num_workers=1",
    f"--config.rl.prompts_per_step={PROMPTS}",
    "--config.rl.samples_per_prompt=2",
    "--config.rl.eval_prompts=0",
)


def _command(run_dir):
    return [sys.executable, str(RL), f"--config={CONFIG}", f"--config.run_dir={run_dir}",
            *OVERRIDES]  # fmt: skip


def _steps(run_dir):
    path = run_dir / "metrics.jsonl"
    return [r["step"] for r in read_metrics(path)] if path.exists() else []


def test_a_killed_trainer_resumes_with_the_same_prompt_order(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(_command(run_dir), env=_subprocess.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    deadline = time.monotonic() + 600
    # killed after step 3 is logged: the checkpoint of step 2 is the one it resumes from
    while max(_steps(run_dir), default=0) < 3:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert latest_complete_step(run_dir / "checkpoints") == 2
    resumed = subprocess.run(_command(run_dir), env=_subprocess.env(), capture_output=True,
                             text=True, timeout=600)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout + resumed.stderr
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    trained = [i for r in records for i in r["rl/prompts"]]
    assert len(trained) == len(set(trained)), trained
    for r in records:  # step s trains the cursor's prompts [(s-1)P, sP), less dropped ones
        expect = set(range((r["step"] - 1) * PROMPTS, r["step"] * PROMPTS))
        assert set(r["rl/prompts"]) | set(r["rl/dropped_prompts"]) == expect


def test_the_8b_config_is_planned_by_the_dry_run():
    math = CONFIG.with_name("rl_math.py")
    out = subprocess.run(
        [sys.executable, str(RL), f"--config={math}", "--dry_run", "--dry_run_devices=64",
         "--dry_run_hbm_gib=32"],
        env=_subprocess.env(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "8.03B parameters" in out.stdout and "fits" in out.stdout
    assert "rollouts: 8 workers x 8 devices" in out.stdout
    assert "1024 sequences of <= 2048 tokens" in out.stdout
