"""The isoflop binary end to end: `--verify` on the 2-budget micro-sweep (4 sizes per budget,
so the run noise and the intervals are estimated), a rerun, and the preregistration check."""

import json
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
from _subprocess import env

from meltemi.levanter.experiments import SweepConfigError, load_prediction, payload_digest

ISOFLOP = (
    pathlib.Path(__file__).parent.parent / "src" / "meltemi" / "levanter" / "main" / "isoflop.py"
)
CONFIG = pathlib.Path(__file__).parent.parent / "configs" / "isoflop.py"
# 4 sizes per budget (the micro config's 3 leave the parabolas no residual degree of freedom,
# so every interval collapses to a point and `inside_interval` could not fail), on widths
# 2-16 of 2-dim heads: with widths 4-32, the 3e9 minimum lies below the smallest size and its
# extrapolated N_opt (31 parameters) put the trained model 8.2% off its prediction.
# Batch 32 at learning rate 2e-2 (the micro config: 16 at 1e-2) halves the steps of the same
# budgets: 1.57% error and 103 CPU s, against 1.81% and 151 CPU s (2026-11-27); batch 64 at
# 2e-2 missed by 3.49%.
SWEEP = (
    "--config.sweep.sizes_per_budget=4",
    "--config.sweep.head_dim=2",
    "--config.sweep.widths=(2, 4, 8, 16)",
    "--config.sweep.min_batch=32",
    "--config.sweep.max_batch=32",
    "--config.optimizer.learning_rate=2e-2",
)
# The verification run's loss against the prediction for the model it trains, 3x past the
# largest budget: 1.57% measured (2026-11-27, README); the default sweep's goal is 3%.
MAX_RELATIVE_ERROR = 0.03
PREREGISTERED = re.compile(r"^preregistered: prediction sha256=([0-9a-f]{64}) ", re.M)


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
    proc = _isoflop(run_dir, root / "cache", *SWEEP, "--verify")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir, root, proc


def _kept_digest(proc) -> str:
    """The digest of the one `preregistered:` line the command printed (what a user keeps)."""
    [digest] = PREREGISTERED.findall(proc.stdout)
    return digest


def test_verify_writes_the_sweep_the_fit_the_prediction_and_its_check(verified):
    run_dir, _, _ = verified
    iso = json.loads((run_dir / "isoflop.json").read_text())
    assert len(iso["runs"]) == 8
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
    assert len(prediction["inputs"]["points"]) == 8
    lo, hi = prediction["model"]["interval"]
    assert prediction["predicted"]["noise_known"]  # 4 sizes: one residual dof per budget
    assert lo < prediction["model"]["loss"] < hi  # a real interval, not a point
    assert (hi - lo) / prediction["model"]["loss"] > 1e-3

    verification = json.loads((run_dir / "verification.json").read_text())
    assert verification["prediction_sha256"] == prediction["sha256"]
    run = pathlib.Path(verification["run"]["run_dir"])
    actual = json.loads((run / "result.json").read_text())["eval"]["stdlib"]["loss"]
    assert verification["actual"] == actual
    expected_error = abs(actual - prediction["model"]["loss"]) / actual
    assert verification["relative_error"] == pytest.approx(expected_error, rel=1e-12)
    assert verification["inside_interval"] == (lo <= actual <= hi)
    assert verification["relative_error"] <= MAX_RELATIVE_ERROR, verification


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
    proc = _isoflop(run_dir, root / "cache", *SWEEP)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "8 of 8 runs already finished (skipped)" in proc.stderr
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


def test_the_prediction_digest_is_printed_once_for_the_user_to_keep(verified):
    run_dir, _, proc = verified
    prediction = json.loads((run_dir / "prediction.json").read_text())
    assert _kept_digest(proc) == payload_digest(prediction) == prediction["sha256"]
    verification = json.loads((run_dir / "verification.json").read_text())
    assert verification["prediction_sha256_checked_against"] == "printed by this command"


def _tampered(run_dir, dest):
    """A copy of the prediction with its loss moved and its inner sha256 recomputed, as an
    edit by someone who read `payload_digest` would look (the inner check then passes)."""
    dest.mkdir()
    payload = json.loads((run_dir / "prediction.json").read_text())
    payload["model"]["loss"] += 0.05
    payload["sha256"] = payload_digest(payload)
    (dest / "prediction.json").write_text(json.dumps(payload, indent=1, sort_keys=True))
    load_prediction(dest / "prediction.json")  # agrees with itself
    return payload["sha256"]


def test_verify_refuses_a_prediction_changed_after_it_was_preregistered(verified):
    run_dir, root, proc = verified
    kept = _kept_digest(proc)
    changed = _tampered(run_dir, root / "tampered")
    proc = _isoflop(
        root / "tampered", root / "cache", *SWEEP, "--verify", f"--expect_prediction_sha256={kept}"
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    [line] = proc.stderr.strip().splitlines()
    assert line == (
        f"error: {root / 'tampered' / 'prediction.json'}: sha256 {changed} differs from the "
        f"preregistered {kept} (--expect_prediction_sha256): the prediction changed after it "
        "was preregistered; restore the preregistered prediction.json, or preregister again "
        "with --predict in a new --config.run_dir."
    )
    assert not (root / "tampered" / "runs").exists()  # refused before anything ran


def test_verify_of_an_earlier_prediction_needs_the_kept_digest(verified):
    run_dir, root, _ = verified
    (root / "earlier").mkdir()
    shutil.copy(run_dir / "prediction.json", root / "earlier" / "prediction.json")
    proc = _isoflop(root / "earlier", root / "cache", *SWEEP, "--verify")
    assert proc.returncode == 2, proc.stderr[-3000:]
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {root / 'earlier' / 'prediction.json'} was preregistered by")
    assert "--verify --expect_prediction_sha256=<hex>" in line
    assert not (root / "earlier" / "runs").exists()


def test_verify_with_the_kept_digest_checks_an_earlier_prediction(verified):
    run_dir, root, proc = verified
    copy = root / "kept"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("jax_cache"))
    proc = _isoflop(copy, root / "cache", *SWEEP, "--verify", f"--expect_prediction_sha256="
                    f"{_kept_digest(proc).upper()}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert PREREGISTERED.search(proc.stdout) is None  # nothing new was preregistered
    verification = json.loads((copy / "verification.json").read_text())
    assert verification["prediction_sha256_checked_against"] == "--expect_prediction_sha256"
    assert "1 of 1 runs already finished (skipped)" in proc.stderr  # only the verify run
