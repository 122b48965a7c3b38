"""The trainer's evaluation: `meltemi.levanter.evaluation.SetEvaluator` on a run's plan.

One code path for the in-run evaluation and `//levanter:eval`; this adds only the EMA
parameters an optimizer state may hold.
"""

from __future__ import annotations

from typing import Any

from meltemi.levanter import optim
from meltemi.levanter.evaluation import EvalSet, SetEvaluator
from meltemi.levanter.trainer._plan import Plan
from meltemi.levanter.trainer._step import TrainState


class Evaluator(SetEvaluator):
    """The trainer's evaluation of a run's plan (a `SetEvaluator` on its mesh and model).

    With an EMA of the parameters in the optimizer state (`optimizer.ema_beta`), the EMA
    parameters are evaluated too, as `<set>-ema`.
    """

    def __init__(self, plan: Plan, eval_loss_fn, eval_sets: list[EvalSet]):
        super().__init__(plan.mesh, plan.static, plan.compute_dtype, eval_loss_fn, eval_sets)
        self.plan = plan

    def __call__(self, state: TrainState) -> dict[str, dict[str, float]]:
        results = self.evaluate_params(state.params, state.reference)
        ema = ema_params(state.opt_state)
        if ema is not None:
            for name, values in self.evaluate_params(ema, state.reference).items():
                results[f"{name}-ema"] = values
        return results


def ema_params(opt_state: Any) -> Any:
    """The EMA parameters in an optimizer state, or None when it keeps no EMA."""
    try:
        return optim.ema_of(opt_state)
    except ValueError:
        return None
