"""The loss functions of a `meltemi.models` language model: training and evaluation."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def _batch_args(batch: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "loss_mask": batch["loss_mask"],
        "segment_ids": batch.get("segment_ids"),
        "positions": batch.get("positions"),
    }


def make_loss_fns(z_loss: float) -> tuple[Callable, Callable]:
    """(train loss with z-loss, eval (sum of NLL, loss tokens)) for a `meltemi.models` LM."""

    def loss_fn(model, batch):
        return model.loss(batch["tokens"], batch["targets"], z_loss=z_loss, **_batch_args(batch))

    def eval_loss_fn(model, batch):
        _, metrics = model.loss_and_metrics(batch["tokens"], batch["targets"], **_batch_args(batch))
        count = batch["loss_mask"].sum()
        return metrics["cross_entropy"] * count, count

    return loss_fn, eval_loss_fn
