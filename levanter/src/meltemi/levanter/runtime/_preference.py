"""The preference losses of a `meltemi.models` language model: DPO, IPO and SimPO on pairs.

A preference batch (`meltemi.data.PackedDataset` on a preference store) holds each pair's
chosen and rejected conversations as two segments of one row, with `pair_ids`, `is_chosen` and
the reply-only `loss_mask`. The policy's (and the reference's) per-token log-probs of the
targets are summed per reply (`optim.sequence_logps`) and fed to `optim.preference_loss`.

The reference's log-probs come from, in this order: a batch field `reference_logps`
(precomputed once before training), a reference model passed to the loss (a frozen copy held
beside the parameters), or, for a LoRA model, the same model with its adapters removed (the
base weights, so no second copy exists).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

import meltemi.models as mm
from meltemi.levanter import optim

Batch = Mapping[str, Any]


def token_logps(model: Any, batch: Batch) -> jax.Array:
    """[rows, seq_len] float32 log-prob of each target token under `model` (0 where the
    loss mask is 0)."""
    logits = model(
        batch["tokens"], segment_ids=batch.get("segment_ids"), positions=batch.get("positions")
    )
    logits = logits.rearrange(("batch", "position", "vocab")).array.astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, batch["targets"][..., None].astype(jnp.int32), -1)[..., 0]
    return picked * batch["loss_mask"].astype(jnp.float32)


def without_adapters(model: Any) -> Any:
    """A LoRA model's base: every `LoraLinear` replaced by the linear layer it wraps (the
    same arrays, not a copy); a model without adapters is returned as it is."""
    is_lora = lambda x: isinstance(x, mm.lora.LoraLinear)  # noqa: E731
    return jax.tree.map(lambda x: x.base if is_lora(x) else x, model, is_leaf=is_lora)


def _pairs(logps: jax.Array, batch: Batch) -> optim.PairLogps:
    return optim.sequence_logps(
        logps,
        batch["loss_mask"],
        batch["pair_ids"],
        batch["is_chosen"],
        max_pairs=max(logps.shape[-1] // 2, 1),
    )


def reference_pairs(batch: Batch, model: Any, reference: Any | None) -> optim.PairLogps:
    """The reference's per-pair log-probs: precomputed, a frozen model, or `model`'s base."""
    if "reference_logps" in batch:
        logps = batch["reference_logps"].astype(jnp.float32) * batch["loss_mask"]
    else:
        ref = reference if reference is not None else without_adapters(model)
        logps = token_logps(jax.lax.stop_gradient(ref), batch)
    return _pairs(jax.lax.stop_gradient(logps), batch)


def make_preference_loss_fns(
    objective: str, *, beta: float, label_smoothing: float = 0.0, gamma: float = 0.0
) -> tuple[Callable, Callable]:
    """(train loss, eval loss) of a preference objective.

    The train loss is `loss_fn(model, batch, reference=None) -> (mean loss over valid pairs,
    metrics)`, with `optim.preference_metrics`' names plus `logps/accuracies` (the share of
    pairs whose chosen reply has the higher policy log-prob); the eval loss returns `(sum of pair
    losses, valid pairs, {metric: sum over pairs})`, which `SetEvaluator` accumulates.

    Args:
        objective: "dpo", "ipo" or "simpo" (`optim.OBJECTIVES`).
        beta: the objective's beta.
        label_smoothing: DPO and SimPO.
        gamma: SimPO's target margin.
    """
    if objective not in optim.OBJECTIVES:
        raise ValueError(f"objective={objective!r}: use one of {list(optim.OBJECTIVES)}")

    def loss_fn(model, batch, reference=None):
        policy = _pairs(token_logps(model, batch), batch)
        ref = None if objective == "simpo" else reference_pairs(batch, model, reference)
        loss, metrics = optim.preference_loss(
            objective, policy, ref, beta=beta, label_smoothing=label_smoothing, gamma=gamma
        )
        # The policy's own ranking, reference aside: the share of pairs whose chosen reply it
        # gives more log-prob (near 50% for a model with no preference yet).
        prefers = (policy.chosen > policy.rejected).astype(jnp.float32)
        w = policy.valid.astype(jnp.float32)
        metrics["logps/accuracies"] = jnp.sum(prefers * w) / jnp.maximum(jnp.sum(w), 1.0)
        metrics = {k: jax.lax.stop_gradient(v) for k, v in metrics.items()}
        return loss, metrics

    def eval_loss_fn(model, batch, reference=None):
        loss, metrics = loss_fn(model, batch, reference)
        pairs = jnp.sum(_pairs(batch["loss_mask"].astype(jnp.float32), batch).valid)
        pairs = pairs.astype(jnp.float32)
        return loss * pairs, pairs, {k: v * pairs for k, v in metrics.items()}

    return loss_fn, eval_loss_fn
