"""Advantages from verifiable rewards: GRPO's group-relative score and RLOO's leave-one-out.

A prompt is sampled `n` times; its `n` rewards form a group. Both estimators centre each reward
on a baseline computed from the rest of its group, so no value network is needed:

- **GRPO** (Shao et al. 2024): `A_i = r_i - mean(r)`, divided by `std(r) + eps` when
  `scale_by_std` (the population std, ddof 0; Dr. GRPO's unscaled form with `False`).
- **RLOO** (Ahmadian et al. 2024): `A_i = r_i - (sum_j r_j - r_i) / (n - 1)`, the mean of the
  other `n - 1` rewards as the baseline (unbiased; needs `n >= 2`).

A group whose rewards are all equal gets zero advantage (no NaN: `eps > 0`).

>>> import jax.numpy as jnp
>>> grpo_advantages(jnp.array([[1.0, 0.0, 0.0, 1.0]]), scale_by_std=False).tolist()
[[0.5, -0.5, -0.5, 0.5]]
>>> rloo_advantages(jnp.array([[1.0, 0.0, 0.0]])).tolist()
[[1.0, -0.5, -0.5]]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["ADVANTAGE_ESTIMATORS", "advantages", "grpo_advantages", "rloo_advantages"]

ADVANTAGE_ESTIMATORS = ("grpo", "rloo")
"""Estimators `advantages` knows."""


def _groups(rewards: jax.Array, what: str) -> jax.Array:
    if rewards.ndim != 2:
        raise ValueError(
            f"{what}: rewards has shape {tuple(rewards.shape)}; expected [prompts, n] (one row "
            f"per prompt, its n samples along the last axis), e.g. rewards.reshape(-1, n)"
        )
    return rewards


def grpo_advantages(
    rewards: jax.Array, *, scale_by_std: bool = True, eps: float = 1e-4
) -> jax.Array:
    """GRPO's group-relative advantages, [prompts, n] -> [prompts, n].

    Args:
        rewards: one row per prompt, its `n` samples' rewards.
        scale_by_std: divide by the group's std (ddof 0) plus `eps`.
        eps: added to the std, > 0 so that a group of equal rewards gets 0, not NaN.
    """
    rewards = _groups(jnp.asarray(rewards), "grpo_advantages")
    if scale_by_std and not eps > 0:
        raise ValueError(f"eps={eps!r}: must be > 0 with scale_by_std=True, e.g. eps=1e-4")
    centred = rewards - rewards.mean(axis=-1, keepdims=True)
    if not scale_by_std:
        return centred
    return centred / (rewards.std(axis=-1, keepdims=True) + eps)


def rloo_advantages(rewards: jax.Array) -> jax.Array:
    """RLOO's leave-one-out advantages, [prompts, n] -> [prompts, n]; needs `n >= 2`."""
    rewards = _groups(jnp.asarray(rewards), "rloo_advantages")
    n = rewards.shape[-1]
    if n < 2:
        raise ValueError(
            f"rloo_advantages: a group of n={n} sample has no other sample for its baseline; "
            f"sample at least 2 per prompt (rollout n=2 or more) or use estimator='grpo'"
        )
    total = rewards.sum(axis=-1, keepdims=True)
    return rewards - (total - rewards) / (n - 1)


def advantages(
    estimator: str,
    rewards: jax.Array,
    *,
    group_size: int | None = None,
    scale_by_std: bool = True,
    eps: float = 1e-4,
) -> jax.Array:
    """Advantages by estimator name, in the shape of `rewards`.

    Args:
        estimator: "grpo" or "rloo".
        rewards: [prompts, n], or flat [prompts * n] with `group_size=n` (a prompt's samples
            contiguous).
        group_size: `n` when `rewards` is flat.
        scale_by_std: GRPO only, see `grpo_advantages`.
        eps: GRPO only, see `grpo_advantages`.
    """
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(
            f"estimator={estimator!r}: unknown; use one of {ADVANTAGE_ESTIMATORS}, "
            f"e.g. estimator='grpo'"
        )
    rewards = jnp.asarray(rewards)
    shape = rewards.shape
    if group_size is not None:
        if rewards.ndim != 1 or group_size < 1 or shape[0] % group_size:
            raise ValueError(
                f"group_size={group_size!r} with rewards of shape {tuple(shape)}: flat rewards "
                f"need a length that is a multiple of group_size >= 1 (prompts * n)"
            )
        rewards = rewards.reshape(-1, group_size)
    if estimator == "grpo":
        out = grpo_advantages(rewards, scale_by_std=scale_by_std, eps=eps)
    else:
        out = rloo_advantages(rewards)
    return out.reshape(shape)
