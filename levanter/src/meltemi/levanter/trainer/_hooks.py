"""Step-boundary hooks: what runs between two steps, each deciding for itself when.

A hook is two calls (as an optax transform is `init` and `update`):

    hook.due(step, stopping) -> bool      # once per step, on every process, in step order
    hook(end: StepEnd) -> metrics | None  # when due; the metrics join the step's record

The loop asks every hook `due` after each step, waits for the step when one is due, runs the
due hooks in order (the time they take is a pause, not step time) and writes the step's
record with what they returned. A hook with a `close()` method is closed when the loop ends.

The trainer's own hooks are evaluation (`EvalHook`) first and the checkpoint (`CheckpointHook`,
with the Hugging Face export and the upload of a gs:// run's files) last; hooks given to
`Trainer(hooks=...)` run between them. `meltemi.levanter.main` adds the lm-evaluation-harness
hook that way: the trainer does not know about it.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from meltemi.levanter.checkpoint import Checkpointer
from meltemi.levanter.evaluation import eval_line, eval_record
from meltemi.levanter.trainer._eval import Evaluator
from meltemi.levanter.trainer._plan import Plan
from meltemi.levanter.trainer._step import TrainState


@dataclasses.dataclass(frozen=True)
class StepEnd:
    """A step boundary, as a due hook sees it.

    Attributes:
        step: the steps completed (the state's step).
        state: the train state after `step` (ready: the loop waited for it).
        plan: the run's plan (mesh, the model's static half, compute dtype).
        stopping: the run stops after this step (SIGTERM, agreed by every process).
        final: `step` is `trainer.num_train_steps`.
        say: writes one line in the progress bar's log (or stdout).
    """

    step: int
    state: TrainState
    plan: Plan
    stopping: bool
    final: bool
    say: Callable[[str], None]


@runtime_checkable
class Hook(Protocol):
    """What runs at a step boundary (see the module docstring)."""

    def due(self, step: int, stopping: bool) -> bool:
        """Whether to run after `step` (called once per step, in order, on every process)."""
        ...

    def __call__(self, end: StepEnd) -> Mapping[str, float] | None:
        """Runs; returns metrics to log with the step (or None)."""
        ...


class EvalHook:
    """Loss and bits per byte on the eval sets every `eval.every_steps` steps and after the
    last step (that one without a progress-bar line), logged as `eval/<set>/{loss,bpb}`.

    Args:
        evaluate: the run's evaluator.
        every: `eval.every_steps` (0: only after the last step).
        num_steps: `trainer.num_train_steps`.
    """

    def __init__(self, evaluate: Evaluator, every: int, num_steps: int):
        self.evaluate, self.every, self.num_steps = evaluate, every, num_steps
        self.last: dict[str, dict[str, float]] = {}

    def _periodic(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    def due(self, step: int, stopping: bool) -> bool:
        return self._periodic(step) or step == self.num_steps

    def __call__(self, end: StepEnd) -> dict[str, float]:
        self.last = self.evaluate(end.state)
        if self._periodic(end.step):
            end.say(eval_line(end.step, self.last))
        return eval_record(self.last)


class CheckpointHook:
    """Saves a checkpoint when the policy says so, after the last step ("final") and before
    a preempted run stops ("temporary"); then the Hugging Face export (`checkpoint.export_hf`)
    and the upload of the run's files beside it.

    Args:
        checkpointer: the run's checkpointer.
        num_steps: `trainer.num_train_steps`.
        config_json: the run's config, saved in every checkpoint.
        export_hf: `export_hf(step, state)` after each save, or None.
        push: uploads the run's local files (process 0 of a gs:// run), or None.
    """

    def __init__(
        self,
        checkpointer: Checkpointer,
        num_steps: int,
        config_json: str,
        *,
        export_hf: Callable[[int, TrainState], Any] | None = None,
        push: Callable[[], None] | None = None,
    ):
        self.checkpointer, self.num_steps, self.config_json = checkpointer, num_steps, config_json
        self.export_hf, self.push = export_hf, push
        self.kind: str | None = None
        self.saved_at: int | None = None  # the step of the newest save
        self.blocking_s = 0.0  # the longest a save blocked the loop

    def due(self, step: int, stopping: bool) -> bool:
        # The policy is asked exactly once per step (it keeps time for save_every_minutes).
        kind = self.checkpointer.due(step)
        if step == self.num_steps:
            kind = "final"
        elif stopping:
            kind = kind or "temporary"
        self.kind = kind
        return kind is not None

    def __call__(self, end: StepEnd) -> None:
        ckpt = self.checkpointer
        ckpt.save(end.step, end.state, config_json=self.config_json, kind=self.kind)
        if self.export_hf is not None:
            self.export_hf(end.step, end.state)
        if self.push is not None:
            self.push()  # the metrics so far, beside the checkpoint
        self.saved_at = end.step
        self.blocking_s = max(self.blocking_s, ckpt.last_blocking_s)

    def close(self) -> None:
        self.checkpointer.close()


def hf_export_dir(local: pathlib.Path, step: int) -> pathlib.Path:
    """Where `checkpoint.export_hf` writes the export of `step` (under the run's files)."""
    return local / "hf" / f"step_{step:08d}"
