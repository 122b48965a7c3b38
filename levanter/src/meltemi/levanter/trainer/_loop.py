"""The components of the training loop: the step timer and the metrics sink.

`StepTimer` measures a step as the time between two observed completions minus the pauses
(evaluation, checkpoints, compiles) in between; `MetricsSink` turns a step's record into
metrics.jsonl / TensorBoard / W&B lines, the progress bar and the `RunResult`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax

from meltemi.levanter.checkpoint import step_dir
from meltemi.levanter.config import RunSpec
from meltemi.levanter.tracking import MetricsWriter, ProgressBar, TensorBoardWriter, open_wandb
from meltemi.levanter.trainer._fingerprint import fingerprint_value
from meltemi.levanter.trainer._summary import RunResult


class StepTimer:
    """Step time = between two observed completions, minus the pauses in between.

    Completions are observed in step order (`ready`); time spent in `pause()` blocks (hooks,
    a compile for a new batch size) since the previous completion does not count.
    """

    def __init__(self):
        self._last = time.perf_counter()
        self._paused = 0.0

    def ready(self, record: dict) -> dict:
        """Waits for the step of `record` (its `_device` metrics) and stamps `_elapsed`; a
        record already stamped is returned as it is."""
        if "_elapsed" not in record:
            jax.block_until_ready(record["_device"])
            now = time.perf_counter()
            record["_elapsed"] = max(now - self._last - self._paused, 1e-9)
            self._last, self._paused = now, 0.0
        return record

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """A block whose time is not step time."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._paused += time.perf_counter() - start


class MetricsSink:
    """Where each step's record goes: the loggers (process 0), the progress bar, the result.

    Args:
        spec: the run's config.
        local: the run's local files directory (metrics.jsonl, tensorboard/, wandb/).
        primary: this is process 0 (the only one that writes files).
        start: the step the run starts from.
        result: the run's result (losses and throughput are recorded here).
        cleanup: closes the writers when the loop ends.
        seq_len: tokens per row.
        model_flops: `model_flops(batch_size, tokens)` -> FLOPs of a step, or None.
        peak_flops: the peak FLOP/s of all devices (the MFU denominator).
        on_step: called with `(step, record)` after each record is written.
    """

    def __init__(
        self,
        spec: RunSpec,
        local: Any,
        primary: bool,
        start: int,
        result: RunResult,
        cleanup: contextlib.ExitStack,
        *,
        seq_len: int,
        model_flops: Callable[[int, int], float | None],
        peak_flops: Callable[[], float],
        on_step: Callable[[int, Mapping[str, float]], None] | None = None,
    ):
        self.spec, self.start, self.result, self.on_step = spec, start, result, on_step
        self.seq_len, self.model_flops = seq_len, model_flops
        self.loggers = _loggers(spec, local, start, cleanup) if primary else []
        enabled = spec.trainer.progress_bar and primary
        self.bar = ProgressBar(spec.trainer.num_train_steps, start, enabled=enabled)
        cleanup.callback(self.bar.close)
        if start:
            self.say(f"resumed from {step_dir(result.run_dir / 'checkpoints', start)}")
        self.peak = peak_flops()

    def say(self, line: str) -> None:
        """One line in the progress bar's log."""
        self.bar.write(line)

    def log(self, record: Mapping[str, Any]) -> None:
        """Writes a record that is not a step's (e.g. the evaluation before the first step)."""
        for log in self.loggers:
            log(record)

    def write(self, record: dict) -> None:
        """Writes a ready record (`StepTimer.ready`): throughput, MFU, the step's metrics."""
        elapsed = record.pop("_elapsed")
        metrics = {k: float(v) for k, v in jax.device_get(record.pop("_device")).items()}
        tokens = record["batch_size"] * self.seq_len
        tps = tokens / elapsed
        if record["step"] > self.start + 1:
            self.result.throughput.append((tokens, elapsed))
        flops = self.model_flops(record["batch_size"], tokens)
        mfu = flops / elapsed / self.peak if flops else None
        record.update(metrics)
        record["throughput/tokens_per_second"] = tps
        # Elastic multislice: the rows of a step and the slice count it ran on.
        record["data/batch_hash"] = fingerprint_value(record.pop("_batch_hash"))
        record["mesh/num_slices"] = self.spec.mesh.num_slices
        if mfu is not None:
            record["throughput/mfu"] = mfu
        self.result.losses[record["step"]] = metrics["train/loss"]
        for log in self.loggers:
            log(record)
        self.bar.update(record["step"], loss=metrics["train/loss"], tokens_per_s=tps, mfu=mfu)
        if self.on_step:
            self.on_step(record["step"], record)


def _loggers(
    spec: RunSpec, local: Any, start: int, cleanup: contextlib.ExitStack
) -> list[Callable[[dict], None]]:
    """The writers every step record goes to."""
    writer = MetricsWriter(local / "metrics.jsonl", resume_step=start)
    cleanup.callback(writer.close)
    out = [writer.write]
    if spec.logging.tensorboard:
        tb = TensorBoardWriter(local / "tensorboard")
        cleanup.callback(tb.close)
        out.append(lambda record: tb.write(record["step"], record))
    if spec.logging.wandb:
        run = open_wandb(
            local,
            project=spec.logging.wandb_project,
            name=spec.name,
            mode=spec.logging.wandb_mode,
            config=spec.resolved.config.to_dict(),
        )
        cleanup.callback(run.finish)
        out.append(lambda record: run.log(record, step=record["step"]))
    return out
