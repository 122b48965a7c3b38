"""The table of the config's sections: each key's one definition is a field of these classes."""

from __future__ import annotations

from typing import Any

from meltemi.levanter.config._checkpoint_spec import CheckpointSpec
from meltemi.levanter.config._data_spec import DataSpec
from meltemi.levanter.config._eval_spec import EvalSpec
from meltemi.levanter.config._logging_spec import LoggingSpec
from meltemi.levanter.config._mesh_spec import MeshSpec
from meltemi.levanter.config._model_spec import model_section, optimizer_section
from meltemi.levanter.config._paths import TopKeys
from meltemi.levanter.config._trainer_spec import TrainerSpec

#: `(section name, class)` in `base_config()`'s order; "" is the top level (`name`,
#: `run_dir`). `model.*` and `optimizer.*` are functions deriving the section from
#: `ModelConfig` and `OptimizerConfig` (`_model_spec`).
SECTIONS: tuple[tuple[str, Any], ...] = (
    ("", TopKeys),
    ("trainer", TrainerSpec),
    ("eval", EvalSpec),
    ("checkpoint", CheckpointSpec),
    ("mesh", MeshSpec),
    ("model", model_section),
    ("optimizer", optimizer_section),
    ("data", DataSpec),
    ("logging", LoggingSpec),
)
