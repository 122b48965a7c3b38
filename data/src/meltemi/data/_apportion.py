"""Quota sequences: which component each row of a mixture draws from.

A mixture's weights are turned into integers `W` summing to a period `D` (exactly when every
weight is a ratio with a common denominator up to `MAX_PERIOD`, else rounded to multiples of
`1 / MAX_PERIOD`). One period of `D` slots is laid out by Tijdeman's chairman-assignment rule
(earliest deadline first among the components that are due), which keeps every prefix of the
sequence within one row of its share: after `n` rows, component `c` has drawn `x_c(n)` rows
with `|x_c(n) - n * W_c / D| <= 1 - 1 / (2k - 2)` for `k` components with positive weight
(R. Tijdeman, "The chairman assignment problem", Discrete Math. 32, 1980). At the end of a
period every component has drawn exactly `W_c`, so the sequence repeats and row `g` is slot
`g mod D`: a closed form, with no state.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import NamedTuple

import numpy as np

__all__ = ["MAX_PERIOD", "QuotaSchedule", "check_weights", "integer_weights", "quota_schedule"]

#: Longest period of a quota sequence (slots); weights are exact up to this denominator.
MAX_PERIOD = 1 << 16


def check_weights(weights: Sequence[float], names: Sequence[str], where: str) -> np.ndarray:
    """Weights as float64, refusing NaN, inf, negative and all-zero ones by component name.

    >>> check_weights([1, 0.5], ["a", "b"], "w").tolist()
    [1.0, 0.5]
    """
    out = np.zeros(len(weights), np.float64)
    for i, (name, w) in enumerate(zip(names, weights, strict=True)):
        try:
            v = float(w)
        except (TypeError, ValueError):
            raise ValueError(
                f"{where}: the weight of {name!r} is {w!r}, not a number; pass a finite "
                f"number >= 0, e.g. {{{name!r}: 0.5}}"
            ) from None
        if not math.isfinite(v) or v < 0:
            raise ValueError(
                f"{where}: the weight of {name!r} is {v!r}; weights must be finite and >= 0 "
                f"(use 0 to leave a component out)"
            )
        out[i] = v
    if out.sum() <= 0:
        raise ValueError(
            f"{where}: every weight is 0 ({dict(zip(names, out.tolist(), strict=True))}); "
            f"give at least one component a positive weight"
        )
    return out


def integer_weights(weights: Sequence[float]) -> tuple[int, ...]:
    """Integers proportional to `weights` summing to the shortest exact period.

    Exact when every weight is (the float nearest to) a fraction and the normalised weights
    share a denominator `<= MAX_PERIOD`; otherwise the weights are rounded (largest remainder)
    to multiples of `1 / MAX_PERIOD`, keeping every positive weight positive.

    >>> integer_weights([0.7, 0.2, 0.1]), integer_weights([2, 1]), integer_weights([0.96, 0.04])
    ((7, 2, 1), (2, 1), (24, 1))
    """
    w = [float(x) for x in weights]
    fracs = [Fraction(x).limit_denominator(MAX_PERIOD) for x in w]
    if all(float(f) == x for f, x in zip(fracs, w, strict=True)):
        total = sum(fracs)
        shares = [f / total for f in fracs]
        period = math.lcm(*(s.denominator for s in shares))
        if period <= MAX_PERIOD:
            return tuple(int(s * period) for s in shares)
    arr = np.asarray(w, np.float64)
    raw = arr / arr.sum() * MAX_PERIOD
    counts = np.floor(raw).astype(np.int64)
    order = np.lexsort((np.arange(len(w)), -(raw - counts)))
    counts[order[: MAX_PERIOD - int(counts.sum())]] += 1
    for i in np.flatnonzero((arr > 0) & (counts == 0)).tolist():  # a tiny weight stays drawn
        counts[i] = 1
        counts[int(np.argmax(counts))] -= 1
    return tuple(int(c) for c in counts)


class QuotaSchedule(NamedTuple):
    """One period of a quota sequence and the tables that invert it.

    Attributes:
        weights: integer weights `W` (draws per period, per component).
        period: `D = sum(W)` slots.
        component: int32 [D], the component of each slot.
        rank: int64 [D], how many earlier slots of the period belong to that component.
        slots: per component, the sorted slots it owns (int64 arrays; `len == W_c`).
    """

    weights: tuple[int, ...]
    period: int
    component: np.ndarray
    rank: np.ndarray
    slots: tuple[np.ndarray, ...]

    def count_before(self, c: int, slot: np.ndarray | int) -> np.ndarray:
        """Draws of component `c` in slots `[0, slot)` of a period."""
        return np.searchsorted(self.slots[c], slot, side="left")


def _tijdeman(weights: tuple[int, ...]) -> np.ndarray:
    period = sum(weights)
    active = [c for c, w in enumerate(weights) if w > 0]
    if len(active) == 1:
        return np.full(period, active[0], np.int32)
    # sigma = 1 / s. Component c is due at time t (1-based) once W_c t - x_c D >= D / s,
    # and its deadline is (x_c + 1 - sigma) D / W_c; keys compare (s (x_c + 1) - 1) / W_c
    # exactly, in integers scaled by the lcm of the weights.
    s = 2 * len(active) - 2
    scale = math.lcm(*(weights[c] for c in active))

    def release(c: int, x: int) -> int:
        return -(-(s * x + 1) * period // (s * weights[c]))

    def deadline(c: int, x: int) -> int:
        return (s * (x + 1) - 1) * (scale // weights[c])

    waiting = [(release(c, 0), c) for c in active]
    heapq.heapify(waiting)
    ready: list[tuple[int, int]] = []
    drawn = [0] * len(weights)
    out = np.empty(period, np.int32)
    for t in range(1, period + 1):
        while waiting and waiting[0][0] <= t:
            _, c = heapq.heappop(waiting)
            heapq.heappush(ready, (deadline(c, drawn[c]), c))
        if not ready:  # pragma: no cover - excluded by Tijdeman's theorem
            raise RuntimeError(f"quota sequence for {weights}: no component due at slot {t - 1}")
        _, c = heapq.heappop(ready)
        out[t - 1] = c
        drawn[c] += 1
        if drawn[c] < weights[c]:
            heapq.heappush(waiting, (release(c, drawn[c]), c))
    return out


@functools.lru_cache(maxsize=32)
def quota_schedule(weights: tuple[int, ...]) -> QuotaSchedule:
    """The quota sequence of integer weights (cached; at most `MAX_PERIOD` slots).

    >>> quota_schedule((3, 1)).component.tolist()
    [0, 0, 1, 0]
    """
    component = _tijdeman(tuple(int(w) for w in weights))
    rank = np.empty(len(component), np.int64)
    slots = []
    for c in range(len(weights)):
        own = np.flatnonzero(component == c).astype(np.int64)
        rank[own] = np.arange(len(own))
        slots.append(own)
    return QuotaSchedule(tuple(weights), len(component), component, rank, tuple(slots))
