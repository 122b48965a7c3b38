"""Mixtures of packed datasets whose weights hold at every row, with weight stages.

Which component global row `g` draws from depends only on the weights of the stage holding
`g` and on `g` itself: the stage's weights become integers `W` summing to a period `D`
(`_apportion.integer_weights`), and one period of `D` slots is a quota sequence in which,
after any number of rows, every component is within one row of its share. Row `g` is slot
`(g - first row of its stage) mod D`. The batch size plays no part, so the weights hold for
any batch size, batch-size schedule and number of hosts. Component `c`'s draws are numbered
consecutively across periods and stages, so its `i`-th draw is its sequence `i` (epochs
included), and provenance inverts the same arithmetic.

Global row `g` is a pure function of (components, weights, batch sizes, g): `batch(step)`
reads the rows of a step, `sequences(indices)` any rows, which is what a trainer with a
batch-size schedule needs (step `s` starts at the row after every row of the steps before it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from meltemi.data._apportion import QuotaSchedule, check_weights, integer_weights, quota_schedule
from meltemi.data._dataset import PackedDataset, Piece, batch_rows

__all__ = ["DatasetExhausted", "MixtureDataset", "exact_counts"]


class DatasetExhausted(IndexError):
    """A step beyond the end of a mixture with a stopping strategy."""


def exact_counts(weights: Sequence[float], total: int) -> np.ndarray:
    """Integer counts summing to `total`, proportional to `weights` (largest remainder).

    Raises:
        ValueError: a weight is NaN, infinite or negative, or every weight is 0.

    >>> exact_counts([0.5, 0.3, 0.2], 7).tolist()
    [4, 2, 1]
    """
    names = [f"weights[{i}]" for i in range(len(weights))]
    w = check_weights(weights, names, f"exact_counts(total={total})")
    raw = w / w.sum() * total
    counts = np.floor(raw).astype(np.int64)
    rest = total - int(counts.sum())
    order = np.lexsort((np.arange(len(w)), -(raw - counts)))  # ties: earlier component first
    counts[order[:rest]] += 1
    return counts


def _batch_segments(batch_size) -> tuple[tuple[int, int], ...]:
    """`(start_step, size)` pairs from an int or a schedule, checked."""
    if isinstance(batch_size, int | np.integer) and not isinstance(batch_size, bool):
        segments = ((0, int(batch_size)),)
    else:
        try:
            segments = tuple((int(s), int(n)) for s, n in batch_size)
        except (TypeError, ValueError):
            raise ValueError(
                f"MixtureDataset(batch_size={batch_size!r}): pass an int or a schedule "
                f"[(start_step, size), ...], e.g. [(0, 8), (100, 16)]"
            ) from None
    if not segments or segments[0][0] != 0:
        raise ValueError(
            f"MixtureDataset(batch_size={batch_size!r}): a schedule's first entry must start "
            f"at step 0, e.g. [(0, 8), (100, 16)]"
        )
    for (s0, _), (s1, _) in zip(segments, segments[1:], strict=False):
        if s1 <= s0:
            raise ValueError(
                f"MixtureDataset(batch_size={batch_size!r}): schedule steps must increase "
                f"({s1} after {s0})"
            )
    for start, size in segments:
        if size < 1:
            raise ValueError(
                f"MixtureDataset(batch_size={batch_size!r}): size {size} (from step {start}) "
                f"must be >= 1"
            )
    return segments


def _check_same_tokens(components: Mapping[str, PackedDataset]) -> None:
    """Refuses components whose rows would hold different id spaces (names both)."""
    items = list(components.items())
    first, ref = items[0]
    ref_tok = ref.store.metadata["tokenizer"]
    for name, ds in items[1:]:
        tok = ds.store.metadata["tokenizer"]
        if tok["fingerprint"] != ref_tok["fingerprint"]:
            raise ValueError(
                f"MixtureDataset: components {first!r} and {name!r} were built with different "
                f"tokenizers ({first!r}: {ref_tok['name']}, vocab {ref_tok['vocab_size']}, "
                f"fingerprint {ref_tok['fingerprint'][:12]}; {name!r}: {tok['name']}, vocab "
                f"{tok['vocab_size']}, fingerprint {tok['fingerprint'][:12]}), so one batch "
                f"would mix two id spaces; build every component's store with one tokenizer"
            )
        average, ref_average = (getattr(d, "loss_average", "token") for d in (ds, ref))
        if average != ref_average:
            raise ValueError(
                f"MixtureDataset: components {first!r} (loss_average={ref_average!r}) and "
                f"{name!r} (loss_average={average!r}) weigh their tokens differently, so "
                f"one batch's loss would mix two averages; pass the same "
                f"PackedDataset(loss_average=...) to every component"
            )
        pairs, ref_pairs = (d.store.metadata.get("kind") == "preference" for d in (ds, ref))
        if pairs != ref_pairs:
            named = {True: "preference pairs", False: "no preference pairs"}
            raise ValueError(
                f"MixtureDataset: component {first!r} holds {named[ref_pairs]} and {name!r} "
                f"holds {named[pairs]}, so their rows cannot share one loss; mix preference "
                f"stores only with preference stores"
            )
        if ds.pad_id != ref.pad_id:
            raise ValueError(
                f"MixtureDataset: components {first!r} and {name!r} pad with different ids "
                f"({ref.pad_id} and {ds.pad_id}); pass the same PackedDataset(pad_id=...)"
            )


class MixtureDataset:
    """Draws rows from several `PackedDataset`s by weight; the weights hold at every row.

    After any number of rows of a stage, each component has drawn within one row of its share
    (weights that are ratios with a common denominator up to 65,536 are exact; others are
    rounded to multiples of 1/65,536), whatever the batch size or its schedule.

    Args:
        components: name -> dataset; all must share `seq_len`, tokenizer, pad id and
            `loss_average`. Chat and text components mix: a chat row's `loss_mask` keeps
            only its trained tokens, a text row's every real target. Preference components
            mix only with each other (their rows carry `pair_ids` and `is_chosen`).
        weights: name -> weight, or stages `[(start_step, {name: weight}), ...]` (the first
            stage starts at step 0; from `start_step` on, that stage's weights apply).
            Weights are finite and >= 0 with a positive sum; they need not sum to 1.
        batch_size: global rows per step, or a schedule `[(start_step, size), ...]` (first at
            step 0): each step's rows follow every row of the steps before it.
        seed: kept for the datasets' configuration record; the layout of rows depends only on
            the weights (each component's own order comes from its `PackedDataset` seed).
        stop: "restart" (components cycle through epochs forever), "first_exhausted" (end
            before any component repeats a sequence) or "all_exhausted" (end once every
            component has been seen whole; earlier finishers restart).

    Example:
        >>> import tempfile
        >>> from meltemi.data import ByteTokenizer, PackedDataset, TextFiles, build_store
        >>> d = tempfile.mkdtemp()
        >>> parts = {}
        >>> for name in ("code", "prose"):
        ...     with open(f"{d}/{name}.txt", "w") as f:
        ...         _ = f.write(name * 200)
        ...     store = build_store([TextFiles(name, [f"{d}/{name}.txt"])], ByteTokenizer(),
        ...                         f"{d}/{name}")
        ...     parts[name] = PackedDataset(store, seq_len=8, batch_size=4)
        >>> mix = MixtureDataset(parts, {"code": 0.75, "prose": 0.25},
        ...                      batch_size=[(0, 4), (2, 8)])
        >>> [mix.batch_size_at(s) for s in range(4)], mix.rows_before(3)
        ([4, 4, 8, 8], 16)
        >>> mix.sequences(range(16, 24))["component"].tolist()
        [0, 0, 1, 0, 0, 0, 1, 0]
    """

    def __init__(
        self,
        components: Mapping[str, PackedDataset],
        weights: Mapping[str, float] | Sequence[tuple[int, Mapping[str, float]]],
        *,
        batch_size: int | Sequence[tuple[int, int]],
        seed: int = 0,
        stop: str = "restart",
    ):
        if not components:
            raise ValueError("MixtureDataset(components={}): pass at least one component")
        self.names = list(components)
        self.components = dict(components)
        lens = {n: c.seq_len for n, c in self.components.items()}
        if len(set(lens.values())) != 1:
            raise ValueError(f"MixtureDataset: components disagree on seq_len: {lens}")
        _check_same_tokens(self.components)
        self.seq_len = next(iter(lens.values()))
        self.batch_segments = _batch_segments(batch_size)
        sizes = [n for _, n in self.batch_segments]
        #: The batch size when it is constant, else None (see `batch_size_at`).
        self.batch_size = sizes[0] if len(set(sizes)) == 1 else None
        self._seg_starts = np.asarray([s for s, _ in self.batch_segments], np.int64)
        self._seg_sizes = np.asarray(sizes, np.int64)
        self._seg_rows = np.zeros(len(sizes), np.int64)  # first row of each segment
        for k in range(1, len(sizes)):
            span = self._seg_starts[k] - self._seg_starts[k - 1]
            self._seg_rows[k] = self._seg_rows[k - 1] + span * self._seg_sizes[k - 1]
        if stop not in ("restart", "first_exhausted", "all_exhausted"):
            raise ValueError(
                f"MixtureDataset(stop={stop!r}): use 'restart', 'first_exhausted' or "
                f"'all_exhausted'"
            )
        self.stop = stop
        self.seed = seed
        self.pad_id = next(iter(self.components.values())).pad_id
        stages = [(0, weights)] if isinstance(weights, Mapping) else list(weights)
        self._stage_rows, self._schedules = self._parse_stages(stages)
        self._cum_at_stage = self._cumulative_at_stages()
        self.num_steps = self._compute_num_steps()
        #: Rows before the end (None when infinite): `sequences` refuses rows past it.
        self.num_rows = None if self.num_steps is None else self.rows_before(self.num_steps)

    # -- the batch-size schedule ----------------------------------------------------------------

    def batch_size_at(self, step: int) -> int:
        """The global batch size of `step`."""
        k = int(np.searchsorted(self._seg_starts, int(step), side="right")) - 1
        return int(self._seg_sizes[k])

    def rows_before(self, step: int) -> int:
        """The global row index where `step` starts (every row of the earlier steps first)."""
        k = int(np.searchsorted(self._seg_starts, int(step), side="right")) - 1
        return int(self._seg_rows[k] + (int(step) - self._seg_starts[k]) * self._seg_sizes[k])

    def step_of_row(self, row: int) -> tuple[int, int]:
        """`(step, row within the step)` of a global row."""
        k = int(np.searchsorted(self._seg_rows, int(row), side="right")) - 1
        steps, within = divmod(int(row) - int(self._seg_rows[k]), int(self._seg_sizes[k]))
        return int(self._seg_starts[k]) + steps, within

    # -- stages and quota sequences -------------------------------------------------------------

    def _parse_stages(self, stages) -> tuple[np.ndarray, list[QuotaSchedule]]:
        if not stages or stages[0][0] != 0:
            raise ValueError(
                f"MixtureDataset(weights=...): the first stage must start at step 0, got "
                f"{[s for s, _ in stages]}; e.g. [(0, {{'a': 0.7, 'b': 0.3}}), (1000, ...)]"
            )
        rows, schedules = [], []
        last = -1
        for start, w in stages:
            if start <= last:
                raise ValueError(f"MixtureDataset: stage starts must increase, got {start}")
            last = start
            unknown = set(w) - set(self.names)
            if unknown:
                raise ValueError(
                    f"MixtureDataset: weights name unknown components {sorted(unknown)}; "
                    f"components are {self.names}"
                )
            where = "MixtureDataset(weights=...)" + (f" at step {start}" if start else "")
            vec = check_weights([w.get(n, 0.0) for n in self.names], self.names, where)
            rows.append(self.rows_before(start))
            schedules.append(quota_schedule(integer_weights(vec)))
        return np.asarray(rows, np.int64), schedules

    def _stage_draws(self, k: int, c: int, local: np.ndarray) -> np.ndarray:
        """Draws of component `c` in the first `local` rows of stage `k`."""
        q = self._schedules[k]
        periods, slot = np.divmod(np.asarray(local, np.int64), q.period)
        return periods * q.weights[c] + q.count_before(c, slot)

    def _cumulative_at_stages(self) -> np.ndarray:
        """Draws per component before each stage: shape (stages, components)."""
        cum = np.zeros((len(self._stage_rows), len(self.names)), np.int64)
        for k in range(1, len(self._stage_rows)):
            span = int(self._stage_rows[k] - self._stage_rows[k - 1])
            for c in range(len(self.names)):
                cum[k, c] = cum[k - 1, c] + int(self._stage_draws(k - 1, c, span))
        return cum

    def _draws_before(self, c: int, row: int) -> int:
        """Draws of component `c` in global rows `[0, row)`."""
        k = int(np.searchsorted(self._stage_rows, row, side="right")) - 1
        local = int(row) - int(self._stage_rows[k])
        return int(self._cum_at_stage[k, c]) + int(self._stage_draws(k, c, local))

    def _rows_of_draws(self, c: int, draws: np.ndarray) -> np.ndarray:
        """The global row of each draw of component `c` (-1 where it never happens)."""
        draws = np.asarray(draws, np.int64)
        out = np.full(draws.shape, -1, np.int64)
        stages = len(self._stage_rows)
        for k in range(stages):
            q = self._schedules[k]
            n = q.weights[c]
            lo = int(self._cum_at_stage[k, c])
            hi = int(self._cum_at_stage[k + 1, c]) if k + 1 < stages else None
            sel = (draws >= lo) & (True if hi is None else draws < hi)
            if n == 0 or not np.any(sel):
                continue
            periods, r = np.divmod(draws[sel] - lo, n)
            out[sel] = self._stage_rows[k] + periods * q.period + q.slots[c][r]
        return out

    def _compute_num_steps(self) -> int | None:
        if self.stop == "restart":
            return None
        ends = []
        for c, name in enumerate(self.names):
            q = self.components[name].num_sequences
            # first_exhausted: the row that would make draw q (a repeat); all: draw q - 1.
            row = int(self._rows_of_draws(c, [q if self.stop == "first_exhausted" else q - 1])[0])
            if row < 0:
                if self.stop == "all_exhausted":
                    raise ValueError(
                        f"MixtureDataset(stop='all_exhausted'): component {name!r} gets weight "
                        f"0 from some stage on and is never exhausted; use stop='restart'"
                    )
                continue
            ends.append(row)
        if not ends:
            return None
        if self.stop == "first_exhausted":  # end before the step holding the first repeat
            return self.step_of_row(min(ends))[0]
        return self.step_of_row(max(ends))[0] + 1

    def _assign(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(component index, component draw index) of each global row."""
        stage = np.searchsorted(self._stage_rows, rows, side="right") - 1
        comp = np.empty_like(rows)
        draw = np.empty_like(rows)
        for k in np.unique(stage).tolist():
            sel = stage == k
            q = self._schedules[k]
            periods, slot = np.divmod(rows[sel] - self._stage_rows[k], q.period)
            c = q.component[slot].astype(np.int64)
            comp[sel] = c
            weights = np.asarray(q.weights, np.int64)
            draw[sel] = self._cum_at_stage[k][c] + periods * weights[c] + q.rank[slot]
        return comp, draw

    # -- rows -------------------------------------------------------------------------------------

    def _check_rows(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, np.int64).reshape(-1)
        if rows.size and rows.min() < 0:
            raise ValueError(f"row indices must be >= 0, got {int(rows.min())}")
        if rows.size and self.num_rows is not None and rows.max() >= self.num_rows:
            raise DatasetExhausted(
                f"row {int(rows.max())} is past the end of this mixture (stop={self.stop!r}, "
                f"num_rows={self.num_rows}); use stop='restart' to cycle forever"
            )
        return rows

    def components_of(self, indices) -> np.ndarray:
        """The component index (into `names`) of each global row, without reading tokens.

        Cheap enough to call every step: a trainer logs `np.bincount` of a step's rows to show
        the mixture holding.
        """
        return self._assign(self._check_rows(indices))[0].astype(np.int32)

    def sequences(self, indices) -> dict[str, np.ndarray]:
        """The rows with these global row indices, plus `component` (int32 per row)."""
        rows = self._check_rows(indices)
        comp, draw = self._assign(rows)
        out = None
        for c in np.unique(comp).tolist():
            sel = comp == c
            part = self.components[self.names[c]].sequences(draw[sel])
            if out is None:
                out = {k: np.empty((len(rows), *v.shape[1:]), v.dtype) for k, v in part.items()}
            for k, v in part.items():
                out[k][sel] = v
        if out is None:  # no rows: empty arrays of the right shapes
            empty = self.components[self.names[0]].sequences(np.zeros(0, np.int64))
            out = {k: np.asarray(v) for k, v in empty.items()}
        out["component"] = comp.astype(np.int32)
        return out

    def _check_step(self, step: int) -> None:
        if self.num_steps is not None and step >= self.num_steps:
            raise DatasetExhausted(
                f"step {step} is past the end of this mixture (stop={self.stop!r}, "
                f"num_steps={self.num_steps}); use stop='restart' to cycle forever"
            )

    def batch(self, step: int, process_index: int = 0, process_count: int = 1) -> dict:
        """The rows of `step` owned by `process_index`, plus `component` (int32 per row)."""
        size = self.batch_size_at(max(int(step), 0))
        rows = batch_rows(size, step, process_index, process_count)
        self._check_step(int(step))
        return self.sequences(rows - int(step) * size + self.rows_before(int(step)))

    # -- provenance ---------------------------------------------------------------------------

    def locate_sequence(self, index: int) -> list[Piece]:
        """The (component, document, token offset, ...) pieces of global row `index`."""
        comp, draw = self._assign(self._check_rows([int(index)]))
        name = self.names[int(comp[0])]
        pieces = self.components[name].locate_sequence(int(draw[0]))
        return [p._replace(component=name) for p in pieces]

    def locate(self, step: int, row: int) -> list[Piece]:
        """The (component, document, token offset, ...) pieces of one row of one step."""
        size = self.batch_size_at(int(step))
        if not 0 <= row < size:
            raise IndexError(f"row {row} outside the batch of {size} rows of step {step}")
        return self.locate_sequence(self.rows_before(int(step)) + int(row))

    def sequence_indices_of(self, component: str, document: int, limit: int) -> np.ndarray:
        """Sorted global rows `< limit` that used `document` of `component` (via inverses)."""
        if component not in self.components:
            raise KeyError(f"unknown component {component!r}; components are {self.names}")
        c = self.names.index(component)
        limit = int(limit)
        draws = self.components[component].sequence_indices_of(
            document, self._draws_before(c, limit)
        )
        rows = self._rows_of_draws(c, draws)
        return np.sort(rows[(rows >= 0) & (rows < limit)])

    def steps_of(self, component: str, document: int, *, max_step: int) -> list[tuple[int, int]]:
        """Every (step, row) before `max_step` that used `document` of `component`."""
        rows = self.sequence_indices_of(component, document, self.rows_before(int(max_step)))
        return [self.step_of_row(int(g)) for g in rows]
