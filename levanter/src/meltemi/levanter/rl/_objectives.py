"""Policy-gradient and on-policy distillation losses on per-token log-probabilities.

Pure JAX on arrays, no model inside: the trainer gathers the log-prob of each sampled token
(`logps`, [B, T]) under the policy being trained, and passes those of the sampling policy
(`old_logps`), optionally of a frozen reference (`ref_logps`) or a teacher. `mask` [B, T] is
nonzero on the response tokens that are trained. With `m` the mask:

- **Clipped policy loss** (PPO, Schulman et al. 2017; GRPO with `ref_logps`):
  `rho = exp(logps - old_logps)`,
  `pg_t = -min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A)`,
  times a truncated importance weight `w_t` when given (stale rollouts),
  plus `beta * k3_t` with `k3_t = exp(d) - d - 1`, `d = ref_logps - logps` (Schulman's k3
  estimator of KL(policy || reference), unbiased and >= 0).
- **Aggregation**: "token" is one mean over every trained token of the batch,
  `sum(m l) / sum(m)`; "sequence" is a mean over sequences of each sequence's token mean,
  `mean_b(sum_t(m l) / sum_t(m))` (GRPO's original form; empty sequences are left out).
- **On-policy distillation** (Agarwal et al. 2024, GKD; Thinking Machines 2025): the student's
  own samples are scored by the teacher; the per-token reverse KL(student || teacher) is
  estimated from the sampled tokens, `k1_t = s_t - t_t`, with the surrogate
  `sg(k1_t) (s_t - sg(s_t)) + sg(k1_t)`: its value is `k1_t` and its gradient
  `k1_t grad s_t`, the score-function gradient of the per-token reverse KL. With full logits,
  `full_vocab_reverse_kl` computes the exact `sum_v p_s (log p_s - log p_t)` instead.

>>> import jax.numpy as jnp
>>> lp = jnp.log(jnp.array([[0.5, 0.25]]))
>>> loss, m = policy_loss(lp, lp, jnp.array([1.0]), jnp.ones((1, 2)))
>>> float(loss), float(m["clip_fraction"])
(-1.0, 0.0)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = [
    "AGGREGATIONS",
    "aggregate",
    "distill_loss",
    "full_vocab_reverse_kl",
    "policy_loss",
    "truncated_is_weights",
]

AGGREGATIONS = ("token", "sequence")
"""How per-token losses become one number: see the module docstring."""

_sg = jax.lax.stop_gradient


def _check_aggregation(aggregation: str) -> None:
    if aggregation not in AGGREGATIONS:
        raise ValueError(
            f"aggregation={aggregation!r}: unknown; use one of {AGGREGATIONS}, "
            f"e.g. aggregation='token'"
        )


def _check_shapes(mask: jax.Array, **arrays: jax.Array | None) -> None:
    for name, array in arrays.items():
        if array is not None and tuple(array.shape) != tuple(mask.shape):
            raise ValueError(
                f"{name} has shape {tuple(array.shape)}, mask has {tuple(mask.shape)}: "
                f"per-token arrays are [sequences, positions] like the mask"
            )


def aggregate(per_token: jax.Array, mask: jax.Array, aggregation: str = "token") -> jax.Array:
    """A scalar from per-token values, [B, T], over the tokens where `mask` is nonzero.

    "token": `sum(m x) / max(sum(m), 1)`. "sequence": the mean, over sequences with at least one
    token, of `sum_t(m x) / sum_t(m)`. Values under a zero mask are ignored (even NaN).
    """
    _check_aggregation(aggregation)
    m = (mask != 0).astype(per_token.dtype)
    x = jnp.where(m > 0, per_token, 0.0)
    if aggregation == "token":
        return (x * m).sum() / jnp.maximum(m.sum(), 1.0)
    tokens = m.sum(axis=-1)
    per_seq = (x * m).sum(axis=-1) / jnp.maximum(tokens, 1.0)
    has = (tokens > 0).astype(per_token.dtype)
    return (per_seq * has).sum() / jnp.maximum(has.sum(), 1.0)


def truncated_is_weights(
    proximal_logps: jax.Array,
    behaviour_logps: jax.Array,
    mask: jax.Array,
    *,
    cap: float = 2.0,
    level: str = "token",
) -> jax.Array:
    """Truncated importance weights for rollouts sampled by an older policy, [B, T].

    Decoupled PPO: the ratio is taken against the proximal policy (the weights at the start of
    this step: `policy_loss(..., old_logps=proximal_logps, is_weights=w)`), and `w` corrects for
    the rollout having been sampled by the behaviour policy. No gradient flows through `w`.

    Args:
        proximal_logps: sampled tokens' log-probs under the proximal policy, [B, T].
        behaviour_logps: the same under the policy that sampled them (the rollout's).
        mask: nonzero on trained tokens; `w` is 0 elsewhere.
        cap: the truncation, `w <= cap` (> 0; e.g. 2.0).
        level: "token": `min(exp(prox_t - behav_t), cap)`; "sequence": one weight per
            sequence, `min(exp(sum_t m (prox_t - behav_t)), cap)`, on each of its tokens.
    """
    if not cap > 0:
        raise ValueError(f"cap={cap!r}: the weight truncation must be > 0, e.g. cap=2.0")
    if level not in ("token", "sequence"):
        raise ValueError(f"level={level!r}: use 'token' or 'sequence'")
    _check_shapes(mask, proximal_logps=proximal_logps, behaviour_logps=behaviour_logps)
    m = mask != 0
    diff = jnp.where(m, _sg(proximal_logps) - _sg(behaviour_logps), 0.0)
    if level == "sequence":
        diff = jnp.broadcast_to(diff.sum(axis=-1, keepdims=True), diff.shape)
    # min before exp: exp of a large log-ratio would overflow to inf.
    w = jnp.exp(jnp.minimum(diff, jnp.log(cap)))
    return jnp.where(m, w, 0.0)


def policy_loss(
    logps: jax.Array,
    old_logps: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logps: jax.Array | None = None,
    beta: float = 0.0,
    aggregation: str = "token",
    is_weights: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The clipped policy-gradient loss (GRPO, RLOO, PPO without a value head) and its metrics.

    Args:
        logps: sampled tokens' log-probs under the policy being trained, [B, T].
        old_logps: the same under the policy the ratio is taken against (no gradient).
        advantages: [B] (one per sequence) or [B, T].
        mask: nonzero on trained response tokens, [B, T].
        clip_low: the ratio's lower clip is `1 - clip_low`.
        clip_high: the upper clip is `1 + clip_high` (DAPO's clip-higher when > clip_low).
        ref_logps: the reference policy's log-probs, for the KL term and the "kl" metric.
        beta: the weight of the k3 KL penalty (>= 0; > 0 needs `ref_logps`).
        aggregation: "token" or "sequence" (module docstring).
        is_weights: truncated importance weights, [B, T] (`truncated_is_weights`).

    Returns:
        The loss and metrics: "loss", "pg_loss", "clip_fraction" (share of trained tokens
        whose ratio was clipped: zero gradient), "clip_fraction_low", "clip_fraction_high",
        "ratio_mean", "tokens", "kl" (token mean of k3, with `ref_logps`) and "is_weight_mean"
        (with `is_weights`).
    """
    _check_aggregation(aggregation)
    if not (clip_low >= 0 and clip_high >= 0):
        raise ValueError(
            f"clip_low={clip_low!r}, clip_high={clip_high!r}: must be >= 0, e.g. 0.2 and 0.28"
        )
    if not beta >= 0:
        raise ValueError(f"beta={beta!r}: the KL weight must be >= 0, e.g. beta=0.04")
    if beta > 0 and ref_logps is None:
        raise ValueError(
            f"beta={beta!r} needs ref_logps (the reference policy's log-probs of the sampled "
            f"tokens); pass ref_logps=... or set beta=0.0"
        )
    _check_shapes(
        mask, logps=logps, old_logps=old_logps, ref_logps=ref_logps, is_weights=is_weights
    )
    if advantages.ndim == 1:
        if advantages.shape[0] != mask.shape[0]:
            raise ValueError(
                f"advantages has shape {tuple(advantages.shape)}: one per sequence needs "
                f"[{mask.shape[0]}] (the mask's first axis), or [B, T] per token"
            )
        advantages = advantages[:, None]
    else:
        _check_shapes(mask, advantages=advantages)
    advantages = _sg(jnp.broadcast_to(advantages, mask.shape)).astype(logps.dtype)
    m = mask != 0
    log_ratio = jnp.where(m, logps - _sg(old_logps), 0.0)
    ratio = jnp.exp(log_ratio)
    clipped_ratio = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg = -jnp.minimum(ratio * advantages, clipped_ratio * advantages)
    metrics = {}
    if is_weights is not None:
        pg = pg * _sg(is_weights)
        metrics["is_weight_mean"] = aggregate(is_weights, mask, "token")
    per_token = pg
    if ref_logps is not None:
        d = jnp.where(m, _sg(ref_logps) - logps, 0.0)
        k3 = jnp.exp(d) - d - 1.0
        metrics["kl"] = aggregate(k3, mask, "token")
        if beta > 0:
            per_token = pg + beta * k3
    high = m & (advantages > 0) & (ratio > 1.0 + clip_high)
    low = m & (advantages < 0) & (ratio < 1.0 - clip_low)
    loss = aggregate(per_token, mask, aggregation)
    metrics.update(
        loss=loss,
        pg_loss=aggregate(pg, mask, aggregation),
        clip_fraction=aggregate((high | low).astype(logps.dtype), mask, "token"),
        clip_fraction_high=aggregate(high.astype(logps.dtype), mask, "token"),
        clip_fraction_low=aggregate(low.astype(logps.dtype), mask, "token"),
        ratio_mean=aggregate(ratio, mask, "token"),
        tokens=m.sum().astype(logps.dtype),
    )
    return loss, metrics


def distill_loss(
    student_logps: jax.Array,
    teacher_logps: jax.Array,
    mask: jax.Array,
    *,
    aggregation: str = "token",
    is_weights: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """On-policy distillation from sampled tokens: reverse KL(student || teacher).

    The tokens were sampled by the student; `loss` equals the k1 estimate of the per-token
    reverse KL (aggregated) and its gradient is `sum m k1_t grad s_t` (normalised as the
    aggregation says), the score-function gradient of each position's reverse KL.

    Args:
        student_logps: sampled tokens' log-probs under the student being trained, [B, T].
        teacher_logps: the same under the teacher (no gradient).
        mask: nonzero on trained response tokens, [B, T].
        aggregation: "token" or "sequence".
        is_weights: truncated importance weights for stale samples, [B, T].

    Returns:
        The loss and metrics "loss", "reverse_kl" (the k1 estimate; equals "loss" without
        `is_weights`) and "tokens".
    """
    _check_aggregation(aggregation)
    _check_shapes(
        mask, student_logps=student_logps, teacher_logps=teacher_logps, is_weights=is_weights
    )
    m = mask != 0
    k1 = jnp.where(m, student_logps - _sg(teacher_logps), 0.0)
    surrogate = _sg(k1) * (student_logps - _sg(student_logps)) + _sg(k1)
    if is_weights is not None:
        surrogate = surrogate * _sg(is_weights)
    loss = aggregate(surrogate, mask, aggregation)
    return loss, {
        "loss": loss,
        "reverse_kl": aggregate(_sg(k1), mask, aggregation),
        "tokens": m.sum().astype(student_logps.dtype),
    }


def full_vocab_reverse_kl(
    student_logits: jax.Array,
    teacher_logits: jax.Array,
    mask: jax.Array,
    *,
    aggregation: str = "token",
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Exact reverse KL(student || teacher) at each position from full logits, [B, T, V].

    `KL_t = sum_v p_s(v) (log p_s(v) - log p_t(v))`, differentiable in the student's logits
    (the teacher's get no gradient), aggregated over trained positions.
    """
    _check_aggregation(aggregation)
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student_logits {tuple(student_logits.shape)} and teacher_logits "
            f"{tuple(teacher_logits.shape)} differ: full-vocab KL needs one vocabulary "
            f"(the same tokenizer); use distill_loss on sampled-token log-probs otherwise"
        )
    if student_logits.shape[:-1] != mask.shape:
        raise ValueError(
            f"logits {tuple(student_logits.shape)} vs mask {tuple(mask.shape)}: logits are "
            f"[B, T, V] with the mask's [B, T]"
        )
    log_s = jax.nn.log_softmax(student_logits, axis=-1)
    log_t = jax.nn.log_softmax(_sg(teacher_logits), axis=-1)
    kl = (jnp.exp(log_s) * (log_s - log_t)).sum(axis=-1)
    loss = aggregate(kl, mask, aggregation)
    return loss, {
        "loss": loss,
        "reverse_kl": loss,
        "tokens": (mask != 0).sum().astype(student_logits.dtype),
    }
