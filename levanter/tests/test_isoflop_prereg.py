"""Preregistration: the prediction's digest is recorded outside the run directory, and
`verify` refuses a prediction.json whose digest differs from the recorded one (nothing is
trained here; tests/test_isoflop.py checks the same through the binary after a real sweep)."""

import json
import pathlib

import pytest
import wandb
from test_isoflop import CONFIG, _isoflop

from meltemi.levanter.config import load_config
from meltemi.levanter.experiments import (
    Experiment,
    SweepConfigError,
    check_prediction,
    parse_digest,
    payload_digest,
    preregistered_line,
    record_in_trackers,
)


def _prediction(budget=3e10, loss=2.4) -> dict:
    payload = {
        "created": "2026-11-26T10:00:00Z",
        "budget": budget,
        "metric": "loss",
        "model": {"loss": loss, "interval": [loss - 0.1, loss + 0.1]},
    }
    payload["sha256"] = payload_digest(payload)
    return payload


def _write(run_dir: pathlib.Path, payload: dict) -> pathlib.Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "prediction.json"
    path.write_text(json.dumps(payload, indent=1, sort_keys=True))
    return path


def _experiment(tmp_path, *overrides) -> Experiment:
    resolved = load_config(
        f"{CONFIG}:micro",
        [("run_dir", str(tmp_path / "exp")), ("data.cache_dir", str(tmp_path / "cache")),
         *overrides],
    )  # fmt: skip
    return Experiment(resolved, cluster="inprocess", log=lambda line: None)


def test_the_digest_is_independent_of_the_inner_sha256_and_of_formatting():
    payload = _prediction()
    assert payload_digest(payload) == payload_digest({**payload, "sha256": "0" * 64})
    assert payload_digest(json.loads(json.dumps(payload, indent=4))) == payload["sha256"]
    assert payload_digest({**payload, "budget": 3.0000001e10}) != payload["sha256"]


def test_the_printed_line_carries_the_whole_digest_and_the_flag_to_pass_it_back(tmp_path):
    payload = _prediction()
    line = preregistered_line(payload, tmp_path / "prediction.json")
    assert line.startswith(f"preregistered: prediction sha256={payload['sha256']} budget=3e+10")
    assert line.endswith(f"--verify --expect_prediction_sha256={payload['sha256']})")


@pytest.mark.parametrize("text", ["", "abc", "008a7096...", "g" * 64, "a" * 63, "a" * 65])
def test_a_digest_flag_that_is_not_a_sha256_names_the_value_and_the_fix(text):
    with pytest.raises(SweepConfigError, match=r"--expect_prediction_sha256=.*: not a SHA-256 "
                       r"\(64 hex digits\); pass the whole hex digest"):  # fmt: skip
        parse_digest(text)


def test_a_digest_flag_accepts_upper_case_and_spaces():
    assert parse_digest(f" {'AB' * 32} ") == "ab" * 32


def test_a_prediction_edited_with_its_inner_sha256_recomputed_fails_the_recorded_digest(
    tmp_path,
):
    kept = _prediction()["sha256"]
    edited = _prediction(loss=2.3)  # agrees with itself: the inner check alone would pass
    path = _write(tmp_path, edited)
    with pytest.raises(SweepConfigError, match=rf"sha256 {edited['sha256']} differs from the "
                       rf"preregistered {kept} \(--expect_prediction_sha256\)"):  # fmt: skip
        check_prediction(path, kept, "--expect_prediction_sha256")
    assert check_prediction(path, edited["sha256"], "x")["model"]["loss"] == 2.3


def test_verify_refuses_a_tampered_prediction_before_anything_runs(tmp_path):
    experiment = _experiment(tmp_path)
    kept = _prediction()["sha256"]
    _write(experiment.run_dir, _prediction(loss=2.3))
    with pytest.raises(SweepConfigError, match=rf"differs from the preregistered {kept}"):
        experiment.verify(3e10, expect_sha256=kept)
    assert not (experiment.run_dir / "runs").exists()


def test_verify_of_an_earlier_prediction_without_the_kept_digest_is_refused(tmp_path):
    experiment = _experiment(tmp_path)
    _write(experiment.run_dir, _prediction())
    with pytest.raises(SweepConfigError, match=r"was preregistered by an earlier command: pass "
                       r"the digest .* --verify --expect_prediction_sha256=<hex>"):  # fmt: skip
        experiment.verify(3e10)
    assert not (experiment.run_dir / "runs").exists()


def test_verify_with_a_digest_but_no_prediction_is_refused(tmp_path):
    experiment = _experiment(tmp_path)
    with pytest.raises(SweepConfigError, match=r"prediction.json does not exist, so nothing was "
                       r"preregistered there; check --config.run_dir"):  # fmt: skip
        experiment.verify(3e10, expect_sha256="ab" * 32)
    assert not experiment.run_dir.exists()


def test_the_digest_goes_to_the_experiments_wandb_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    payload = _prediction()
    logging = {"wandb": True, "wandb_project": "meltemi", "wandb_mode": "offline"}
    [where] = record_in_trackers(payload, logging, tmp_path, "isoflop-micro")
    assert where.startswith("wandb (offline) run ")
    # `run.finish()` only informs W&B's service process, which closes (flushes) the run
    # file afterwards; `teardown` waits for it, as the interpreter's exit would.
    wandb.teardown()
    [run_file] = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    data = run_file.read_bytes()
    assert b"prediction/sha256" in data and payload["sha256"].encode() in data
    assert b"isoflop-micro-prediction" in data


def test_without_wandb_nothing_is_claimed_as_recorded(tmp_path):
    logging = {"wandb": False, "wandb_project": "meltemi", "wandb_mode": "offline"}
    assert record_in_trackers(_prediction(), logging, tmp_path, "x") == []
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--expect_prediction_sha256=" + "ab" * 32],
            "error: --expect_prediction_sha256=" + "ab" * 32 + ": only --verify checks a "
            "prediction; add --verify or drop the flag.",
        ),
        (
            ["--verify", "--expect_prediction_sha256=008a7096"],
            "error: --expect_prediction_sha256='008a7096': not a SHA-256 (64 hex digits); pass "
            "the whole hex digest of the `preregistered: prediction sha256=...` line that "
            "--predict printed.",
        ),
    ],
)
def test_a_bad_digest_flag_is_one_error_line_and_status_2(tmp_path, args, message):
    proc = _isoflop(tmp_path / "exp", tmp_path / "cache", *args, timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [message]
