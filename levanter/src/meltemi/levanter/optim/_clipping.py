"""Gradient clipping (optax's global-norm clip, recording the norm) and update-norm clipping.

`clip_update_norm` goes after the optimizer's scaling (after the learning rate): it keeps a
rolling window of update norms and, once warmed up, scales an update whose norm exceeds
`mean + sigma * std` of that window down to exactly that threshold. The window records the
unclipped norm (only finite norms are recorded, so a NaN never poisons it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from meltemi.levanter.optim._errors import OptimizerConfigError, check_window
from meltemi.levanter.optim._history import (
    History,
    history_init,
    history_push,
    history_threshold,
)
from meltemi.levanter.optim._metrics import register_metrics


def _zero() -> jax.Array:
    return jnp.zeros((), jnp.float32)


def step_schedule(pairs: Sequence[tuple[int, float]]) -> Callable[[jax.Array], jax.Array]:
    """A piecewise-constant schedule from `(start_step, value)` pairs (the first at step 0).

    Used for thresholds tightened mid-run, e.g. max grad norm 1.0 then 0.2 from step 5000.

    Example:
        >>> f = step_schedule([(0, 1.0), (5000, 0.2)])
        >>> [round(float(f(s)), 3) for s in (0, 4999, 5000)]
        [1.0, 1.0, 0.2]
    """
    pairs = [(int(s), float(v)) for s, v in pairs]
    starts = [s for s, _ in pairs]
    if not pairs or starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:], strict=False)):
        raise OptimizerConfigError(
            f"step schedule {pairs!r} must be (start_step, value) pairs with strictly "
            f"increasing steps starting at 0, e.g. [(0, 1.0), (5000, 0.2)]"
        )
    # Host constants: no JAX array exists (and no backend starts) until the schedule is called,
    # so `resolve` can build the whole optimizer chain as a check before any device work.
    starts_np = np.asarray(starts[1:], np.int32)
    values_np = np.asarray([v for _, v in pairs], np.float32)

    def schedule(step: jax.Array) -> jax.Array:
        index = jnp.searchsorted(starts_np, jnp.asarray(step, jnp.int32), side="right")
        return jnp.asarray(values_np)[index]

    return schedule


@register_metrics
class GradClipState(NamedTuple):
    """State of `clip_by_global_norm`: step count and the last step's norm/threshold/flag."""

    count: jax.Array
    grad_norm: jax.Array
    threshold: jax.Array
    clipped: jax.Array

    def _metrics(self) -> dict[str, jax.Array]:
        return {
            "grad_clip_norm": self.grad_norm,
            "grad_clip_threshold": self.threshold,
            "grad_clipped": self.clipped.astype(jnp.float32),
        }


def clip_by_global_norm(
    max_norm: float | Callable[[jax.Array], jax.Array],
) -> optax.GradientTransformation:
    """`optax.clip_by_global_norm` that records the norm, and takes a schedule for the threshold.

    Args:
        max_norm: the threshold, or `step -> threshold` (e.g. `step_schedule`).

    Example:
        >>> import jax.numpy as jnp
        >>> tx = clip_by_global_norm(1.0)
        >>> u, s = tx.update({"w": jnp.array([3.0, 4.0])}, tx.init(None))
        >>> u["w"].tolist(), float(s.grad_norm)
        ([0.6000000238418579, 0.800000011920929], 5.0)
    """
    if not callable(max_norm) and not max_norm > 0:
        raise OptimizerConfigError(f"max_norm={max_norm!r} must be > 0, e.g. 1.0")

    def init_fn(params: Any) -> GradClipState:
        del params
        # Distinct buffers (never one zero shared by two fields), so the state can be donated.
        return GradClipState(jnp.zeros((), jnp.int32), _zero(), _zero(), jnp.zeros((), bool))

    def update_fn(updates: Any, state: GradClipState, params: Any = None):
        del params
        g_norm = optax.tree_utils.tree_norm(updates)
        if callable(max_norm):
            # optax's formula, with the traced threshold cast to each leaf's dtype (bf16-safe).
            threshold = jnp.asarray(max_norm(state.count), jnp.float32)
            keep = jnp.squeeze(g_norm < threshold)
            updates = jax.tree.map(
                lambda t: jax.lax.select(
                    keep, t, (t / g_norm.astype(t.dtype)) * threshold.astype(t.dtype)
                ),
                updates,
            )
        else:
            threshold = max_norm
            updates, _ = optax.clip_by_global_norm(max_norm).update(updates, optax.EmptyState())
        new_state = GradClipState(
            optax.safe_increment(state.count),
            jnp.asarray(g_norm, jnp.float32),
            jnp.asarray(threshold, jnp.float32),
            ~(g_norm < threshold),
        )
        return updates, new_state

    return optax.GradientTransformation(init_fn, update_fn)


@register_metrics
class UpdateClipState(NamedTuple):
    """State of `clip_update_norm`: the rolling norm history and the last step's stats.

    Attributes:
        history: unclipped finite update norms of the last `window` steps.
        update_norm: the last step's unclipped update norm.
        threshold: the threshold it was compared against (+inf during warmup).
        clipped: whether the last update was scaled down.
    """

    history: History
    update_norm: jax.Array
    threshold: jax.Array
    clipped: jax.Array

    def _metrics(self) -> dict[str, jax.Array]:
        return {
            "update_clip_norm": self.update_norm,
            "update_clip_threshold": self.threshold,
            "update_clipped": self.clipped.astype(jnp.float32),
        }


def clip_update_norm(
    window: int = 128, sigma: float = 2.0, warmup: int | None = None
) -> optax.GradientTransformation:
    """Scales an update down to `mean + sigma * std` of the last `window` update norms.

    Args:
        window: how many past (unclipped) update norms the threshold is computed over.
        sigma: how many standard deviations above the mean are allowed.
        warmup: recorded norms needed before clipping starts (default: `window`).

    Example:
        >>> import jax.numpy as jnp
        >>> tx = clip_update_norm(window=4, sigma=0.0, warmup=2)
        >>> state = tx.init(None)
        >>> for n in (1.0, 3.0):  # warmup: recorded, never clipped
        ...     _, state = tx.update({"w": jnp.array([n])}, state)
        >>> u, state = tx.update({"w": jnp.array([10.0])}, state)  # mean 2, std 1: clip to 2
        >>> float(u["w"][0]), float(state.update_norm), bool(state.clipped)
        (2.0, 10.0, True)
    """
    warmup = check_window("clip_update_norm", window, sigma, warmup)

    def init_fn(params: Any) -> UpdateClipState:
        del params
        return UpdateClipState(history_init(window), _zero(), _zero(), jnp.zeros((), bool))

    def update_fn(updates: Any, state: UpdateClipState, params: Any = None):
        del params
        norm = jnp.asarray(optax.tree_utils.tree_norm(updates), jnp.float32)
        threshold = history_threshold(state.history, sigma, warmup)
        finite = jnp.isfinite(norm)
        clipped = finite & (norm > threshold)
        scale = jnp.where(clipped, threshold / jnp.where(clipped, norm, 1.0), 1.0)
        updates = jax.tree.map(lambda u: (u * scale.astype(u.dtype)).astype(u.dtype), updates)
        history = history_push(state.history, norm, record=finite)
        return updates, UpdateClipState(history, norm, threshold, clipped)

    return optax.GradientTransformation(init_fn, update_fn)
