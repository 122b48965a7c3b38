"""The isoflop binary end to end: `--verify` on the 2-budget, 3-size micro-sweep, and a rerun."""

import json
import pathlib
import subprocess
import sys

import pytest
from _subprocess import env

from meltemi.levanter.experiments import SweepConfigError, load_prediction

ISOFLOP = (
    pathlib.Path(__file__).parent.parent / "src" / "meltemi" / "levanter" / "main" / "isoflop.py"
)
CONFIG = pathlib.Path(__file__).parent.parent / "configs" / "isoflop.py"


def _isoflop(run_dir, cache_dir, *args, timeout=2400):
    return subprocess.run(
        [
            sys.executable,
            str(ISOFLOP),
            f"--config={CONFIG}:micro",
            f"--config.run_dir={run_dir}",
            f"--config.data.cache_dir={cache_dir}",
            *args,
        ],
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def verified(tmp_path_factory):
    """`--verify` on the micro config: sweep, fit, prediction at 3x, verification run."""
    root = tmp_path_factory.mktemp("isoflop")
    run_dir = root / "exp"
    proc = _isoflop(run_dir, root / "cache", "--verify")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir, root, proc


def test_verify_writes_the_sweep_the_fit_the_prediction_and_its_check(verified):
    run_dir, _, _ = verified
    iso = json.loads((run_dir / "isoflop.json").read_text())
    assert len(iso["runs"]) == 6
    assert sorted({r["budget"] for r in iso["runs"]}) == [3e9, 1e10]
    for r in iso["runs"]:  # every run spent its budget up to half a step
        assert (
            abs(r["flops"] - r["budget"])
            <= r["flops_per_token"] * r["batch_size"] * r["seq_len"] / 2
        )
        result = json.loads((pathlib.Path(r["run_dir"]) / "result.json").read_text())
        assert result["step"] == r["steps"]
        assert r["loss"] == result["eval"]["stdlib"]["loss"]
    assert len(iso["fit"]["parabolas"]) == 2
    assert iso["fit"]["loss_law"]["E_fixed"]  # 2 budgets: E is not fitted
    assert (run_dir / "isoflop.png").read_bytes()[:4] == b"\x89PNG"

    prediction = load_prediction(run_dir / "prediction.json")  # checks its sha256
    assert prediction["budget"] == 3e10
    assert len(prediction["inputs"]["points"]) == 6
    lo, hi = prediction["model"]["interval"]
    assert lo <= prediction["model"]["loss"] <= hi
    assert not prediction["predicted"]["noise_known"]  # 3 sizes: no residual dof

    verification = json.loads((run_dir / "verification.json").read_text())
    assert verification["prediction_sha256"] == prediction["sha256"]
    run = pathlib.Path(verification["run"]["run_dir"])
    actual = json.loads((run / "result.json").read_text())["eval"]["stdlib"]["loss"]
    assert verification["actual"] == actual
    expected_error = abs(actual - prediction["model"]["loss"]) / actual
    assert verification["relative_error"] == pytest.approx(expected_error, rel=1e-12)
    assert verification["inside_interval"] == (lo <= actual <= hi)


def test_the_sweeps_workers_train_the_verification_run(verified):
    # Workers are kept between the sweep and the verification run (imports and compiled
    # programs warm): the verification run's process is one of the sweep's.
    run_dir, _, _ = verified
    sweep_pids = {
        json.loads((pathlib.Path(r["run_dir"]) / "result.json").read_text())["pid"]
        for r in json.loads((run_dir / "isoflop.json").read_text())["runs"]
    }
    verification = json.loads((run_dir / "verification.json").read_text())
    result = json.loads((pathlib.Path(verification["run"]["run_dir"]) / "result.json").read_text())
    assert result["pid"] in sweep_pids
    assert result["cpu_s"] > 0


def test_a_rerun_skips_every_finished_run(verified):
    run_dir, root, _ = verified
    results = sorted((run_dir / "runs").glob("*/result.json"))
    before = {p: p.stat().st_mtime_ns for p in results}
    proc = _isoflop(run_dir, root / "cache")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "6 of 6 runs already finished (skipped)" in proc.stderr
    assert {p: p.stat().st_mtime_ns for p in results} == before


def test_an_edited_prediction_is_refused(verified):
    run_dir, root, _ = verified
    copy = root / "edited"
    copy.mkdir()
    payload = json.loads((run_dir / "prediction.json").read_text())
    payload["model"]["loss"] += 0.1
    (copy / "prediction.json").write_text(json.dumps(payload))
    with pytest.raises(SweepConfigError, match="its sha256 does not match its content"):
        load_prediction(copy / "prediction.json")
