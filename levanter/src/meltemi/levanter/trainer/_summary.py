"""What a run did (`RunResult`) and the summary the binary prints at the end."""

from __future__ import annotations

import dataclasses
import pathlib

from meltemi.levanter.config import RunSpec
from meltemi.levanter.runtime import display_path


@dataclasses.dataclass
class RunResult:
    """What a run did.

    Attributes:
        run_dir: where its config, metrics, checkpoints and loss curve are.
        start_step: the step it started from (0, or the checkpoint it resumed).
        step: the steps completed when it stopped.
        preempted: stopped by SIGTERM before the last step.
        checkpoint_saved: a checkpoint of `step` was written (False when checkpoints are off).
        losses: train loss of each step this process ran, `{step: loss}`.
        eval: the last evaluation, `{"<set>": {"loss": ..., "bpb": ...}}`.
        eval_at_start: the evaluation of the starting model (`eval.at_start`), or `{}`.
        loss_png: the loss curve (None if not drawn).
        summary: the text printed at the end.
        compile_s: seconds to compile the train step (first batch size).
        tokens_per_s: tokens over seconds of this run's steps after the first (pauses for
            evaluation, checkpoints and compiles excluded).
        checkpoint_blocking_s: longest time a checkpoint save blocked the loop.
    """

    run_dir: pathlib.Path
    start_step: int
    step: int
    preempted: bool = False
    checkpoint_saved: bool = False
    losses: dict[int, float] = dataclasses.field(default_factory=dict)
    eval: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    eval_at_start: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    loss_png: pathlib.Path | None = None
    summary: str = ""
    compile_s: float = 0.0
    tokens_per_s: float = 0.0
    checkpoint_blocking_s: float = 0.0
    throughput: list[tuple[int, float]] = dataclasses.field(default_factory=list, repr=False)


def summary(spec: RunSpec, result: RunResult) -> str:
    """The end-of-run text: steps, losses, evaluation and where everything is."""
    lines = []
    ran = result.step - result.start_step
    if not result.preempted:
        state = "finished"
    elif result.checkpoint_saved:
        state = "preempted (checkpoint saved)"
    else:
        state = "preempted (no checkpoint: checkpoint.enabled=false; the next run starts over)"
    lines.append(
        f"run {state}: step {result.step}/{spec.trainer.num_train_steps} "
        f"({ran} steps this run, {result.tokens_per_s:,.0f} tokens/s)"
    )
    if result.losses:
        steps = sorted(result.losses)
        lines.append(
            f"  train/loss: {result.losses[steps[0]]:.4f} (step {steps[0]}) -> "
            f"{result.losses[steps[-1]]:.4f} (step {steps[-1]})"
        )
    for name, ev in result.eval_at_start.items():
        lines.append(f"  eval/{name} at step 0: {_eval_text(ev)}")
    for name, ev in result.eval.items():
        lines.append(f"  eval/{name}: {_eval_text(ev)}")
    lines.append(f"  run dir: {display_path(result.run_dir)}")
    if spec.checkpoint.enabled:
        lines.append(f"  checkpoints: {display_path(result.run_dir / 'checkpoints')}")
    lines.append(f"  metrics: {display_path(result.run_dir / 'metrics.jsonl')}")
    if result.loss_png:
        lines.append(f"  loss curve: {display_path(result.loss_png)}")
    return "\n".join(lines)


def _eval_text(ev: dict[str, float]) -> str:
    """Loss and bits per byte, or for preference pairs loss and reward accuracy."""
    if "bpb" in ev:
        return f"loss {ev['loss']:.4f}, bits/byte {ev['bpb']:.4f}"
    return f"loss {ev['loss']:.4f}, accuracy {ev.get('rewards/accuracies', float('nan')):.3f}"
