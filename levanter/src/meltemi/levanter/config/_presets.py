"""Pieces the shipped config files share: a sibling file's config, and the smoke variant.

A run that continues another (SFT after pretraining, DPO after SFT) starts from that run's
config file, so the model and data settings that must match are written once:

    config = sibling_config(__file__, "sft.py")  # levanter/configs/sft.py's get_config()

and every shipped file's `:smoke` variant (two steps of a tiny model, what the config tests
train) is `smoke_variant(name, extra)`.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Any

import ml_collections

from meltemi.levanter.config._errors import ConfigError
from meltemi.levanter.config._resolve import _load_module

#: The tiny model of every `:smoke` variant: 2 layers, width 32, 4 heads (2 KV) of 8.
SMOKE_MODEL: Mapping[str, Any] = {
    "model.hidden_dim": 32,
    "model.intermediate_dim": 48,
    "model.num_layers": 2,
    "model.num_heads": 4,
    "model.num_kv_heads": 2,
    "model.head_dim": 8,
}

#: The run of every `:smoke` variant: 2 steps of 4 rows, one eval batch, a checkpoint per step.
SMOKE_RUN: Mapping[str, Any] = {
    "trainer.num_train_steps": 2,
    "trainer.train_batch_size": 4,
    "trainer.progress_bar": False,
    "eval.num_batches": 1,
    "eval.batch_size": 4,
    "checkpoint.save_every_steps": 1,
}


def smoke_variant(name: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A `:smoke` variant: `SMOKE_RUN` and `SMOKE_MODEL` named `name`, then `extra` on top.

    Example:
        >>> v = smoke_variant("sft-smoke", {"checkpoint.init_from": ""})
        >>> v["name"], v["model.num_layers"], v["checkpoint.init_from"]
        ('sft-smoke', 2, '')
    """
    return {"name": name, **SMOKE_RUN, **SMOKE_MODEL, **(extra or {})}


def sibling_config(
    here: str | os.PathLike, filename: str, variant: str | None = None
) -> ml_collections.ConfigDict:
    """`get_config(variant)` of the config file `filename` in the directory of `here`.

    Args:
        here: the calling config file (`__file__`) or its directory.
        filename: the sibling file, e.g. "sft.py".
        variant: the sibling's variant (None: its base config).

    Raises:
        ConfigError: no such file beside `here`.
    """
    where = pathlib.Path(here)
    path = (where if where.is_dir() else where.parent) / filename
    if not path.is_file():
        raise ConfigError(
            f"sibling_config({filename!r}): no such file {path}; name a config file in "
            f"{path.parent}, e.g. sibling_config(__file__, 'default.py')."
        )
    return _load_module(path).get_config(variant)
