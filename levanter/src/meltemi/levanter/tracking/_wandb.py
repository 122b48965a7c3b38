"""Weights & Biases: one W&B run per run directory, resumed with it (the `wandb` extra)."""

from __future__ import annotations

import importlib
import pathlib
import secrets
from collections.abc import Mapping
from typing import Any

from meltemi.levanter.config import ConfigError

#: The file in the run directory holding the W&B run id, so a resumed run logs to the same run.
WANDB_ID_FILE = "wandb_id.txt"


def wandb_run_id(run_dir: pathlib.Path) -> str:
    """The run directory's W&B run id: read from `wandb_id.txt`, or made and written there."""
    path = pathlib.Path(run_dir) / WANDB_ID_FILE
    if path.exists():
        return path.read_text().strip()
    run_id = secrets.token_hex(4)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(run_id + "\n")
    return run_id


def open_wandb(
    run_dir: pathlib.Path, *, project: str, name: str, mode: str, config: Mapping[str, Any]
) -> Any:
    """A W&B run for `run_dir`, resuming the one a previous process of this run started.

    In offline mode the run file under `run_dir/wandb` is written by W&B's service process,
    which closes it after `run.finish()` returns: it is complete once the interpreter exits
    or `wandb.teardown()` returns (run `wandb sync` after either).

    Args:
        run_dir: the run directory (holds `wandb/` and `wandb_id.txt`).
        project: the W&B project.
        name: the run's display name.
        mode: "online", "offline" (sync later with `wandb sync`) or "disabled".
        config: the config to record.

    Raises:
        ConfigError: `wandb` is not installed (it is the `[wandb]` extra).
    """
    try:
        # The `wandb` extra: imported by name, only when asked for.
        wandb = importlib.import_module("wandb")
    except ImportError:
        raise ConfigError(
            "logging.wandb=True needs the `wandb` package, which is not installed: "
            "pip install meltemi-levanter[wandb], or turn it off with "
            "--config.logging.wandb=false."
        ) from None
    return wandb.init(
        project=project,
        name=name,
        dir=str(run_dir),
        mode=mode,
        config=dict(config),
        id=wandb_run_id(run_dir),
        resume="allow",
    )
