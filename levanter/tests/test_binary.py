"""The train binary: a real 2-step run, --print_config, and config errors (exit 2, one line)."""

import subprocess
import sys

import _subprocess
import pytest
from _one_error import one_error_line


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One real 2-step run with a relative run dir (the summary's paths and the curve)."""
    root = tmp_path_factory.mktemp("smoke")
    proc = _subprocess.run("run", root / "cache", cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, proc


def test_smoke_run_prints_summary_and_loss_curve(smoke):
    root, proc = smoke
    assert "run finished: step 2/2" in proc.stdout
    assert "bits/byte" in proc.stdout
    assert (root / "run" / "loss.png").exists()
    assert (root / "run" / "config.json").exists()


def test_plot_redraws_the_loss_curve_from_metrics(smoke, tmp_path):
    root, _ = smoke
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_bytes((root / "run" / "metrics.jsonl").read_bytes())
    plot = _subprocess.TRAIN.parent / "plot.py"
    proc = subprocess.run(
        [sys.executable, str(plot), f"--run_dir={run}"],
        env=_subprocess.env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(run / "loss.png")
    assert (run / "loss.png").read_bytes()[:4] == b"\x89PNG"


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
    assert "Did you mean `--config.trainer.num_train_steps`" in one_error_line(proc.stderr)


def test_bad_mixture_exits_2_naming_the_key(tmp_path):
    proc = _subprocess.run(tmp_path / "run", tmp_path / "cache", "--config.data.source=mixture")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "error: data.source='mixture' needs data.components" in one_error_line(proc.stderr)
    assert not (tmp_path / "cache").exists()  # refused before building any store


# -- config mistakes: one `error:` line, exit status 2, no traceback, nothing built ----------


def _refused(proc, message, cache):
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert message in one_error_line(proc.stderr), proc.stderr[-3000:]
    assert not cache.exists()  # refused before any store was built


MISTAKES = {
    "bf16": (
        "--config.trainer.compute_dtype=bf16",
        "error: trainer.compute_dtype='bf16': write the dtype's name, "
        "--config.trainer.compute_dtype=bfloat16",
    ),
    "preset": ("--config.model.preset=tiny-lama", "Did you mean 'tiny-llama'?"),
    "string_patterns": (
        "--config.optimizer.no_decay_patterns=norm",
        "error: optimizer.no_decay_patterns='norm' is a string",
    ),
    "float16": ("--config.trainer.compute_dtype=float16", "float16 needs loss scaling"),
    "inert_key": (
        "--config.optimizer.skip_step_sigma=3.0",
        "error: optimizer.skip_step_sigma=3.0 has no effect while skip_step_window=None",
    ),
}
# Every mistake through the training path; the dry-run path (which shares the config
# checks) with a ConfigError and an InertKeyError, one process each.
CASES = [("train", m) for m in MISTAKES] + [("dry_run", "bf16"), ("dry_run", "inert_key")]


@pytest.mark.parametrize("path, mistake", CASES, ids=[f"{m}-{p}" for p, m in CASES])
def test_config_mistake_is_one_error_line_and_status_2(tmp_path, path, mistake):
    override, message = MISTAKES[mistake]
    extra = ("--dry_run", "--dry_run_devices=1") if path == "dry_run" else ()
    proc = _subprocess.run(tmp_path / "run", tmp_path / "cache", override, *extra)
    _refused(proc, message, tmp_path / "cache")
    assert not (tmp_path / "run").exists()


def test_resuming_with_another_model_shape_is_one_error_line(smoke, tmp_path):
    root, _ = smoke
    again = _subprocess.run(
        root / "run",
        tmp_path / "cache",
        "--config.eval.num_batches=0",
        "--config.trainer.num_train_steps=3",
        "--config.model.hidden_dim=48",
    )
    assert again.returncode == 2, again.stderr[-3000:]
    assert "params" in one_error_line(again.stderr), again.stderr[-3000:]


def test_summary_paths_are_relative_to_the_working_directory(smoke):
    root, proc = smoke
    lines = proc.stdout.splitlines()
    for line in ("  run dir: run", "  checkpoints: run/checkpoints",
                 "  metrics: run/metrics.jsonl", "  loss curve: run/loss.png"):  # fmt: skip
        assert line in lines, proc.stdout
    assert str(root) not in proc.stdout
