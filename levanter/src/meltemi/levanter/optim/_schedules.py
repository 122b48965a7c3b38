"""Learning-rate schedules (warmup, stable, decay; cycles with re-warmup) and batch-size schedules.

A `Schedule` is an optax schedule: calling it with a step (int or traced int array) gives the
learning rate as a float32 scalar. Every schedule is the same three-phase shape per cycle:

    warmup (linear, from the previous value up to `peak`) -> stable at `peak` -> decay to
    `peak * min_ratio` with a decay shape: constant, linear, cosine, 1-sqrt or inverse_sqrt.

Lengths (`warmup`, `decay`, `rewarmup`) are an int number of steps or a float fraction in
[0, 1] of the cycle's length. `in_decay(step)` says whether a step is in a decay phase (AdamC
uses it).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from meltemi.levanter.optim._errors import OptimizerConfigError

DecayShape = Literal["constant", "linear", "cosine", "1-sqrt", "inverse_sqrt"]
DECAY_SHAPES: tuple[str, ...] = ("constant", "linear", "cosine", "1-sqrt", "inverse_sqrt")


class ScheduleError(OptimizerConfigError):
    """A schedule was configured with an inconsistent or out-of-range value."""


def _to_steps(field: str, value: int | float, length: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ScheduleError(
            f"{field}={value!r} must be an int number of steps or a float fraction in [0, 1]"
        )
    if isinstance(value, (float, np.floating)):
        if not 0.0 <= value <= 1.0:
            raise ScheduleError(
                f"{field}={value!r} is a float, so it is a fraction of the cycle length and must "
                f"be in [0, 1]; pass an int for a number of steps, e.g. {field}={int(value)}"
            )
        return int(math.floor(float(value) * length + 0.5))  # half up, not banker's
    if not 0 <= value <= length:
        raise ScheduleError(f"{field}={value!r} steps must be in [0, {length}] (the cycle length)")
    return int(value)


def _shape_value(shape: str, p: jax.Array, t_dec: jax.Array, timescale: float) -> jax.Array:
    """Fraction of (peak - min) left after decay progress `p` in [0, 1] (t_dec steps)."""
    if shape == "constant":
        return jnp.ones_like(p)
    if shape == "linear":
        return 1.0 - p
    if shape == "cosine":
        return 0.5 * (1.0 + jnp.cos(jnp.pi * p))
    if shape == "1-sqrt":
        return 1.0 - jnp.sqrt(p)
    # inverse_sqrt: peak * sqrt(ts / (ts + t)), expressed as a fraction of peak.
    return jnp.sqrt(timescale / (timescale + t_dec))


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Warmup -> stable -> decay, optionally repeated in cycles with a re-warmup.

    Attributes:
        peak: the learning rate of the stable phase.
        total_steps: steps covered; after it the schedule stays at its final value.
        warmup: first cycle's warmup (linear from 0): steps (int) or cycle fraction (float).
        decay: decay length per cycle: steps or fraction; None = everything after warmup.
        shape: decay shape: "constant" (no decay), "linear", "cosine", "1-sqrt", "inverse_sqrt".
        min_ratio: the decay ends at `peak * min_ratio` (also the floor of inverse_sqrt).
        cycles: None (one cycle), an int n (n equal cycles) or the steps where cycles 2.. start.
        rewarmup: warmup of cycles 2..: linear from the previous cycle's final value to `peak`.
        timescale: inverse_sqrt's `ts` in `peak * sqrt(ts / (ts + t))`, t = steps into the decay
            (the rate halves after 3 * ts steps); default max(warmup steps, 1).

    Example:
        >>> s = Schedule(peak=1.0, total_steps=100, warmup=10, decay=0.5, shape="linear")
        >>> [round(float(s(t)), 3) for t in (0, 5, 10, 50, 75, 100)]
        [0.0, 0.5, 1.0, 1.0, 0.5, 0.0]
        >>> bool(s.in_decay(49)), bool(s.in_decay(50))
        (False, True)
    """

    peak: float
    total_steps: int
    warmup: int | float = 0
    decay: int | float | None = None
    shape: str = "cosine"
    min_ratio: float = 0.0
    cycles: int | tuple[int, ...] | None = None
    rewarmup: int | float = 0
    timescale: float | None = None

    def __post_init__(self) -> None:
        if self.shape not in DECAY_SHAPES:
            raise ScheduleError(f"shape={self.shape!r} is not one of {DECAY_SHAPES}")
        if not isinstance(self.total_steps, (int, np.integer)) or self.total_steps < 1:
            raise ScheduleError(f"total_steps={self.total_steps!r} must be an int >= 1")
        if not 0.0 <= self.min_ratio <= 1.0:
            raise ScheduleError(f"min_ratio={self.min_ratio!r} must be in [0, 1]")
        if self.timescale is not None and self.timescale <= 0:
            raise ScheduleError(f"timescale={self.timescale!r} must be > 0 steps")
        if isinstance(self.cycles, list):
            object.__setattr__(self, "cycles", tuple(self.cycles))
        object.__setattr__(self, "_table", self._build_table())

    def _cycle_starts(self) -> list[int]:
        c, n = self.cycles, self.total_steps
        if c is None:
            return [0]
        if isinstance(c, (int, np.integer)) and not isinstance(c, bool):
            if not 1 <= c <= n:
                raise ScheduleError(f"cycles={c!r} must be in [1, total_steps={n}]")
            return [round(i * n / c) for i in range(int(c))]
        starts = [0, *(int(s) for s in c)]
        if any(b <= a for a, b in zip(starts, starts[1:], strict=False)) or starts[-1] >= n:
            raise ScheduleError(
                f"cycles={c!r} must be strictly increasing steps in (0, total_steps={n}), "
                f"e.g. cycles=({n // 2},)"
            )
        return starts

    def _build_table(self) -> dict[str, np.ndarray]:
        starts = self._cycle_starts()
        ends = [*starts[1:], self.total_steps]
        rows = []
        end_value = 0.0  # the first warmup starts from 0
        for i, (s, e) in enumerate(zip(starts, ends, strict=True)):
            length = e - s
            name = "warmup" if i == 0 else "rewarmup"
            w = _to_steps(name, self.warmup if i == 0 else self.rewarmup, length)
            if self.shape == "constant":
                d = 0
            elif self.decay is None:
                d = length - w
            else:
                d = _to_steps("decay", self.decay, length)
            if w + d > length:
                raise ScheduleError(
                    f"{name} ({w} steps) + decay ({d} steps) exceed cycle {i}'s length "
                    f"({length} steps, steps {s}..{e}); shorten warmup or decay"
                )
            ts = float(self.timescale) if self.timescale is not None else float(max(w, 1))
            rows.append((s, length, w, length - d, d, end_value, ts))
            end_value = self._final_value(d, ts)
        cols = list(zip(*rows, strict=True))
        names = ("start", "length", "warm", "decay_start", "decay_len", "warm_from", "ts")
        return {k: np.asarray(v, np.float64) for k, v in zip(names, cols, strict=True)}

    def _final_value(self, decay_len: int, ts: float) -> float:
        low = self.peak * self.min_ratio
        if self.shape == "constant" or decay_len == 0:
            return float(self.peak)
        if self.shape == "inverse_sqrt":
            return max(low, self.peak * math.sqrt(ts / (ts + decay_len)))
        return float(low)

    def _cycle(self, step: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        tab = self._table
        step = jnp.asarray(step).astype(jnp.int32)  # integer arithmetic: exact at any step
        starts = jnp.asarray(tab["start"], jnp.int32)
        idx = jnp.searchsorted(starts[1:], step, side="right")
        row = {k: jnp.asarray(v, jnp.float32)[idx] for k, v in tab.items()}
        t = jnp.minimum(step - starts[idx], jnp.asarray(tab["length"], jnp.int32)[idx])
        return t.astype(jnp.float32), row

    def __call__(self, step: jax.Array | int) -> jax.Array:
        t, r = self._cycle(step)
        peak = jnp.float32(self.peak)
        low = jnp.float32(self.peak * self.min_ratio)
        warm = r["warm_from"] + (peak - r["warm_from"]) * t / jnp.maximum(r["warm"], 1.0)
        t_dec = jnp.maximum(t - r["decay_start"], 0.0)
        p = jnp.clip(t_dec / jnp.maximum(r["decay_len"], 1.0), 0.0, 1.0)
        frac = _shape_value(self.shape, p, t_dec, r["ts"])
        if self.shape == "inverse_sqrt":
            decayed = jnp.maximum(peak * frac, low)
        else:
            decayed = low + (peak - low) * frac
        lr = jnp.where(t < r["warm"], warm, jnp.where(t < r["decay_start"], peak, decayed))
        return lr.astype(jnp.float32)

    def in_decay(self, step: jax.Array | int) -> jax.Array:
        """True where `step` is in a decay phase (never for shape "constant")."""
        t, r = self._cycle(step)
        if self.shape == "constant":
            return jnp.zeros(jnp.shape(t), bool)
        return (t >= r["decay_start"]) & (r["decay_len"] > 0)

    def phases(self) -> list[dict[str, int]]:
        """Host-side table of each cycle's phase boundaries (absolute steps), for logs and docs.

        Example:
            >>> Schedule(1.0, 100, warmup=10, decay=20, shape="linear").phases()
            [{'start': 0, 'warmup_end': 10, 'decay_start': 80, 'end': 100}]
        """
        tab = self._table
        out = []
        for i in range(len(tab["start"])):
            s = int(tab["start"][i])
            out.append(
                {
                    "start": s,
                    "warmup_end": s + int(tab["warm"][i]),
                    "decay_start": s + int(tab["decay_start"][i]),
                    "end": s + int(tab["length"][i]),
                }
            )
        return out


def constant_schedule(value: float, *, warmup: int = 0) -> Schedule:
    """A constant learning rate, after an optional linear warmup from 0.

    Example:
        >>> float(constant_schedule(0.5)(1_000_000))
        0.5
    """
    return Schedule(value, total_steps=max(int(warmup), 1), warmup=int(warmup), shape="constant")


def linear_schedule(
    peak: float, total_steps: int, *, warmup: int | float = 0, min_ratio: float = 0.0
) -> Schedule:
    """Warmup, then linear decay to `peak * min_ratio` at `total_steps`.

    Example:
        >>> float(linear_schedule(1.0, 10)(5))
        0.5
    """
    return Schedule(peak, total_steps, warmup=warmup, shape="linear", min_ratio=min_ratio)


def cosine_schedule(
    peak: float, total_steps: int, *, warmup: int | float = 0, min_ratio: float = 0.0
) -> Schedule:
    """Warmup, then cosine decay to `peak * min_ratio` at `total_steps`.

    Example:
        >>> round(float(cosine_schedule(1.0, 10)(5)), 6)
        0.5
    """
    return Schedule(peak, total_steps, warmup=warmup, shape="cosine", min_ratio=min_ratio)


def inverse_sqrt_schedule(
    peak: float,
    total_steps: int,
    *,
    warmup: int | float = 0,
    timescale: float | None = None,
    min_ratio: float = 0.0,
) -> Schedule:
    """Warmup, then `peak * sqrt(ts / (ts + t))` (t = steps since warmup), floored at min.

    Example:
        >>> float(inverse_sqrt_schedule(1.0, 100, warmup=4)(4 + 12))
        0.5
    """
    return Schedule(
        peak, total_steps, warmup=warmup, shape="inverse_sqrt", timescale=timescale,
        min_ratio=min_ratio,
    )  # fmt: skip


def wsd_schedule(
    peak: float,
    total_steps: int,
    *,
    warmup: int | float = 0.01,
    decay: int | float = 0.4,
    shape: DecayShape = "linear",
    min_ratio: float = 0.0,
    cycles: int | Sequence[int] | None = None,
    rewarmup: int | float = 0,
) -> Schedule:
    """Warmup-stable-decay, optionally in cycles each re-warmed up from the previous minimum.

    Example (Marin-style: 1% warmup, 40% decay, two cycles, 10-step re-warmup):
        >>> s = wsd_schedule(1.0, 200, warmup=0.01, decay=0.4, cycles=(100,), rewarmup=10)
        >>> [round(float(s(t)), 3) for t in (0, 1, 60, 80, 100, 105, 110, 200)]
        [0.0, 1.0, 1.0, 0.5, 0.0, 0.5, 1.0, 0.0]
    """
    cyc = tuple(cycles) if isinstance(cycles, Sequence) else cycles
    return Schedule(
        peak, total_steps, warmup=warmup, decay=decay, shape=shape, min_ratio=min_ratio,
        cycles=cyc, rewarmup=rewarmup,
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class BatchSchedule:
    """Global batch size as a piecewise-constant function of the step (host-side ints).

    Attributes:
        segments: `(start_step, batch_size)` pairs; the first starts at step 0.

    Example:
        >>> b = BatchSchedule(((0, 8), (10, 16)))
        >>> b(9), b(10), b.examples_before(12)
        (8, 16, 112)
    """

    segments: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        segs = tuple((int(s), int(b)) for s, b in self.segments)
        if not segs or segs[0][0] != 0:
            raise ScheduleError(
                f"batch schedule segments={self.segments!r} must start at step 0, "
                f"e.g. ((0, 256), (1000, 512))"
            )
        starts = [s for s, _ in segs]
        if any(b <= a for a, b in zip(starts, starts[1:], strict=False)):
            raise ScheduleError(f"batch schedule start steps {starts} must strictly increase")
        for s, b in segs:
            if b < 1:
                raise ScheduleError(f"batch size {b} at step {s} must be >= 1")
        object.__setattr__(self, "segments", segs)

    def _index(self, step: int) -> int:
        if step < 0:
            raise ScheduleError(f"step={step} must be >= 0")
        return bisect.bisect_right([s for s, _ in self.segments], step) - 1

    def batch_size_at(self, step: int) -> int:
        """The global batch size used at `step`."""
        return self.segments[self._index(step)][1]

    __call__ = batch_size_at

    def examples_before(self, step: int) -> int:
        """How many examples steps 0..step-1 consumed (the data offset of `step`)."""
        total, i = 0, self._index(step)
        for j in range(i + 1):
            start, size = self.segments[j]
            end = self.segments[j + 1][0] if j < i else step
            total += (end - start) * size
        return total


def batch_size_schedule(spec: int | Mapping[int, int] | Sequence[Sequence[int]]) -> BatchSchedule:
    """A `BatchSchedule` from an int (constant), a `{start_step: size}` map or `(step, size)` pairs.

    Example:
        >>> batch_size_schedule({0: 4, 100: 8})(150)
        8
    """
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        return BatchSchedule(((0, int(spec)),))
    if isinstance(spec, Mapping):
        return BatchSchedule(tuple(sorted((int(k), int(v)) for k, v in spec.items())))
    return BatchSchedule(tuple((int(s), int(b)) for s, b in spec))
