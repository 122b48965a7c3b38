"""lm-evaluation-harness tasks during training: a step-boundary hook of the trainer.

`meltemi.levanter.main` adds it to the trainer when `eval.harness_tasks` is set; the trainer
itself does not know about the harness (`meltemi.levanter.trainer.Hook`).
"""

from __future__ import annotations

from collections.abc import Mapping

from meltemi.levanter.config import RunSpec
from meltemi.levanter.evaluation import LoadedModel
from meltemi.levanter.harness._model import MeltemiLM
from meltemi.levanter.harness._run import check_tasks, harness_metrics, run_tasks, task_manager
from meltemi.levanter.trainer import StepEnd


class HarnessHook:
    """`eval.harness_tasks` every `eval.harness_every_steps` steps, logged as
    `harness/<task>/<metric>`.

    The task names are checked when the hook is built, before the first step.

    Args:
        spec: the run's checked config.

    Raises:
        EvalError: a task lm-eval does not know, naming it.
    """

    def __init__(self, spec: RunSpec):
        self.spec = spec
        self.every = spec.eval.harness_every_steps if spec.eval.harness_tasks else 0
        self._lm: MeltemiLM | None = None
        if self.every:
            manager = task_manager(spec.eval.harness_include_path, spec.eval.harness_tasks)
            check_tasks(spec.eval.harness_tasks, manager)

    def due(self, step: int, stopping: bool) -> bool:
        return bool(self.every) and step % self.every == 0

    def loaded_model(self, end: StepEnd) -> LoadedModel:
        """The trainer's parameters after `end.step`, as the harness model reads them."""
        spec, plan = self.spec, end.plan
        return LoadedModel(
            path=spec.run_dir,
            kind="run",
            params=end.state.params,
            static=plan.static,
            tokenizer=spec.tokenizer,
            mesh=plan.mesh,
            compute_dtype=plan.compute_dtype,
            spec=spec,
            step=end.step,
        )

    def __call__(self, end: StepEnd) -> dict[str, float]:
        """Runs the tasks on the state's parameters; returns `{"harness/<task>/<metric>": v}`."""
        spec = self.spec
        loaded = self.loaded_model(end)
        if self._lm is None:
            self._lm = MeltemiLM(loaded=loaded, batch_size=spec.eval.batch_size)
        else:  # same model and tokenizer, new parameters: keep the compiled functions
            self._lm.set_params(loaded)
        results = run_tasks(
            self._lm,
            spec.eval.harness_tasks,
            include_path=spec.eval.harness_include_path,
            limit=spec.eval.harness_limit or None,
            seed=spec.trainer.seed,
        )
        metrics = harness_metrics(results)
        end.say(harness_line(end.step, metrics))
        return metrics


def harness_line(step: int, metrics: Mapping[str, float]) -> str:
    """One line for the progress bar's log."""
    return f"step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
