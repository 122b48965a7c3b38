"""The RL trainer (the `//levanter:rl` binary) survives SIGTERM and SIGKILL: SIGTERMed, it saves
a checkpoint of the step it was on and exits 75 (preempted); SIGKILLed, it loses the steps
after its last checkpoint; either way the next run resumes from that checkpoint with the same
prompt order: every step is logged once and no prompt is trained twice."""

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
    "--config.checkpoint.save_every_steps=4",  # a checkpoint at 1..3 is SIGTERM's
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


def _start_and_wait_for_step(run_dir, step):
    proc = subprocess.Popen(_command(run_dir), env=_subprocess.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    deadline = time.monotonic() + 600
    while max(_steps(run_dir), default=0) < step:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return proc


def test_a_preempted_then_killed_trainer_resumes_with_the_same_prompt_order(tmp_path):
    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    # 1. SIGTERM after step 1 is logged: the step in progress is saved, exit status 75
    proc = _start_and_wait_for_step(run_dir, 1)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 75, out[-3000:]
    assert "stopped by SIGTERM" in out
    stopped = max(_steps(run_dir))
    assert stopped < 4, "SIGTERM came too late to test its checkpoint"
    assert latest_complete_step(checkpoints) == stopped
    # 2. resumed from it, then SIGKILLed after step 5 is logged: step 4's checkpoint is the last
    proc = _start_and_wait_for_step(run_dir, 5)
    proc.send_signal(signal.SIGKILL)
    out = proc.communicate(timeout=60)[0]
    assert f"resumed from {checkpoints}/step_{stopped:08d}" in out
    assert latest_complete_step(checkpoints) == 4
    # 3. resumed from step 4, it runs to the end
    resumed = subprocess.run(_command(run_dir), env=_subprocess.env(), capture_output=True,
                             text=True, timeout=600)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {checkpoints}/step_00000004" in resumed.stdout + resumed.stderr
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
