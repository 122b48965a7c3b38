"""Preregistration: the prediction's digest leaves the run directory before it is verified.

The SHA-256 stored inside `prediction.json` only shows that the file agrees with itself: anyone
who edits it can recompute it. What makes a prediction preregistered is a copy of its digest
*outside* the run directory, made when it was written: the `preregistered:` line printed on
stdout (for the user to keep), and the W&B run of the experiment when `logging.wandb` is on
(online, W&B's server keeps it with its own timestamp). `--verify` then checks the file
against that record: the digest held in memory when the same command wrote the prediction, or
the one the user passes back with `--expect_prediction_sha256` for a prediction written by an
earlier command. A prediction from an earlier command is never verified without it.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
from collections.abc import Mapping
from typing import Any

from meltemi.levanter.experiments._spec import SweepConfigError
from meltemi.levanter.tracking import open_wandb

PREDICTION = "prediction.json"
EXPECT_FLAG = "--expect_prediction_sha256"
_HEX64 = re.compile(r"[0-9a-f]{64}")


def payload_digest(payload: Mapping[str, Any]) -> str:
    """SHA-256 of a JSON document's canonical form, without its own `sha256` field.

    Example:
        >>> payload_digest({"budget": 1e13, "sha256": "anything"}) == payload_digest(
        ...     {"budget": 1e13})
        True
    """
    body = {k: v for k, v in payload.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def parse_digest(text: str) -> str:
    """Checks a digest passed with `--expect_prediction_sha256` (64 hex digits).

    Raises:
        SweepConfigError: not a full SHA-256 in hex.
    """
    digest = text.strip().lower()
    if not _HEX64.fullmatch(digest):
        raise SweepConfigError(
            f"{EXPECT_FLAG}={text!r}: not a SHA-256 (64 hex digits); pass the whole hex digest "
            "of the `preregistered: prediction sha256=...` line that --predict printed."
        )
    return digest


def preregistered_line(payload: Mapping[str, Any], path: pathlib.Path) -> str:
    """The line printed for the user to keep when a prediction is written."""
    digest = payload["sha256"]
    return (
        f"preregistered: prediction sha256={digest} budget={payload['budget']:.6g} "
        f"file={path} (keep this line; verify with --verify {EXPECT_FLAG}={digest})"
    )


def record_in_trackers(
    payload: Mapping[str, Any], logging: Mapping[str, Any], run_dir: pathlib.Path, name: str
) -> list[str]:
    """Logs the prediction's digest to the experiment's trackers; returns where it went.

    Only W&B leaves the run directory (online: W&B's server; offline: `run_dir/wandb` until
    `wandb sync`). `metrics.jsonl` and TensorBoard live inside the run directory, so a record
    there would prove nothing and none is written.

    Args:
        payload: the prediction as written (with its `sha256`).
        logging: the experiment config's `logging` section.
        run_dir: the experiment's run directory (W&B's local files, `wandb_id.txt`).
        name: the experiment's name (the W&B run is `<name>-prediction`).
    """
    if not logging["wandb"]:
        return []
    digest = payload["sha256"]
    record = {
        "prediction/sha256": digest,
        "prediction/budget": payload["budget"],
        "prediction/loss": payload["model"]["loss"],
        "prediction/created": payload["created"],
    }
    run = open_wandb(
        run_dir,
        project=logging["wandb_project"],
        name=f"{name}-prediction",
        mode=logging["wandb_mode"],
        config={"prediction_sha256": digest, "prediction_budget": payload["budget"]},
    )
    try:
        run.log(record)
        run.summary.update(record)
    finally:
        run.finish()
    return [f"wandb ({logging['wandb_mode']}) run {run.id}"]


def load_prediction(path: pathlib.Path) -> dict[str, Any]:
    """Reads `prediction.json`, checking its SHA-256 against its own content.

    Raises:
        SweepConfigError: the file was changed after it was written (and its `sha256` field
            was not recomputed; `check_prediction` also catches an edit that recomputed it).
    """
    payload = json.loads(pathlib.Path(path).read_text())
    if payload.get("sha256") != payload_digest(payload):
        raise SweepConfigError(
            f"{path}: its sha256 does not match its content: it was edited after it was "
            "preregistered; restore it, or preregister again in a new --config.run_dir."
        )
    return payload


def check_prediction(path: pathlib.Path, expected: str, source: str) -> dict[str, Any]:
    """Reads `prediction.json` if its digest is the one recorded outside the run directory.

    Args:
        path: the prediction file.
        expected: the digest recorded when it was preregistered.
        source: where `expected` comes from, for the error message.

    Raises:
        SweepConfigError: the digests differ (naming both), or the file disagrees with itself.
    """
    payload = json.loads(pathlib.Path(path).read_text())
    actual = payload_digest(payload)
    if actual != expected:
        raise SweepConfigError(
            f"{path}: sha256 {actual} differs from the preregistered {expected} ({source}): "
            "the prediction changed after it was preregistered; restore the preregistered "
            "prediction.json, or preregister again with --predict in a new --config.run_dir."
        )
    return load_prediction(path)
