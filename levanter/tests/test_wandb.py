"""Weights & Biases logging works offline: every step's metrics reach the local run file."""

import json
import pathlib
import re

import wandb

from meltemi.levanter.config import load_config
from meltemi.levanter.tracking import WANDB_ID_FILE
from meltemi.levanter.trainer import train

DEFAULT = pathlib.Path(__file__).parent.parent / "configs" / "default.py"


def test_offline_wandb_run_records_every_logged_metric(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    resolved = load_config(
        f"{DEFAULT}:smoke",
        [
            ("run_dir", str(tmp_path / "run")),
            ("data.cache_dir", str(tmp_path / "cache")),
            ("logging.wandb", "true"),
            ("logging.wandb_mode", "offline"),
            ("checkpoint.enabled", "false"),
            ("eval.num_batches", "0"),  # the training metrics are what is checked
        ],
    )
    result = train(resolved)
    assert result.step == 2
    # `run.finish()` only informs W&B's service process, which closes (flushes) the run
    # file afterwards; `teardown` waits for it, as the interpreter's exit would.
    wandb.teardown()

    run_files = list((tmp_path / "run").glob("wandb/offline-run-*/run-*.wandb"))
    assert len(run_files) == 1, list((tmp_path / "run").rglob("*"))
    # The offline run file is a log of protobuf records whose history items carry each
    # metric's key and its value as JSON text, so both appear verbatim in the bytes.
    data = run_files[0].read_bytes()
    records = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in records] == [1, 2]
    for key in ("train/loss", "optim/grad_norm", "throughput/tokens_per_second"):
        assert key.encode() in data, key
    for record in records:
        assert json.dumps(record["train/loss"]).encode() in data, record["train/loss"]


def test_a_resumed_run_logs_to_the_same_wandb_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    resolved = load_config(
        f"{DEFAULT}:smoke",
        [
            ("run_dir", str(tmp_path / "run")),
            ("data.cache_dir", str(tmp_path / "cache")),
            ("logging.wandb", "true"),
            ("logging.wandb_mode", "offline"),
            ("eval.num_batches", "0"),
        ],
    )
    first = train(resolved, stop_after=1)
    assert first.step == 1
    second = train(resolved)
    assert second.start_step == 1 and second.step == 2
    run_id = (tmp_path / "run" / WANDB_ID_FILE).read_text().strip()
    runs = sorted((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 2  # one per process, both the same W&B run
    # offline-run-<YYYYMMDD_HHMMSS>-<run id>, with "-1" appended by wandb when both runs
    # started in the same second (their folder names would otherwise collide).
    names = [re.fullmatch(r"offline-run-\d{8}_\d{6}-([^-]+)(-\d+)?", r.name) for r in runs]
    assert all(names), [r.name for r in runs]
    assert {m.group(1) for m in names} == {run_id}
