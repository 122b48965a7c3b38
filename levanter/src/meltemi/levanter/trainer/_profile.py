"""`trainer.profile=(FIRST, LAST)`: a `jax.profiler` trace of those steps in the run dir."""

from __future__ import annotations

import pathlib
from typing import Any

import jax


class StepProfiler:
    """Starts a trace before step `first` runs and stops it once step `last` has finished.

    Steps are counted from 1, as in metrics.jsonl. The trace is written under
    `<run_dir>/profile/plugins/profile/<time>/` (`*.xplane.pb`, `*.trace.json.gz`).
    """

    def __init__(self, steps: tuple[int, int] | None, run_dir: pathlib.Path):
        self.steps = steps
        self.directory = run_dir / "profile"
        self.active = False

    def before(self, step: int) -> None:
        """Called before running step `step` (counted from 1)."""
        if self.steps and step == self.steps[0] and not self.active:
            self.directory.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.directory))
            self.active = True

    def after(self, step: int, outputs: Any) -> bool:
        """Called after dispatching step `step`; True when the trace was just written."""
        if self.active and step == self.steps[1]:
            jax.block_until_ready(outputs)  # the trace must hold the step's device work
            self.stop()
            return True
        return False

    def stop(self) -> None:
        """Ends the trace (a run that stops early still writes what it traced)."""
        if self.active:
            jax.profiler.stop_trace()
            self.active = False
