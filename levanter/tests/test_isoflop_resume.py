"""Resume of a killed run, refusal of a changed finished run, the batch sweep, config errors."""

import json

import pytest
from test_isoflop import CONFIG, _isoflop

from meltemi.levanter.config import load_config
from meltemi.levanter.experiments import Experiment, SweepConfigError
from meltemi.levanter.trainer import train


def test_a_killed_run_resumes_from_its_checkpoint(tmp_path):
    resolved = load_config(
        f"{CONFIG}:micro",
        [("run_dir", str(tmp_path / "exp")), ("data.cache_dir", str(tmp_path / "cache"))],
    )
    lines = []
    experiment = Experiment(resolved, cluster="inprocess", log=lines.append)
    run = min(experiment.ladder.isoflop_runs(), key=lambda r: r.steps)
    # The run as the sweep starts it, interrupted after 6 of its steps with a checkpoint.
    config = experiment.ladder.run_config(
        run, str(experiment.run_dir_of(run)), [("checkpoint.save_every_steps", 3)]
    )
    assert train(config, stop_after=6).step == 6
    [record] = experiment.execute([run])
    result = json.loads((experiment.run_dir_of(run) / "result.json").read_text())
    assert result["start_step"] == 6 and result["step"] == run.steps
    assert record["loss"] == result["eval"]["stdlib"]["loss"]
    # Finished now: another sweep skips it, and a changed config for it is refused.
    experiment.execute([run])
    assert "1 of 1 runs already finished (skipped)" in lines[-1]
    changed = load_config(
        f"{CONFIG}:micro",
        [
            ("run_dir", str(tmp_path / "exp")),
            ("data.cache_dir", str(tmp_path / "cache")),
            ("optimizer.learning_rate", "0.02"),
        ],
    )
    with pytest.raises(SweepConfigError, match="finished with another config"):
        Experiment(changed, cluster="inprocess").execute([run])


def test_a_sweep_config_error_is_one_line_and_status_2(tmp_path):
    proc = _isoflop(tmp_path / "exp", tmp_path / "cache", "--config.sweep.sizes_per_budget=7")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: sweep.sizes_per_budget=7: only 4 widths in sweep.widths=(4, 8, 16, 32); add "
        "widths or lower it."
    ]


def test_batch_sweep_reports_loss_against_batch_size(tmp_path):
    resolved = load_config(
        f"{CONFIG}:micro",
        [
            ("run_dir", str(tmp_path / "exp")),
            ("data.cache_dir", str(tmp_path / "cache")),
            ("sweep.batch_budgets", "(1e9,)"),
        ],
    )
    payload = Experiment(resolved, cluster="inprocess", log=lambda line: None).batch_sweep()
    [curve] = payload["budgets"]
    assert [p["batch_size"] for p in curve["points"]] == [4, 16]
    losses = {p["batch_size"]: p["loss"] for p in curve["points"]}
    best = min(losses.values())
    within = [b for b, loss in losses.items() if loss <= best * (1 + 0.01)]
    assert curve["critical_batch_size"] == max(within)
    saved = json.loads((tmp_path / "exp" / "batch.json").read_text())
    assert saved["budgets"][0]["critical_batch_size"] == curve["critical_batch_size"]
    assert (tmp_path / "exp" / "batch.png").read_bytes()[:4] == b"\x89PNG"
