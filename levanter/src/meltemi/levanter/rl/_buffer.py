"""The trainer's bounded rollout buffer and its staleness rule.

Groups arrive from the workers in any order and are kept by prompt index; a training step
takes the groups of its prompt range, in index order, so the prompts a step trains on depend
only on the cursor (a resumed run takes the same ones). A group sampled with weights `v` and
taken at version `V` is `V - v` versions stale:

- 0: used as sampled (`used`);
- 1 .. `max_staleness`: used with a truncated importance weight (`corrected`);
- more: left out of the step (`dropped`).

Each count is kept per step and for the run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from meltemi.levanter.rl._rollout import Group

STALENESS_KINDS = ("used", "corrected", "dropped")


class BufferFullError(RuntimeError):
    """More groups were put than the buffer holds (the dispatcher ran too far ahead)."""


@dataclasses.dataclass(frozen=True)
class Taken:
    """The groups of one step: kept ones (in index order) and the staleness counts.

    Attributes:
        groups: the used and corrected groups.
        staleness: per kept group, versions it lags (0: fresh).
        counts: `{"used": ., "corrected": ., "dropped": .}` of this step.
        dropped: the indices of the dropped groups.
    """

    groups: list[Group]
    staleness: list[int]
    counts: dict[str, int]
    dropped: list[int]


class RolloutBuffer:
    """Groups by prompt index, at most `capacity` at once.

    Args:
        capacity: the most groups held (bounded memory).
        max_staleness: versions a group may lag and still be used (with correction if > 0).

    Example:
        >>> buffer = RolloutBuffer(capacity=4, max_staleness=1)
        >>> buffer.capacity, len(buffer)
        (4, 0)
    """

    def __init__(self, capacity: int, max_staleness: int):
        if capacity < 1:
            raise ValueError(f"RolloutBuffer(capacity={capacity}): must be >= 1")
        if max_staleness < 0:
            raise ValueError(f"RolloutBuffer(max_staleness={max_staleness}): must be >= 0")
        self.capacity, self.max_staleness = capacity, max_staleness
        self._groups: dict[int, Group] = {}
        self.totals = dict.fromkeys(STALENESS_KINDS, 0)

    def __len__(self) -> int:
        return len(self._groups)

    def __contains__(self, index: int) -> bool:
        return index in self._groups

    def put(self, group: Group) -> None:
        """Adds one group (a group of the same index replaces the earlier one)."""
        if group.index not in self._groups and len(self._groups) >= self.capacity:
            raise BufferFullError(
                f"RolloutBuffer: full ({self.capacity} groups) when group {group.index} "
                "arrived; the dispatcher must not request more prompts than the buffer holds"
            )
        self._groups[group.index] = group

    def classify(self, group_version: int, version: int) -> str:
        """ "used", "corrected" or "dropped" for a group of `group_version` taken at `version`."""
        lag = version - group_version
        if lag < 0:
            raise ValueError(
                f"a group of weights version {group_version} taken at version {version}: "
                "rollouts cannot come from the future"
            )
        if lag == 0:
            return "used"
        return "corrected" if lag <= self.max_staleness else "dropped"

    def take(self, indices: Iterable[int], version: int) -> Taken:
        """Removes and returns the groups of `indices` (all must be present)."""
        indices = list(indices)
        missing = [i for i in indices if i not in self._groups]
        if missing:
            raise KeyError(f"RolloutBuffer.take: groups {missing[:5]} have not arrived")
        groups, lags, dropped = [], [], []
        counts = dict.fromkeys(STALENESS_KINDS, 0)
        for i in indices:
            group = self._groups.pop(i)
            kind = self.classify(group.version, version)
            counts[kind] += 1
            if kind == "dropped":
                dropped.append(i)
            else:
                groups.append(group)
                lags.append(version - group.version)
        for kind, count in counts.items():
            self.totals[kind] += count
        return Taken(groups, lags, counts, dropped)
