"""Preference-optimisation losses on per-sequence log-probabilities: DPO, IPO, SimPO.

Pure JAX math on arrays of one value per preference pair, so a trainer computes the policy's
(and the reference's) summed reply log-probs once and picks an objective by name:

- **DPO** (Rafailov et al. 2023), sigmoid form with conservative label smoothing `eps`
  (cDPO): with `z = beta * ((pi_c - ref_c) - (pi_r - ref_r))`,
  `loss = -(1 - eps) * log_sigmoid(z) - eps * log_sigmoid(-z)`.
- **IPO** (Azar et al. 2023, eq. 17): `(h - 1 / (2 * beta))**2` where `h` is the difference of
  the chosen and rejected log-ratios, each divided by its reply length (TRL's form: the IPO
  authors' normalisation; `length_normalized=False` gives the paper's summed form).
- **SimPO** (Meng et al. 2024): reference-free, on length-averaged log-probs, with a target
  margin `gamma`: `z = beta * (pi_c / n_c - pi_r / n_r) - gamma`, smoothed like DPO.

`sequence_logps` turns per-token log-probs of a packed preference batch (`pair_ids`,
`is_chosen` and `loss_mask` from `meltemi.data.PackedDataset` on a preference store) into
those per-pair sums; `preference_loss` ties it together with the logged metrics.

>>> import jax.numpy as jnp
>>> pol = PairLogps(jnp.array([-3.0, -5.0]), jnp.array([-4.0, -2.0]),
...                 jnp.array([2.0, 2.0]), jnp.array([3.0, 1.0]))
>>> ref = PairLogps(jnp.array([-3.5, -4.0]), jnp.array([-3.5, -3.0]), pol.chosen_tokens,
...                 pol.rejected_tokens)
>>> loss, m = preference_loss("dpo", pol, ref, beta=0.1)
>>> round(float(loss), 4), float(m["rewards/accuracies"])
(0.7213, 0.5)
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = [
    "OBJECTIVES",
    "PairLogps",
    "dpo_loss",
    "ipo_loss",
    "preference_loss",
    "preference_metrics",
    "sequence_logps",
    "simpo_loss",
]

OBJECTIVES = ("dpo", "ipo", "simpo")
"""Preference objectives `preference_loss` knows."""


class PairLogps(NamedTuple):
    """Summed reply log-probs of one model, one value per preference pair.

    Attributes:
        chosen: sum of the chosen reply's token log-probs.
        rejected: the same for the rejected reply.
        chosen_tokens: tokens of the chosen reply (the loss-masked ones).
        rejected_tokens: tokens of the rejected reply.
        valid: True for a real pair (both replies have tokens); padding slots are False.
    """

    chosen: jax.Array
    rejected: jax.Array
    chosen_tokens: jax.Array
    rejected_tokens: jax.Array
    valid: jax.Array | None = None


def _smoothed_sigmoid(z: jax.Array, label_smoothing: float) -> jax.Array:
    return -(1.0 - label_smoothing) * jax.nn.log_sigmoid(z) - label_smoothing * jax.nn.log_sigmoid(
        -z
    )


def _check(beta: float, label_smoothing: float, example: str) -> None:
    """Python hyperparameters checked at trace time (traced values pass through)."""
    if isinstance(beta, int | float) and not beta > 0:
        raise ValueError(f"beta={beta!r}: must be > 0, e.g. beta={example}")
    if isinstance(label_smoothing, int | float) and not 0 <= label_smoothing < 0.5:
        raise ValueError(
            f"label_smoothing={label_smoothing!r}: must be in [0, 0.5) (the assumed share of "
            f"flipped labels), e.g. label_smoothing=0.0"
        )


def dpo_loss(
    policy_chosen: jax.Array,
    policy_rejected: jax.Array,
    ref_chosen: jax.Array,
    ref_rejected: jax.Array,
    *,
    beta: float,
    label_smoothing: float = 0.0,
) -> jax.Array:
    """Per-pair sigmoid DPO loss (cDPO when `label_smoothing > 0`).

    Args:
        policy_chosen: summed log-probs of the chosen replies under the policy, [pairs].
        policy_rejected: the same for the rejected replies.
        ref_chosen: summed log-probs of the chosen replies under the reference.
        ref_rejected: the same for the rejected replies.
        beta: the KL strength (e.g. 0.1).
        label_smoothing: the assumed share of flipped labels, in [0, 0.5).
    """
    _check(beta, label_smoothing, "0.1")
    z = beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))
    return _smoothed_sigmoid(z, label_smoothing)


def ipo_loss(
    policy_chosen: jax.Array,
    policy_rejected: jax.Array,
    ref_chosen: jax.Array,
    ref_rejected: jax.Array,
    chosen_tokens: jax.Array,
    rejected_tokens: jax.Array,
    *,
    beta: float,
    length_normalized: bool = True,
) -> jax.Array:
    """Per-pair IPO loss `(h - 1 / (2 beta))**2`.

    Args:
        policy_chosen: summed log-probs of the chosen replies under the policy, [pairs].
        policy_rejected: the same for the rejected replies.
        ref_chosen: summed log-probs of the chosen replies under the reference.
        ref_rejected: the same for the rejected replies.
        chosen_tokens: reply lengths of the chosen replies (at least 1 is used).
        rejected_tokens: reply lengths of the rejected replies.
        beta: the regularisation strength (tau in the paper), > 0.
        length_normalized: divide each log-ratio by its reply length (TRL's DPOTrainer);
            False is the paper's summed form (TRL's CPOTrainer).
    """
    if isinstance(beta, int | float) and not beta > 0:
        raise ValueError(f"beta={beta!r}: IPO needs beta > 0 (its target is 1 / (2 beta))")
    chosen = policy_chosen - ref_chosen
    rejected = policy_rejected - ref_rejected
    if length_normalized:
        chosen = chosen / jnp.maximum(chosen_tokens, 1)
        rejected = rejected / jnp.maximum(rejected_tokens, 1)
    return (chosen - rejected - 1.0 / (2.0 * beta)) ** 2


def simpo_loss(
    policy_chosen: jax.Array,
    policy_rejected: jax.Array,
    chosen_tokens: jax.Array,
    rejected_tokens: jax.Array,
    *,
    beta: float,
    gamma: float,
    label_smoothing: float = 0.0,
) -> jax.Array:
    """Per-pair SimPO loss: reference-free, on length-averaged log-probs, with margin `gamma`.

    Args:
        policy_chosen: summed log-probs of the chosen replies under the policy, [pairs].
        policy_rejected: the same for the rejected replies.
        chosen_tokens: reply lengths of the chosen replies (at least 1 is used).
        rejected_tokens: reply lengths of the rejected replies.
        beta: the reward scale (the paper uses 2.0 to 2.5).
        gamma: the target reward margin (the paper: 0.5 to 1.6; `gamma / beta` 0.3 to 0.8).
        label_smoothing: the assumed share of flipped labels, in [0, 0.5).
    """
    _check(beta, label_smoothing, "2.0")
    chosen = policy_chosen / jnp.maximum(chosen_tokens, 1)
    rejected = policy_rejected / jnp.maximum(rejected_tokens, 1)
    return _smoothed_sigmoid(beta * (chosen - rejected) - gamma, label_smoothing)


def sequence_logps(
    token_logps: jax.Array,
    loss_mask: jax.Array,
    pair_ids: jax.Array,
    is_chosen: jax.Array,
    *,
    max_pairs: int,
) -> PairLogps:
    """Per-pair reply log-prob sums of a packed preference batch.

    Position `i` of a row carries `token_logps[i]` (the log-prob of `targets[i]`), counted
    when `loss_mask[i]` is set; `pair_ids[i]` (1, 2, ... per row, 0 on padding) and
    `is_chosen[i]` say which reply of which pair it belongs to.

    Args:
        token_logps: [rows, seq_len] log-probs of the targets.
        loss_mask: [rows, seq_len] 1 on reply tokens (float or int).
        pair_ids: [rows, seq_len] int, pair number inside the row, 0 on padding.
        is_chosen: [rows, seq_len] int or bool, 1 on the chosen reply's tokens.
        max_pairs: pair slots per row (static); pairs numbered above it are an error of the
            caller. `seq_len // 2` always suffices (a reply has at least one token).

    Returns:
        `PairLogps` of shape [rows * max_pairs], slot `r * max_pairs + p - 1` for pair `p` of
        row `r`, with `valid` False on empty slots.
    """
    rows = token_logps.shape[0]
    mask = loss_mask.astype(token_logps.dtype)
    chosen = is_chosen.astype(jnp.int32)
    slot = jnp.arange(rows, dtype=jnp.int32)[:, None] * max_pairs + pair_ids.astype(jnp.int32) - 1
    # Segment 2 * slot + (0 rejected, 1 chosen); padding (pair 0) goes to a dropped segment.
    seg = jnp.where(pair_ids > 0, 2 * slot + chosen, 2 * rows * max_pairs).reshape(-1)
    n = 2 * rows * max_pairs + 1
    sums = jax.ops.segment_sum((token_logps * mask).reshape(-1), seg, n)[:-1].reshape(-1, 2)
    counts = jax.ops.segment_sum(mask.reshape(-1), seg, n)[:-1].reshape(-1, 2)
    valid = (counts[:, 0] > 0) & (counts[:, 1] > 0)
    return PairLogps(sums[:, 1], sums[:, 0], counts[:, 1], counts[:, 0], valid)


def _mean(x: jax.Array, valid: jax.Array | None) -> jax.Array:
    if valid is None:
        return jnp.mean(x)
    w = valid.astype(x.dtype)
    return jnp.sum(x * w) / jnp.maximum(jnp.sum(w), 1)


def preference_metrics(
    policy: PairLogps, reference: PairLogps | None, *, beta: float, objective: str = "dpo"
) -> dict[str, jax.Array]:
    """What a preference run logs, averaged over valid pairs (TRL's names).

    `rewards/*` are the implied rewards: `beta * (log-ratio to the reference)` for DPO and
    IPO, `beta * (mean token log-prob)` for SimPO (no reference). `rewards/accuracies` is the
    share of pairs whose chosen reward is higher; `logps/*` are the policy's summed reply
    log-probs and `logratios/*` the policy's minus the reference's.
    """
    valid = policy.valid
    out = {
        "logps/chosen": _mean(policy.chosen, valid),
        "logps/rejected": _mean(policy.rejected, valid),
    }
    if objective == "simpo":
        chosen = beta * policy.chosen / jnp.maximum(policy.chosen_tokens, 1)
        rejected = beta * policy.rejected / jnp.maximum(policy.rejected_tokens, 1)
    else:
        if reference is None:
            raise ValueError(f"objective={objective!r} needs the reference's log-probs")
        chosen_ratio = policy.chosen - reference.chosen
        rejected_ratio = policy.rejected - reference.rejected
        out["logratios/chosen"] = _mean(chosen_ratio, valid)
        out["logratios/rejected"] = _mean(rejected_ratio, valid)
        chosen, rejected = beta * chosen_ratio, beta * rejected_ratio
    out["rewards/chosen"] = _mean(chosen, valid)
    out["rewards/rejected"] = _mean(rejected, valid)
    out["rewards/margins"] = _mean(chosen - rejected, valid)
    out["rewards/accuracies"] = _mean((chosen > rejected).astype(chosen.dtype), valid)
    return out


def preference_loss(
    objective: str,
    policy: PairLogps,
    reference: PairLogps | None = None,
    *,
    beta: float,
    label_smoothing: float = 0.0,
    gamma: float = 0.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The mean loss over valid pairs of `objective`, and `preference_metrics`.

    Args:
        objective: one of `OBJECTIVES`: "dpo", "ipo" or "simpo".
        policy: the policy's summed reply log-probs (`sequence_logps`).
        reference: the reference's (ignored by SimPO, required by the others).
        beta: the objective's beta.
        label_smoothing: DPO and SimPO only.
        gamma: SimPO's target margin.

    Raises:
        ValueError: an unknown objective, or no reference for DPO/IPO.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective={objective!r}: use one of {list(OBJECTIVES)}")
    if objective != "simpo" and reference is None:
        raise ValueError(
            f"objective={objective!r} needs the reference's log-probs (a frozen reference "
            f"model or precomputed ones); objective='simpo' needs none"
        )
    if objective == "dpo":
        losses = dpo_loss(
            policy.chosen,
            policy.rejected,
            reference.chosen,
            reference.rejected,
            beta=beta,
            label_smoothing=label_smoothing,
        )
    elif objective == "ipo":
        losses = ipo_loss(
            policy.chosen,
            policy.rejected,
            reference.chosen,
            reference.rejected,
            policy.chosen_tokens,
            policy.rejected_tokens,
            beta=beta,
        )
    else:
        losses = simpo_loss(
            policy.chosen,
            policy.rejected,
            policy.chosen_tokens,
            policy.rejected_tokens,
            beta=beta,
            gamma=gamma,
            label_smoothing=label_smoothing,
        )
    return _mean(losses, policy.valid), preference_metrics(
        policy, reference, beta=beta, objective=objective
    )
