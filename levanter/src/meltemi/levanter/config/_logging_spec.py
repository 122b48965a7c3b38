"""`logging.*`: TensorBoard event files and Weights & Biases."""

from __future__ import annotations

import dataclasses

import ml_collections

from meltemi.levanter.config._checks import Flag, OneOf, Text
from meltemi.levanter.config._keys import key, read

WANDB_MODES = ("online", "offline", "disabled")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoggingSpec:
    """`logging.*`: TensorBoard event files and Weights & Biases."""

    tensorboard: bool = key(
        False, "Write TensorBoard event files in `<run_dir>/tensorboard`.", Flag()
    )
    wandb: bool = key(False, "Log to Weights & Biases.", Flag())
    wandb_project: str = key("meltemi", "The W&B project.", Text())
    wandb_mode: str = key("offline", "The W&B mode.", OneOf(WANDB_MODES))


def logging_spec(c: ml_collections.ConfigDict) -> LoggingSpec:
    """The checked `logging` section."""
    return LoggingSpec(**read(LoggingSpec, c, "logging."))
