"""What a run is made of, independent of where the pieces come from."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import jax
import numpy as np
import optax

from meltemi.levanter.trainer._plan import StepParts, fields_of


class BatchSource(Protocol):
    """Stateless data: the rows of any step are a pure function of the step."""

    def sequences(self, indices: np.ndarray) -> Mapping[str, np.ndarray]:
        """The rows with these global sequence indices (`tokens`, `targets`, `loss_mask`...)."""
        ...


@dataclasses.dataclass
class EvalSet:
    """A validation set: fixed batches, and how many UTF-8 bytes their loss tokens encode.

    Attributes:
        name: the tag in metric names (`eval/<name>/loss`, `eval/<name>/bpb`).
        batches: host batches (global rows), evaluated in order.
        num_bytes: UTF-8 bytes of the target tokens, for bits per byte.
    """

    name: str
    batches: list[Mapping[str, np.ndarray]]
    num_bytes: int


@dataclasses.dataclass
class RunParts:
    """The model, loss, optimizer and data of a run.

    Attributes:
        init_model: `init_model(key)` -> the model (an equinox module).
        loss_fn: `loss_fn(model, batch)` -> mean training loss (z-loss included).
        eval_loss_fn: `eval_loss_fn(model, batch)` -> (sum of per-token NLL, loss tokens).
        optimizer: the optax transform (chain with clipping, skip-step, EMA...).
        metrics_fn: optimizer state -> logged scalars.
        train_data: rows by global sequence index.
        eval_sets: validation sets.
        seq_len: tokens per row.
        describe: one line naming the model, for logs and the summary.
        flops_per_token: analytic model FLOPs per trained token (6N + attention), if known.
        warm_start: `warm_start(params, init_from)` -> (params, report lines), if supported.
        data_metrics: `data_metrics(rows)` -> scalars logged with the step that trained the
            global rows `rows` (e.g. a mixture's `data/<component>/fraction`), if any.
        batch_fields: the shape (without the batch dimension) and dtype of each array of a
            row; default: read from row 0 of `train_data`.
    """

    init_model: Callable[[Any], Any]
    loss_fn: Callable[[Any, Mapping[str, Any]], Any]
    eval_loss_fn: Callable[[Any, Mapping[str, Any]], tuple[Any, Any]]
    optimizer: optax.GradientTransformation
    train_data: BatchSource
    seq_len: int
    metrics_fn: Callable[[Any], Mapping[str, Any]] | None = None
    eval_sets: list[EvalSet] = dataclasses.field(default_factory=list)
    describe: str = ""
    flops_per_token: float | None = None
    warm_start: Callable[[Any, str], tuple[Any, list[str]]] | None = None
    data_metrics: Callable[[np.ndarray], Mapping[str, float]] | None = None
    batch_fields: Mapping[str, jax.ShapeDtypeStruct] | None = None

    def step_parts(self) -> StepParts:
        """The parts the step is made of (what `plan` needs)."""
        fields = self.batch_fields
        example = fields_of(self.train_data.sequences(np.arange(1)))
        if fields is None:
            fields = example
        elif dict(fields) != example:  # the declared rows must be what the data gives
            raise RuntimeError(f"batch fields {dict(fields)} differ from the data's {example}")
        return StepParts(self.init_model, self.loss_fn, self.optimizer, self.metrics_fn, fields)
