"""meltemi.levanter.optim: optimizers as optax `GradientTransformation`s, and schedules.

Every piece composes with `optax.chain`: AdamW (decoupled decay, path-pattern mask, AdamC),
Muon (named-axis aware), global-norm and update-norm clipping, skipping bad steps, an EMA of
the parameters, and warmup-stable-decay schedules with cycles. `metrics(opt_state)` returns
what the trainer logs; `build_optimizer(config)` builds the whole chain from a config.

>>> import jax.numpy as jnp, optax
>>> from meltemi.levanter import optim
>>> schedule = optim.wsd_schedule(3e-4, total_steps=1_000, warmup=0.01, decay=0.4)
>>> tx = optim.skip_step(optax.chain(optim.clip_by_global_norm(1.0),
...                                  optim.adamw(schedule, weight_decay=0.1)), window=16)
>>> params = {"w": jnp.ones((3, 5))}
>>> state = tx.init(params)
>>> updates, state = tx.update(params, state, params, loss=jnp.float32(2.3))
>>> sorted(optim.metrics(state))[:3]
['grad_clip_norm', 'grad_clip_threshold', 'grad_clipped']
"""

from meltemi.levanter.optim._adamw import (
    ADAMC_MODES,
    DEFAULT_NO_ADAMC_PATTERNS,
    DEFAULT_NO_DECAY_PATTERNS,
    LearningRateState,
    WeightDecayState,
    adamw,
    add_decayed_weights,
    decay_mask,
    scale_by_learning_rate,
)
from meltemi.levanter.optim._clipping import (
    GradClipState,
    UpdateClipState,
    clip_by_global_norm,
    clip_update_norm,
    step_schedule,
)
from meltemi.levanter.optim._config import (
    OptimizerConfig,
    build_optimizer,
    build_schedule,
)
from meltemi.levanter.optim._ema import EmaState, ema_of, ema_params
from meltemi.levanter.optim._errors import OptimizerConfigError
from meltemi.levanter.optim._metrics import SKIP_REASONS, metrics, skip_reasons
from meltemi.levanter.optim._muon import (
    DEFAULT_ADAM_PATTERNS,
    DEFAULT_BATCH_AXES,
    DEFAULT_NS_COEFFS,
    MUON_SCALES,
    MuonDimensionNumbers,
    muon,
    muon_dimension_numbers,
    muon_labels,
    scale_by_muon,
)
from meltemi.levanter.optim._named import is_named_array
from meltemi.levanter.optim._preference import (
    OBJECTIVES,
    PairLogps,
    dpo_loss,
    ipo_loss,
    preference_loss,
    preference_metrics,
    sequence_logps,
    simpo_loss,
)
from meltemi.levanter.optim._schedules import (
    DECAY_SHAPES,
    BatchSchedule,
    Schedule,
    ScheduleError,
    batch_size_schedule,
    constant_schedule,
    cosine_schedule,
    inverse_sqrt_schedule,
    linear_schedule,
    wsd_schedule,
)
from meltemi.levanter.optim._skip import SkipStepState, skip_step

__all__ = [
    "ADAMC_MODES",
    "DECAY_SHAPES",
    "DEFAULT_ADAM_PATTERNS",
    "DEFAULT_BATCH_AXES",
    "DEFAULT_NO_ADAMC_PATTERNS",
    "DEFAULT_NO_DECAY_PATTERNS",
    "DEFAULT_NS_COEFFS",
    "MUON_SCALES",
    "OBJECTIVES",
    "SKIP_REASONS",
    "BatchSchedule",
    "EmaState",
    "GradClipState",
    "LearningRateState",
    "MuonDimensionNumbers",
    "OptimizerConfig",
    "OptimizerConfigError",
    "PairLogps",
    "Schedule",
    "ScheduleError",
    "SkipStepState",
    "UpdateClipState",
    "WeightDecayState",
    "adamw",
    "add_decayed_weights",
    "batch_size_schedule",
    "build_optimizer",
    "build_schedule",
    "clip_by_global_norm",
    "clip_update_norm",
    "constant_schedule",
    "cosine_schedule",
    "decay_mask",
    "dpo_loss",
    "ema_of",
    "ema_params",
    "inverse_sqrt_schedule",
    "ipo_loss",
    "is_named_array",
    "linear_schedule",
    "metrics",
    "muon",
    "muon_dimension_numbers",
    "muon_labels",
    "preference_loss",
    "preference_metrics",
    "scale_by_learning_rate",
    "scale_by_muon",
    "sequence_logps",
    "simpo_loss",
    "skip_reasons",
    "skip_step",
    "step_schedule",
    "wsd_schedule",
]
