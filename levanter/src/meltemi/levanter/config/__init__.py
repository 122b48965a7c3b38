"""Trainer configuration: Python config files, checked once into a typed `RunSpec`.

A config file defines `get_config(variant=None)`; it starts from `base_config()`, changes
values, and ends with `with_variant(config, variant, VARIANTS)`, so that variants are a few
overrides of one base. `load_config("path.py:variant", overrides)` resolves a file plus
command-line overrides and records where each value came from; `resolve(...)` checks every
value (cross-field ones included) and returns frozen typed sections, the only form the
trainer reads. Every mistake is a `ConfigError`.

Example:
    >>> from meltemi.levanter.config import base_config, resolve, with_variant
    >>> spec = resolve(with_variant(base_config(), None, {}))
    >>> spec.trainer.seed, spec.trainer.train_batch_size
    (0, 8)
"""

from meltemi.levanter.config._base import base_config, key_reference, mixture_component
from meltemi.levanter.config._checks import check_choice, check_int
from meltemi.levanter.config._data_spec import load_chat_template, special_token_ids
from meltemi.levanter.config._errors import (
    BuildError,
    ConfigError,
    ConfigTypeError,
    InertKeyError,
    UnknownConfigKeyError,
)
from meltemi.levanter.config._mixture import (
    Component,
    MixtureConfigError,
    MixturePlan,
    file_source,
    mixture_plan,
    parse_component_source,
)
from meltemi.levanter.config._presets import SMOKE_MODEL, SMOKE_RUN, sibling_config, smoke_variant
from meltemi.levanter.config._resolve import (
    PROVENANCES,
    ResolvedConfig,
    apply_overrides,
    closest_key,
    flatten,
    load_config,
    parse_override_args,
    parse_value,
    resolve_path,
    set_value,
    split_spec,
    with_variant,
)
from meltemi.levanter.config._rl_spec import (
    RL_BACKENDS,
    RL_OBJECTIVES,
    RLSpec,
    rl_key_reference,
    rl_section,
    rl_spec,
)
from meltemi.levanter.config._schedule import BatchScheduleError, BatchSizes
from meltemi.levanter.config._spec import (
    COMPUTE_DTYPES,
    CheckpointSpec,
    DataSpec,
    EvalSpec,
    LoggingSpec,
    MeshSpec,
    RunSpec,
    TrainerSpec,
    as_spec,
    compute_dtype,
    default_cache_dir,
    lora_config,
    make_tokenizer,
    model_config,
    optimizer_config,
    optimizer_error,
    resolve,
    resolve_run_dir,
)

__all__ = [
    "RL_BACKENDS",
    "RL_OBJECTIVES",
    "SMOKE_MODEL",
    "SMOKE_RUN",
    "RLSpec",
    "rl_key_reference",
    "rl_section",
    "rl_spec",
    "COMPUTE_DTYPES",
    "PROVENANCES",
    "BatchScheduleError",
    "BatchSizes",
    "BuildError",
    "CheckpointSpec",
    "Component",
    "ConfigError",
    "ConfigTypeError",
    "DataSpec",
    "EvalSpec",
    "InertKeyError",
    "LoggingSpec",
    "MeshSpec",
    "MixtureConfigError",
    "MixturePlan",
    "ResolvedConfig",
    "RunSpec",
    "TrainerSpec",
    "UnknownConfigKeyError",
    "apply_overrides",
    "as_spec",
    "base_config",
    "check_choice",
    "check_int",
    "closest_key",
    "compute_dtype",
    "default_cache_dir",
    "file_source",
    "flatten",
    "load_chat_template",
    "key_reference",
    "load_config",
    "lora_config",
    "make_tokenizer",
    "mixture_component",
    "mixture_plan",
    "model_config",
    "optimizer_config",
    "optimizer_error",
    "parse_component_source",
    "parse_override_args",
    "parse_value",
    "resolve",
    "resolve_path",
    "resolve_run_dir",
    "set_value",
    "sibling_config",
    "smoke_variant",
    "special_token_ids",
    "split_spec",
    "with_variant",
]
