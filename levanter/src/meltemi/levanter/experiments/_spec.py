"""The `sweep` section of an experiment config, checked once into a frozen `SweepSpec`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import ml_collections

from meltemi.levanter.config import ConfigError, check_choice, check_int

FAMILIES = ("dense", "moe")
METRICS = ("loss", "bpb")
KINDS = ("isoflop", "batch")


class SweepConfigError(ConfigError):
    """A `sweep.*` value that cannot be used (the message names the key, value and fix)."""


class SweepRunError(RuntimeError):
    """Runs of a sweep failed (the message names each run and its error)."""


def sweep_section() -> ml_collections.ConfigDict:
    """The `sweep` keys with their defaults, for a config file to add to `base_config()`.

    Example:
        >>> section = sweep_section()
        >>> section.sizes_per_budget, section.metric
        (4, 'loss')
    """
    s = ml_collections.ConfigDict()
    # Compute budgets in FLOPs (model FLOPs: 6N per token plus attention, see _ladder.py).
    s.budgets = (1e11, 3.2e11, 1e12, 3.2e12)
    # Model widths of the ladder (hidden_dim); depth, heads and MLP follow the rules below.
    s.widths = (16, 32, 48, 64, 80, 96, 128, 160, 192, 256)
    s.sizes_per_budget = 4
    # Centre of each budget's sizes: the ladder shapes nearest N = sqrt(C / (6 * ratio)).
    # Not Chinchilla's 20: on this byte-level CPU sweep the 1e12 optimum lies at N <= 68k
    # (D/N >= 26; widths 48-96 measured, README), so the sizes are centred lower.
    s.tokens_per_param = 100.0
    # dense: the config's Llama preset; moe: model.preset must be an MoE preset.
    s.family = "dense"
    s.num_experts = 4
    s.experts_per_token = 2
    s.head_dim = 16
    # num_layers = max(min_layers, round(width / width_per_layer)).
    s.width_per_layer = 32
    s.min_layers = 2
    # intermediate_dim = mlp_ratio * width, rounded up to a multiple of 8.
    s.mlp_ratio = 8.0 / 3.0
    # Batch rule: the power of two nearest tokens / (seq_len * target_steps), clipped.
    s.target_steps = 200
    s.min_batch = 4
    s.max_batch = 64
    # What is fitted: final eval loss (nats per token) or bits per byte, on this eval set
    # ("": the first one).
    s.metric = "loss"
    s.eval_set = ""
    # Runs trained at once (one fray actor, i.e. one process, each).
    s.parallel = 2
    s.bootstrap = 400
    s.confidence = 0.95
    s.seed = 0
    # --verify without --predict: predict at this multiple of the largest budget.
    s.predict_factor = 3.0
    # --sweep=batch: these batch sizes at these budgets (empty: the largest budget) for the
    # ladder shape of this width (0: the one nearest the budget's N guess).
    s.batch_sizes = (4, 8, 16, 32, 64)
    s.batch_budgets = ()
    s.batch_width = 0
    # A batch size is "critical" while its loss is within this fraction of the best one.
    s.batch_tolerance = 0.01
    return s


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """The checked `sweep` section (see `sweep_section` for what each field means)."""

    budgets: tuple[float, ...]
    widths: tuple[int, ...]
    sizes_per_budget: int
    tokens_per_param: float
    family: str
    num_experts: int
    experts_per_token: int
    head_dim: int
    width_per_layer: int
    min_layers: int
    mlp_ratio: float
    target_steps: int
    min_batch: int
    max_batch: int
    metric: str
    eval_set: str
    parallel: int
    bootstrap: int
    confidence: float
    seed: int
    predict_factor: float
    batch_sizes: tuple[int, ...]
    batch_budgets: tuple[float, ...]
    batch_width: int
    batch_tolerance: float


def _err(key: str, value: Any, fix: str) -> SweepConfigError:
    return SweepConfigError(f"sweep.{key}={value!r}: {fix}")


def _positive_numbers(key: str, value: Any, kind: type) -> tuple:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = (value,)
    if not isinstance(value, (tuple, list)) or not value:
        raise _err(key, value, f"write a non-empty tuple, e.g. --config.sweep.{key}='(1e11, 1e12)'")
    out = []
    for v in value:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
        if not ok or (kind is int and float(v) != int(v)):
            what = "positive integers" if kind is int else "positive numbers"
            raise _err(key, tuple(value), f"every entry must be one of {what} (got {v!r}).")
        out.append(kind(v))
    if len(set(out)) != len(out):
        raise _err(key, tuple(value), "entries repeat; list each once.")
    return tuple(sorted(out))


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    return check_choice(f"sweep.{key}", value, choices, suggest=False, error=SweepConfigError)


def _int_at_least(key: str, value: Any, low: int) -> int:
    return check_int(f"sweep.{key}", value, minimum=low, error=SweepConfigError)


def sweep_spec(section: Mapping[str, Any] | ml_collections.ConfigDict) -> SweepSpec:
    """Checks a `sweep` section and returns its frozen form.

    Raises:
        SweepConfigError: naming the key, the value and the fix.

    Example:
        >>> sweep_spec(sweep_section()).budgets
        (100000000000.0, 320000000000.0, 1000000000000.0, 3200000000000.0)
    """
    s = dict(section.items())
    unknown = sorted(set(s) - set(sweep_section().keys()))
    if unknown:
        raise _err(unknown[0], s[unknown[0]], f"unknown key; known: {sorted(sweep_section())}.")
    budgets = _positive_numbers("budgets", s["budgets"], float)
    if len(budgets) < 2:
        raise _err("budgets", budgets, "a fit needs at least 2 budgets, e.g. '(1e11, 1e12)'.")
    widths = _positive_numbers("widths", s["widths"], int)
    sizes = _int_at_least("sizes_per_budget", s["sizes_per_budget"], 3)
    if sizes > len(widths):
        raise _err(
            "sizes_per_budget",
            sizes,
            f"only {len(widths)} widths in sweep.widths={widths}; add widths or lower it.",
        )
    head_dim = _int_at_least("head_dim", s["head_dim"], 1)
    bad = [w for w in widths if w % head_dim]
    if bad:
        raise _err("widths", widths, f"{bad} are not multiples of sweep.head_dim={head_dim}.")
    min_batch = _int_at_least("min_batch", s["min_batch"], 1)
    max_batch = _int_at_least("max_batch", s["max_batch"], min_batch)
    for key in ("tokens_per_param", "mlp_ratio", "predict_factor"):
        v = s[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise _err(key, v, "must be a positive number.")
    if not 0 < s["confidence"] < 1:
        raise _err("confidence", s["confidence"], "must be in (0, 1), e.g. 0.95.")
    if not 0 <= s["batch_tolerance"] < 1:
        raise _err("batch_tolerance", s["batch_tolerance"], "must be in [0, 1), e.g. 0.01.")
    family = _choice("family", s["family"], FAMILIES)
    experts = _int_at_least("num_experts", s["num_experts"], 1)
    top_k = _int_at_least("experts_per_token", s["experts_per_token"], 1)
    if top_k > experts:
        raise _err("experts_per_token", top_k, f"exceeds sweep.num_experts={experts}.")
    batch_budgets = s["batch_budgets"]
    batch_budgets = (
        _positive_numbers("batch_budgets", batch_budgets, float) if batch_budgets else ()
    )
    return SweepSpec(
        budgets=budgets,
        widths=widths,
        sizes_per_budget=sizes,
        tokens_per_param=float(s["tokens_per_param"]),
        family=family,
        num_experts=experts,
        experts_per_token=top_k,
        head_dim=head_dim,
        width_per_layer=_int_at_least("width_per_layer", s["width_per_layer"], 1),
        min_layers=_int_at_least("min_layers", s["min_layers"], 1),
        mlp_ratio=float(s["mlp_ratio"]),
        target_steps=_int_at_least("target_steps", s["target_steps"], 1),
        min_batch=min_batch,
        max_batch=max_batch,
        metric=_choice("metric", s["metric"], METRICS),
        eval_set=str(s["eval_set"]),
        parallel=_int_at_least("parallel", s["parallel"], 1),
        bootstrap=_int_at_least("bootstrap", s["bootstrap"], 0),
        confidence=float(s["confidence"]),
        seed=int(s["seed"]),
        predict_factor=float(s["predict_factor"]),
        batch_sizes=_positive_numbers("batch_sizes", s["batch_sizes"], int),
        batch_budgets=batch_budgets,
        batch_width=_int_at_least("batch_width", s["batch_width"], 0),
        batch_tolerance=float(s["batch_tolerance"]),
    )
