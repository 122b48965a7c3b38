"""Trainer configuration: Python config files returning locked ml_collections ConfigDicts.

A config file defines `get_config(variant=None)`; it starts from `base_config()`, changes
values, and ends with `with_variant(config, variant, VARIANTS)`, so that variants are a few
overrides of one base. `load_config("path.py:variant", overrides)` resolves a file plus
command-line overrides and records where each value came from.

Example:
    >>> from meltemi.levanter.config import base_config, with_variant
    >>> config = with_variant(base_config(), None, {})
    >>> config.trainer.seed
    0
"""

from meltemi.levanter.config._base import MESH_AXES, base_config, mixture_component
from meltemi.levanter.config._resolve import (
    PROVENANCES,
    ConfigError,
    ConfigTypeError,
    ResolvedConfig,
    UnknownConfigKeyError,
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

__all__ = [
    "MESH_AXES",
    "PROVENANCES",
    "ConfigError",
    "ConfigTypeError",
    "ResolvedConfig",
    "UnknownConfigKeyError",
    "apply_overrides",
    "base_config",
    "closest_key",
    "flatten",
    "load_config",
    "mixture_component",
    "parse_override_args",
    "parse_value",
    "resolve_path",
    "set_value",
    "split_spec",
    "with_variant",
]
