"""Skipping bad steps (modelled on OLMo's): a wrapper around a whole optimizer chain.

A step is skipped when its loss or its gradient norm is not finite, or (once `warmup` values
are recorded) is above `mean + sigma * std` of the last `window` values. A skipped step returns
a zero update and the inner state exactly as it was (a select, so no NaN can leak into it).

The loss is a keyword argument of `update` (`optax.GradientTransformationExtraArgs`)::

    tx = skip_step(optax.chain(...), window=128, sigma=2.0)
    updates, opt_state = tx.update(grads, opt_state, params, loss=loss)

Both histories record every finite value, skipped or not (as OLMo does), so a lasting shift in
the loss level is soon accepted instead of being skipped forever.

Schedules follow the trainer's step by default (`schedule="step"`): a skipped step spends its
slot, so the learning rate, AdamC's decay and a scheduled clipping threshold at step `t` are
`schedule(t)` however many steps were skipped before. Only the step counters that index a
schedule advance (those of `scale_by_learning_rate`, `add_decayed_weights` and
`clip_by_global_norm`); moments and Adam's bias-correction count stay as they were, since no
update was made. `schedule="applied"` freezes those counters too: the schedule then counts
applied updates, and each skip delays the rest of it by one step.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from meltemi.levanter.optim._adamw import LearningRateState, WeightDecayState
from meltemi.levanter.optim._clipping import GradClipState
from meltemi.levanter.optim._errors import OptimizerConfigError, check_window
from meltemi.levanter.optim._history import (
    History,
    history_init,
    history_push,
    history_threshold,
)
from meltemi.levanter.optim._metrics import register_metrics

#: States whose `count` indexes a schedule; under `schedule="step"` it advances on a skip.
SCHEDULE_STATES: tuple[type, ...] = (LearningRateState, WeightDecayState, GradClipState)
SKIP_SCHEDULES: tuple[str, ...] = ("step", "applied")


@register_metrics
class SkipStepState(NamedTuple):
    """State of `skip_step`.

    Attributes:
        inner_state: the wrapped chain's state (unchanged by a skipped step).
        loss_history: finite losses of the last `window` steps.
        grad_norm_history: finite gradient norms of the last `window` steps.
        skipped: whether the last step was skipped.
        reason: bit set of `SKIP_REASONS` (0 when applied); decode with `skip_reasons`.
        loss: the last step's loss.
        grad_norm: the last step's gradient norm (of the updates `skip_step` received).
        loss_threshold: the loss threshold it was compared against (+inf during warmup).
        grad_norm_threshold: the gradient-norm threshold (+inf during warmup).
        num_skipped: steps skipped so far.
    """

    inner_state: Any
    loss_history: History
    grad_norm_history: History
    skipped: jax.Array
    reason: jax.Array
    loss: jax.Array
    grad_norm: jax.Array
    loss_threshold: jax.Array
    grad_norm_threshold: jax.Array
    num_skipped: jax.Array

    def _metrics(self) -> dict[str, jax.Array]:
        return {
            "skip/skipped": self.skipped.astype(jnp.float32),
            "skip/reason": self.reason,
            "skip/loss": self.loss,
            "skip/grad_norm": self.grad_norm,
            "skip/loss_threshold": self.loss_threshold,
            "skip/grad_norm_threshold": self.grad_norm_threshold,
            "skip/num_skipped": self.num_skipped,
        }


def skip_step(
    inner: optax.GradientTransformation,
    window: int = 128,
    sigma: float = 2.0,
    warmup: int | None = None,
    *,
    use_loss: bool = True,
    schedule: str = "step",
) -> optax.GradientTransformationExtraArgs:
    """Wraps `inner` so that outlier or non-finite steps apply a zero update.

    Args:
        inner: the whole optimizer chain to protect.
        window: how many past losses / gradient norms the thresholds use.
        sigma: how many standard deviations above the mean are allowed.
        warmup: values recorded before spikes are checked (default `window`); non-finite
            values are always skipped.
        use_loss: when False, `update` needs no `loss` and only the gradient norm is checked.
        schedule: "step" (a skipped step spends its schedule slot: the schedule follows the
            trainer's step) or "applied" (the schedule counts applied updates only).

    Example:
        >>> import jax.numpy as jnp, optax
        >>> from meltemi.levanter.optim import skip_reasons
        >>> tx = skip_step(optax.sgd(0.1), window=4, sigma=2.0)
        >>> params = {"w": jnp.ones(3)}
        >>> state = tx.init(params)
        >>> bad = {"w": jnp.array([1.0, jnp.nan, 0.0])}
        >>> updates, state = tx.update(bad, state, params, loss=jnp.float32(2.5))
        >>> updates["w"].tolist(), bool(state.skipped), skip_reasons(int(state.reason))
        ([0.0, 0.0, 0.0], True, ['grad_norm_not_finite'])
    """
    warmup = check_window("skip_step", window, sigma, warmup)
    if schedule not in SKIP_SCHEDULES:
        raise OptimizerConfigError(
            f"skip_step: schedule={schedule!r} is not one of {SKIP_SCHEDULES}; use 'step' "
            f"(the schedule follows the trainer's step) or 'applied'"
        )
    inner = optax.with_extra_args_support(inner)

    def init_fn(params: Any) -> SkipStepState:
        # Distinct buffers (never one zero shared by two fields), so the state can be donated.
        def z():
            return jnp.zeros((), jnp.float32)

        return SkipStepState(
            inner_state=inner.init(params),
            loss_history=history_init(window),
            grad_norm_history=history_init(window),
            skipped=jnp.zeros((), bool),
            reason=jnp.zeros((), jnp.int32),
            loss=z(),
            grad_norm=z(),
            loss_threshold=z(),
            grad_norm_threshold=z(),
            num_skipped=jnp.zeros((), jnp.int32),
        )

    def update_fn(updates: Any, state: SkipStepState, params: Any = None, **extra_args: Any):
        loss = extra_args.get("loss")
        if use_loss and loss is None:
            raise ValueError(
                "skip_step needs the step's loss: call "
                "tx.update(grads, opt_state, params, loss=loss), or build it with "
                "skip_step(..., use_loss=False) to check only the gradient norm"
            )
        loss = jnp.zeros((), jnp.float32) if loss is None else jnp.asarray(loss, jnp.float32)
        loss = jnp.reshape(loss, ())
        g_norm = jnp.asarray(optax.tree_utils.tree_norm(updates), jnp.float32)

        loss_thr = history_threshold(state.loss_history, sigma, warmup)
        g_thr = history_threshold(state.grad_norm_history, sigma, warmup)
        loss_ok, g_ok = jnp.isfinite(loss), jnp.isfinite(g_norm)
        bits = [
            (~loss_ok, 1),
            (~g_ok, 2),
            (loss_ok & (loss > loss_thr), 4),
            (g_ok & (g_norm > g_thr), 8),
        ]
        if not use_loss:
            bits = [b for b in bits if b[1] in (2, 8)]
        reason = sum(jnp.where(cond, bit, 0) for cond, bit in bits).astype(jnp.int32)
        skip = reason != 0

        new_updates, new_inner = inner.update(updates, state.inner_state, params, **extra_args)
        out_updates = jax.tree.map(lambda u: jnp.where(skip, jnp.zeros_like(u), u), new_updates)
        inner_state = jax.tree.map(
            lambda new, old: _keep_or_advance(skip, new, old, schedule),
            new_inner,
            state.inner_state,
            is_leaf=lambda x: type(x) in SCHEDULE_STATES,
        )
        new_state = SkipStepState(
            inner_state=inner_state,
            loss_history=history_push(state.loss_history, loss, record=loss_ok & use_loss),
            grad_norm_history=history_push(state.grad_norm_history, g_norm, record=g_ok),
            skipped=skip,
            reason=reason,
            loss=loss,
            grad_norm=g_norm,
            loss_threshold=loss_thr,
            grad_norm_threshold=g_thr,
            num_skipped=(state.num_skipped + skip.astype(jnp.int32)).astype(jnp.int32),
        )
        return out_updates, new_state

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _keep_or_advance(skip: jax.Array, new: Any, old: Any, schedule: str) -> Any:
    """The old state on a skipped step (the new one otherwise), but for a schedule counter
    under `schedule="step"`, which takes the new count either way."""
    kept = jax.tree.map(lambda n, o: jnp.where(skip, o, n), new, old)
    if schedule == "step" and type(new) in SCHEDULE_STATES:
        kept = kept._replace(count=new.count)
    return kept
