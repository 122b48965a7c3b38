"""Batch-size schedules from `trainer.batch_schedule` ("STEP:SIZE,STEP:SIZE")."""

from __future__ import annotations

import dataclasses

from meltemi.levanter.config._errors import ConfigError
from meltemi.levanter.optim import BatchSchedule, OptimizerConfigError


class BatchScheduleError(ConfigError):
    """`trainer.batch_schedule` text that does not describe a schedule."""


@dataclasses.dataclass(frozen=True)
class BatchSizes:
    """The global batch size of every step and the data row each step starts at.

    Because a step's rows start after every row of the steps before it, changing the batch
    size at step S (as the Marin runs did) neither skips nor repeats data.

    Example:
        >>> sizes = BatchSizes.parse("0:4,3:8", default=4)
        >>> [sizes.size_at(s) for s in range(5)], sizes.rows_before(4)
        ([4, 4, 4, 8, 8], 20)
    """

    schedule: BatchSchedule

    @classmethod
    def parse(cls, text: str, default: int) -> BatchSizes:
        """`""` means `default` at every step; else comma-separated `step:size` pairs."""
        if not text.strip():
            return cls(BatchSchedule(((0, default),)))
        pairs = []
        for item in text.split(","):
            step, sep, size = item.strip().partition(":")
            try:
                if not sep:
                    raise ValueError(item)
                pairs.append((int(step), int(size)))
            except ValueError:
                raise BatchScheduleError(
                    f"trainer.batch_schedule={text!r}: {item.strip()!r} is not STEP:SIZE; "
                    f'write e.g. --config.trainer.batch_schedule="0:8,100:16".'
                ) from None
        try:
            return cls(BatchSchedule(tuple(pairs)))
        except OptimizerConfigError as e:
            raise BatchScheduleError(f"trainer.batch_schedule={text!r}: {e}") from None

    @property
    def segments(self) -> tuple[tuple[int, int], ...]:
        """`(start_step, batch_size)` pairs."""
        return self.schedule.segments

    def size_at(self, step: int) -> int:
        """The global batch size of `step`."""
        return self.schedule.batch_size_at(step)

    def rows_before(self, step: int) -> int:
        """The index of the first data row of `step`."""
        return self.schedule.examples_before(step)
