"""A config-friendly factory: `build_optimizer(config) -> (GradientTransformation, schedule)`.

The chain it builds, each part optional except the core:

    skip_step(                                  # skip_step_window
        chain(clip_by_global_norm,              # max_grad_norm (a float or (step, value) pairs)
              adamw | muon,                     # name; AdamC via adamc
              multiply_by_path,                 # lr_multipliers
              clip_update_norm,                 # update_clip_window
              ema_params))                      # ema_beta

Settings that would have no effect under the others (a Muon key with name="adamw", a skip-step
key without skip_step_window, rewarmup without cycles, ...) are errors, raised when the config
is built: `OptimizerConfig(...)` checks every field and every combination.

The returned transform always accepts `loss=` in `update` (required when skip_step is on), so a
trainer can call `tx.update(grads, opt_state, params, loss=loss)` whatever the config.

The Marin 32B stability settings, as an example:

>>> cfg = OptimizerConfig(
...     learning_rate=3e-4, total_steps=10_000, lr_schedule="linear",
...     warmup=0.01, decay=0.4, cycles=(5_000,), rewarmup=1_000,
...     weight_decay=0.1, adamc="decay",
...     max_grad_norm=((0, 1.0), (5_000, 0.2)),
...     update_clip_window=128, update_clip_sigma=2.0,
...     skip_step_window=128, skip_step_sigma=2.0, ema_beta=0.995)
>>> tx, schedule = build_optimizer(cfg)
>>> [round(float(schedule(s)), 7) for s in (0, 50, 5_000, 6_000)]
[0.0, 0.0003, 0.0, 0.0003]
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from typing import Any

import optax

from meltemi.levanter.optim._adamw import (
    ADAMC_MODES,
    DEFAULT_NO_ADAMC_PATTERNS,
    DEFAULT_NO_DECAY_PATTERNS,
    adamw,
)
from meltemi.levanter.optim._clipping import clip_by_global_norm, clip_update_norm, step_schedule
from meltemi.levanter.optim._ema import ema_params
from meltemi.levanter.optim._errors import OptimizerConfigError
from meltemi.levanter.optim._multiply import check_multipliers, multiply_by_path
from meltemi.levanter.optim._muon import DEFAULT_NS_COEFFS, MUON_SCALES, muon
from meltemi.levanter.optim._schedules import DECAY_SHAPES, Schedule
from meltemi.levanter.optim._skip import SKIP_SCHEDULES, skip_step

OPTIMIZERS: tuple[str, ...] = ("adamw", "muon")
MU_DTYPES: tuple[str, ...] = ("float32", "bfloat16")
_PATTERN_FIELDS = ("no_decay_patterns", "adamc_exclude_patterns")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """Everything `build_optimizer` needs; every field has a working default.

    Attributes:
        name: "adamw" or "muon" (Muon on matrices, AdamW on the rest).
        learning_rate: the peak learning rate (Muon's, for name="muon").
        total_steps: steps the schedule covers (`build_optimizer(total_steps=)` overrides).
        lr_schedule: the decay shape: constant, linear, cosine, 1-sqrt, inverse_sqrt.
        warmup: first warmup: steps (int) or fraction of the cycle (float).
        decay: decay length per cycle (steps or fraction); None = all after warmup.
        min_lr_ratio: the decay ends at `learning_rate * min_lr_ratio`.
        cycles: None, n equal cycles, or the steps where later cycles start.
        rewarmup: warmup of later cycles (steps or fraction), from the previous minimum.
        b1, b2, eps: Adam's moments and epsilon.
        weight_decay: decoupled weight decay.
        no_decay_patterns: path regexes that get no decay (default: norms, biases, embeddings).
        adamc: "off", "always" or "decay" (AdamC only during decay phases).
        adamc_exclude_patterns: path regexes of decayed parameters AdamC leaves on plain
            decay (default: the output head, as in Defazio 2025, arXiv:2506.02285).
        mu_dtype: dtype of the first moment (Adam's and Muon's momentum): None (the
            parameter's), "float32" or "bfloat16".
        lr_multipliers: `(path regex, factor)` pairs: the update of a parameter whose path
            matches is multiplied by the factor of the first matching pattern.
        max_grad_norm: None, a float, or `(start_step, value)` pairs (e.g. 1.0 then 0.2).
        update_clip_window, update_clip_sigma, update_clip_warmup: `clip_update_norm` (None:
            off).
        skip_step_window, skip_step_sigma, skip_step_warmup: `skip_step` (None: off).
        skip_step_schedule: "step" (a skipped step spends its schedule slot: lr, AdamC and
            clipping schedules follow the trainer's step) or "applied" (they count applied
            updates only, so skips delay them).
        ema_beta: None (off) or the EMA decay of the params, e.g. 0.995.
        adam_learning_rate: Muon's AdamW fallback peak lr (required with name="muon").
        muon_beta, muon_ns_steps, muon_scale: see `muon`.
    """

    name: str = "adamw"
    learning_rate: float = 3e-4
    total_steps: int = 10_000
    lr_schedule: str = "cosine"
    warmup: int | float = 0.01
    decay: int | float | None = None
    min_lr_ratio: float = 0.0
    cycles: int | tuple[int, ...] | None = None
    rewarmup: int | float = 0
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0
    no_decay_patterns: tuple[str, ...] = DEFAULT_NO_DECAY_PATTERNS
    adamc: str = "off"
    adamc_exclude_patterns: tuple[str, ...] = DEFAULT_NO_ADAMC_PATTERNS
    mu_dtype: str | None = None
    lr_multipliers: tuple[tuple[str, float], ...] = ()
    max_grad_norm: float | tuple[tuple[int, float], ...] | None = 1.0
    update_clip_window: int | None = None
    update_clip_sigma: float = 2.0
    update_clip_warmup: int | None = None
    skip_step_window: int | None = None
    skip_step_sigma: float = 2.0
    skip_step_warmup: int | None = None
    skip_step_schedule: str = "step"
    ema_beta: float | None = None
    adam_learning_rate: float | None = None
    muon_beta: float = 0.95
    muon_ns_steps: int = 5
    muon_scale: str = "spectral"

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise OptimizerConfigError(_unknown("name", self.name, OPTIMIZERS))
        if self.lr_schedule not in DECAY_SHAPES:
            raise OptimizerConfigError(_unknown("lr_schedule", self.lr_schedule, DECAY_SHAPES))
        if self.adamc not in ADAMC_MODES:
            raise OptimizerConfigError(_unknown("adamc", self.adamc, ADAMC_MODES))
        if self.skip_step_schedule not in SKIP_SCHEDULES:
            raise OptimizerConfigError(
                _unknown("skip_step_schedule", self.skip_step_schedule, SKIP_SCHEDULES)
            )
        if self.muon_scale not in MUON_SCALES:
            raise OptimizerConfigError(_unknown("muon_scale", self.muon_scale, MUON_SCALES))
        if self.mu_dtype is not None and self.mu_dtype not in MU_DTYPES:
            raise OptimizerConfigError(_unknown("mu_dtype", self.mu_dtype, MU_DTYPES))
        if not self.learning_rate > 0:
            raise OptimizerConfigError(
                f"learning_rate={self.learning_rate!r} must be > 0, e.g. 3e-4"
            )
        for field in ("cycles", *_PATTERN_FIELDS, "max_grad_norm", "lr_multipliers"):
            value = getattr(self, field)
            if isinstance(value, list):
                object.__setattr__(self, field, _tuplify(value))
        for field in _PATTERN_FIELDS:
            value = getattr(self, field)
            if isinstance(value, str):
                raise OptimizerConfigError(
                    f"{field}={value!r} is a plain string, which would be read as one pattern "
                    f"per character; pass a tuple of path regexes: {field}=({value!r},)"
                )
            if not all(isinstance(v, str) for v in value):
                raise OptimizerConfigError(
                    f"{field}={value!r} must be a tuple of path regexes, e.g. ('norm', 'bias')"
                )
        object.__setattr__(self, "lr_multipliers", check_multipliers(self.lr_multipliers))
        for problem in _inert_settings(self):
            raise OptimizerConfigError(problem)


def _inert_settings(c: OptimizerConfig) -> list[str]:
    """Every setting that the others make inert (or that is missing), as an error message."""
    defaults = {f.name: f.default for f in dataclasses.fields(OptimizerConfig)}

    def changed(field: str) -> bool:
        return getattr(c, field) != defaults[field]

    out = []
    if c.name == "adamw":
        for field in ("adam_learning_rate", "muon_beta", "muon_ns_steps", "muon_scale"):
            if changed(field):
                out.append(
                    f"{field}={getattr(c, field)!r} has no effect with name='adamw' (it sets "
                    f"Muon); remove it, or set name='muon'"
                )
    elif c.adam_learning_rate is None:
        out.append(
            "adam_learning_rate=None with name='muon': the AdamW fallback (embeddings, norms, "
            "output head) needs its own peak learning rate, e.g. adam_learning_rate=3e-4 "
            f"(learning_rate={c.learning_rate!r} is Muon's)"
        )
    for prefix, window in (
        ("skip_step", "skip_step_window"),
        ("update_clip", "update_clip_window"),
    ):
        if getattr(c, window) is not None:
            continue
        for field in defaults:
            if field.startswith(prefix + "_") and field != window and changed(field):
                out.append(
                    f"{field}={getattr(c, field)!r} has no effect while {window}=None "
                    f"({prefix.replace('_', ' ')} is off); set {window}=128 to turn it on, "
                    f"or remove {field}"
                )
    if changed("rewarmup") and c.cycles is None:
        out.append(
            f"rewarmup={c.rewarmup!r} has no effect while cycles=None (one cycle, nothing to "
            f"re-warm); set cycles (e.g. cycles=2), or remove rewarmup"
        )
    if c.adamc != "off" and c.weight_decay == 0:
        out.append(
            f"adamc={c.adamc!r} has no effect while weight_decay=0 (AdamC rescales the decay); "
            f"set weight_decay (e.g. 0.1), or adamc='off'"
        )
    if c.adamc == "decay" and c.lr_schedule == "constant":
        out.append(
            "adamc='decay' has no effect with lr_schedule='constant' (no decay phase); use "
            "adamc='always', or a decaying lr_schedule (e.g. 'linear')"
        )
    if c.adamc == "off" and changed("adamc_exclude_patterns"):
        out.append(
            f"adamc_exclude_patterns={c.adamc_exclude_patterns!r} has no effect while "
            f"adamc='off'; set adamc='decay' (or 'always'), or remove it"
        )
    if c.weight_decay == 0 and changed("no_decay_patterns"):
        out.append(
            f"no_decay_patterns={c.no_decay_patterns!r} has no effect while weight_decay=0; "
            f"set weight_decay (e.g. 0.1), or remove no_decay_patterns"
        )
    return out


def _tuplify(x: Any) -> Any:
    return tuple(_tuplify(v) for v in x) if isinstance(x, (list, tuple)) else x


def _unknown(field: str, value: Any, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(value), choices, n=1)
    hint = f"; did you mean {field}={close[0]!r}?" if close else ""
    return f"{field}={value!r} is not one of {tuple(choices)}{hint}"


def _as_config(config: Any) -> OptimizerConfig:
    if isinstance(config, OptimizerConfig):
        return config
    if hasattr(config, "to_dict"):  # ml_collections.ConfigDict
        config = config.to_dict()
    if not isinstance(config, Mapping):
        raise OptimizerConfigError(
            f"optimizer config must be an OptimizerConfig, a dict or a ConfigDict, "
            f"got {type(config).__name__}"
        )
    fields = [f.name for f in dataclasses.fields(OptimizerConfig)]
    for key in config:
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise OptimizerConfigError(f"unknown optimizer config key {key!r}{hint}")
    return OptimizerConfig(**{k: _tuplify(v) for k, v in config.items()})


def build_schedule(
    config: OptimizerConfig | Mapping[str, Any], peak: float | None = None
) -> Schedule:
    """The learning-rate `Schedule` a config describes (at `peak`, default its learning_rate).

    Example:
        >>> s = build_schedule({"learning_rate": 1.0, "total_steps": 10, "warmup": 0})
        >>> round(float(s(5)), 6)
        0.5
    """
    c = _as_config(config)
    return Schedule(
        peak=c.learning_rate if peak is None else peak, total_steps=c.total_steps,
        warmup=c.warmup, decay=c.decay, shape=c.lr_schedule, min_ratio=c.min_lr_ratio,
        cycles=c.cycles, rewarmup=c.rewarmup,
    )  # fmt: skip


def build_optimizer(
    config: OptimizerConfig | Mapping[str, Any] | Any, *, total_steps: int | None = None
) -> tuple[optax.GradientTransformationExtraArgs, Schedule]:
    """Builds the optimizer chain and its learning-rate schedule from a config.

    Args:
        config: an `OptimizerConfig`, a dict of its fields, or an `ml_collections.ConfigDict`.
        total_steps: overrides `config.total_steps` (the trainer's number of steps).

    Returns:
        `(tx, schedule)`: call `tx.update(grads, opt_state, params, loss=loss)`; `schedule(step)`
        is the (Muon or AdamW) learning rate, for logging.

    Raises:
        OptimizerConfigError: a key or value is invalid; the message names it and the fix.

    Example:
        >>> tx, schedule = build_optimizer({"learning_rate": 1e-3, "total_steps": 100})
        >>> round(float(schedule(1)), 6)
        0.001
    """
    c = _as_config(config)
    if total_steps is not None:
        c = dataclasses.replace(c, total_steps=int(total_steps))
    schedule = build_schedule(c)
    parts: list[optax.GradientTransformation] = []
    if c.max_grad_norm is not None:
        threshold = c.max_grad_norm
        if isinstance(threshold, tuple):
            threshold = step_schedule(threshold)
        parts.append(clip_by_global_norm(threshold))
    if c.name == "adamw":
        parts.append(
            adamw(
                schedule, b1=c.b1, b2=c.b2, eps=c.eps, weight_decay=c.weight_decay,
                mask=c.no_decay_patterns, adamc=c.adamc, adamc_mask=c.adamc_exclude_patterns,
                mu_dtype=c.mu_dtype,
            )
        )  # fmt: skip
    else:
        parts.append(
            muon(
                schedule, beta=c.muon_beta, ns_steps=c.muon_ns_steps, ns_coeffs=DEFAULT_NS_COEFFS,
                scale=c.muon_scale, weight_decay=c.weight_decay, mask=c.no_decay_patterns,
                adamc=c.adamc, adamc_mask=c.adamc_exclude_patterns, mu_dtype=c.mu_dtype,
                adam_learning_rate=build_schedule(c, peak=c.adam_learning_rate),
                adam_b1=c.b1, adam_b2=c.b2, adam_eps=c.eps,
            )
        )  # fmt: skip
    if c.lr_multipliers:
        parts.append(multiply_by_path(c.lr_multipliers))
    if c.update_clip_window is not None:
        parts.append(
            clip_update_norm(c.update_clip_window, c.update_clip_sigma, c.update_clip_warmup)
        )
    if c.ema_beta is not None:
        parts.append(ema_params(c.ema_beta))
    tx = optax.chain(*parts)
    if c.skip_step_window is not None:
        tx = skip_step(
            tx, c.skip_step_window, c.skip_step_sigma, c.skip_step_warmup,
            schedule=c.skip_step_schedule,
        )  # fmt: skip
    return tx, schedule
