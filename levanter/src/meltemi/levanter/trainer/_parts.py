"""What a run is made of, independent of where the pieces come from."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from meltemi.levanter.evaluation import EvalSet
from meltemi.levanter.trainer._plan import StepParts, fields_of


class BatchSource(Protocol):
    """Stateless data: the rows of any step are a pure function of the step."""

    def sequences(self, indices: np.ndarray) -> Mapping[str, np.ndarray]:
        """The rows with these global sequence indices (`tokens`, `targets`, `loss_mask`...)."""
        ...


@dataclasses.dataclass
class RunParts:
    """The step of a run (`StepParts`) and what it reads and reports: data and evaluation.

    `build_parts(spec)` is `model_parts(spec)` (what the dry run compiles) plus the data, so
    the trainer and the dry run build the step by one path.

    Attributes:
        step: the model, its loss, the optimizer, its metrics and a row's arrays; with
            `step.batch_fields=None` they are read from row 0 of `train_data`.
        train_data: rows by global sequence index.
        seq_len: tokens per row.
        eval_loss_fn: `eval_loss_fn(model, batch)` -> (sum of per-token NLL, loss tokens).
        eval_sets: validation sets.
        describe: one line naming the model, for logs and the summary.
        flops_per_token: analytic model FLOPs per trained token (6N + attention), if known.
        warm_start: `warm_start(params, init_from)` -> (params, report lines), if supported.
        data_metrics: `data_metrics(rows)` -> scalars logged with the step that trained the
            global rows `rows` (e.g. a mixture's `data/<component>/fraction`), if any.
    """

    step: StepParts
    train_data: BatchSource
    seq_len: int
    eval_loss_fn: Callable[[Any, Mapping[str, Any]], tuple[Any, Any]]
    eval_sets: list[EvalSet] = dataclasses.field(default_factory=list)
    describe: str = ""
    flops_per_token: float | None = None
    warm_start: Callable[[Any, str], tuple[Any, list[str]]] | None = None
    data_metrics: Callable[[np.ndarray], Mapping[str, float]] | None = None

    def checked_step(self) -> StepParts:
        """`step` with its batch fields checked against (or read from) the data's row 0.

        Raises:
            RuntimeError: the declared fields differ from what the data gives (a bug).
        """
        example = fields_of(self.train_data.sequences(np.arange(1)))
        fields = self.step.batch_fields
        if fields is None:
            return dataclasses.replace(self.step, batch_fields=example)
        if dict(fields) != example:  # the declared rows must be what the data gives
            raise RuntimeError(f"batch fields {dict(fields)} differ from the data's {example}")
        return self.step
