"""The train binary: a real 2-step run, --print_config, and config errors (exit 2)."""

import subprocess
import sys

import _subprocess


def test_smoke_run_prints_summary_and_loss_curve(tmp_path):
    proc = _subprocess.run(tmp_path / "run", tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "run finished: step 2/2" in proc.stdout
    assert "bits/byte" in proc.stdout
    assert (tmp_path / "run" / "loss.png").exists()
    assert f"loss curve: {tmp_path / 'run' / 'loss.png'}" in proc.stdout
    assert (tmp_path / "run" / "config.json").exists()

    # //levanter:plot redraws the curve from metrics.jsonl.
    (tmp_path / "run" / "loss.png").unlink()
    plot = _subprocess.TRAIN.parent / "plot.py"
    proc = subprocess.run(
        [sys.executable, str(plot), f"--run_dir={tmp_path / 'run'}"],
        env=_subprocess.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(tmp_path / "run" / "loss.png")
    assert (tmp_path / "run" / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_print_config_shows_provenance_and_exits(tmp_path):
    proc = _subprocess.run(
        tmp_path / "run", tmp_path / "cache", "--config.trainer.seed=7", "--print_config"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    seed = next(ln for ln in lines if ln.startswith("trainer.seed "))
    assert "= 7" in seed and seed.endswith("# flag")
    steps = next(ln for ln in lines if ln.startswith("trainer.num_train_steps "))
    assert steps.endswith("# variant")
    assert not (tmp_path / "run").exists()


def test_misspelt_key_exits_2_with_suggestion(tmp_path):
    proc = _subprocess.run(
        tmp_path / "run", tmp_path / "cache", "--config.trainer.num_train_step=3"
    )
    assert proc.returncode == 2
    assert "Did you mean `--config.trainer.num_train_steps`" in proc.stderr


def test_bad_mixture_exits_2_naming_the_key(tmp_path):
    proc = _subprocess.run(tmp_path / "run", tmp_path / "cache", "--config.data.source=mixture")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "error: data.source='mixture' needs data.components" in proc.stderr
    assert not (tmp_path / "cache").exists()  # refused before building any store
