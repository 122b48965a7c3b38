"""Mixtures of packed datasets with exact per-block counts and weight stages.

Rows are grouped in blocks of `block_size` (default: the largest size that divides every
batch, so each batch holds whole blocks). Block `j` uses the weights of the stage active at
its first row, turned into exact integer counts (largest remainder); a Feistel permutation of
the block's slots decides which slot draws from which component. Component `c`'s draws are
numbered consecutively across blocks, so the `i`-th draw is sequence `i` of that component
(epochs included) and the proportions hold exactly in every block, whatever the scale.

Global row `g` is a pure function of (components, weights, batch sizes, seed, g): `batch(step)`
reads the rows of a step, `sequences(indices)` any rows, which is what a trainer with a
batch-size schedule needs (step `s` starts at the row after every row of the steps before it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from meltemi.data._dataset import PackedDataset, Piece, batch_rows
from meltemi.data.permutation import FeistelPermutation, derive_seed

__all__ = ["DatasetExhausted", "MixtureDataset", "exact_counts"]


class DatasetExhausted(IndexError):
    """A step beyond the end of a mixture with a stopping strategy."""


def exact_counts(weights: Sequence[float], total: int) -> np.ndarray:
    """Integer counts summing to `total`, proportional to `weights` (largest remainder).

    >>> exact_counts([0.5, 0.3, 0.2], 7).tolist()
    [4, 2, 1]
    """
    w = np.asarray(weights, np.float64)
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


class MixtureDataset:
    """Draws rows from several `PackedDataset`s by weight, with exact counts per block.

    Args:
        components: name -> dataset; all must share `seq_len`.
        weights: name -> weight, or stages `[(start_step, {name: weight}), ...]` (the first
            stage starts at step 0; from `start_step` on, that stage's weights apply).
        batch_size: global rows per step, or a schedule `[(start_step, size), ...]` (first at
            step 0): each step's rows follow every row of the steps before it.
        seed: fixes which slot of each block draws from which component.
        block_size: rows per block; must divide every batch size (default: their gcd).
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
        >>> sorted(mix.sequences(range(16, 24))["component"].tolist())
        [0, 0, 0, 0, 0, 0, 1, 1]
    """

    def __init__(
        self,
        components: Mapping[str, PackedDataset],
        weights: Mapping[str, float] | Sequence[tuple[int, Mapping[str, float]]],
        *,
        batch_size: int | Sequence[tuple[int, int]],
        seed: int = 0,
        block_size: int | None = None,
        stop: str = "restart",
    ):
        if not components:
            raise ValueError("MixtureDataset(components={}): pass at least one component")
        self.names = list(components)
        self.components = dict(components)
        lens = {n: c.seq_len for n, c in self.components.items()}
        if len(set(lens.values())) != 1:
            raise ValueError(f"MixtureDataset: components disagree on seq_len: {lens}")
        self.seq_len = next(iter(lens.values()))
        self.batch_segments = _batch_segments(batch_size)
        sizes = [n for _, n in self.batch_segments]
        #: The batch size when it is constant, else None (see `batch_size_at`).
        self.batch_size = sizes[0] if len(set(sizes)) == 1 else None
        self.block_size = math.gcd(*sizes) if block_size is None else block_size
        for start, size in self.batch_segments:
            if self.block_size < 1 or size % self.block_size:
                where = f" (from step {start})" if len(sizes) > 1 else ""
                raise ValueError(
                    f"MixtureDataset(block_size={block_size}): must divide batch_size={size}"
                    f"{where}; use a divisor of every batch size, e.g. "
                    f"block_size={math.gcd(*sizes)}"
                )
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
        self._stage_blocks, self._stage_counts = self._parse_stages(stages)
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

    # -- stages and blocks ----------------------------------------------------------------------

    def _parse_stages(self, stages) -> tuple[np.ndarray, np.ndarray]:
        if not stages or stages[0][0] != 0:
            raise ValueError(
                f"MixtureDataset(weights=...): the first stage must start at step 0, got "
                f"{[s for s, _ in stages]}; e.g. [(0, {{'a': 0.7, 'b': 0.3}}), (1000, ...)]"
            )
        blocks, counts = [], []
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
            vec = [float(w.get(n, 0.0)) for n in self.names]
            if any(v < 0 for v in vec) or sum(vec) <= 0:
                raise ValueError(
                    f"MixtureDataset: weights {dict(w)} at step {start} must be >= 0 with a "
                    f"positive sum"
                )
            # Every batch size is a multiple of block_size, so a step starts on a block.
            blocks.append(self.rows_before(start) // self.block_size)
            counts.append(exact_counts(vec, self.block_size))
        return np.asarray(blocks, np.int64), np.asarray(counts, np.int64)

    def _cumulative_at_stages(self) -> np.ndarray:
        cum = np.zeros((len(self._stage_blocks), len(self.names)), np.int64)
        for k in range(1, len(self._stage_blocks)):
            span = self._stage_blocks[k] - self._stage_blocks[k - 1]
            cum[k] = cum[k - 1] + span * self._stage_counts[k - 1]
        return cum

    def _stage_of(self, block: np.ndarray) -> np.ndarray:
        return np.searchsorted(self._stage_blocks, block, side="right") - 1

    def _cumulative(self, block: np.ndarray) -> np.ndarray:
        """Draws per component in blocks [0, block): shape (len(block), components)."""
        block = np.asarray(block, np.int64)
        k = self._stage_of(block)
        span = (block - self._stage_blocks[k])[:, None]
        return self._cum_at_stage[k] + span * self._stage_counts[k]

    def _block_of_draw(self, c: int, i: int) -> int:
        """The block in which component c makes its i-th draw (or -1 if it never does)."""
        stages = len(self._stage_blocks)
        for k in range(stages):
            n = int(self._stage_counts[k, c])
            lo = int(self._cum_at_stage[k, c])
            end_block = self._stage_blocks[k + 1] if k + 1 < stages else None
            if n == 0:
                continue
            j = int(self._stage_blocks[k]) + (i - lo) // n
            if i >= lo and (end_block is None or j < end_block):
                return j
        return -1

    def _compute_num_steps(self) -> int | None:
        if self.stop == "restart":
            return None
        ends = []
        for c, name in enumerate(self.names):
            q = self.components[name].num_sequences
            # first_exhausted: the block that would make draw q (a repeat); all: draw q - 1.
            j = self._block_of_draw(c, q if self.stop == "first_exhausted" else q - 1)
            if j < 0:
                if self.stop == "all_exhausted":
                    raise ValueError(
                        f"MixtureDataset(stop='all_exhausted'): component {name!r} gets weight "
                        f"0 from some stage on and is never exhausted; use stop='restart'"
                    )
                continue
            ends.append(j)
        if not ends:
            return None
        if self.stop == "first_exhausted":  # end before the step holding the first repeat
            return self.step_of_row(min(ends) * self.block_size)[0]
        return self.step_of_row((max(ends) + 1) * self.block_size - 1)[0] + 1

    def _assign(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(component index, component draw index) of each global row."""
        blocks, slots = np.divmod(rows, self.block_size)
        comp = np.empty_like(rows)
        draw = np.empty_like(rows)
        for j in np.unique(blocks).tolist():
            sel = blocks == j
            counts = self._stage_counts[self._stage_of(np.asarray([j]))[0]]
            starts = np.concatenate([[0], np.cumsum(counts)])
            perm = FeistelPermutation(self.block_size, derive_seed(self.seed, 2, j))
            p = perm(slots[sel])
            c = np.searchsorted(starts, p, side="right") - 1
            comp[sel] = c
            draw[sel] = self._cumulative(np.asarray([j]))[0][c] + (p - starts[c])
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
        draw_limit = int(self._cumulative(np.asarray([-(-limit // self.block_size)]))[0][c])
        draws = self.components[component].sequence_indices_of(document, draw_limit)
        found = []
        for i in draws.tolist():
            j = self._block_of_draw(c, i)
            counts = self._stage_counts[self._stage_of(np.asarray([j]))[0]]
            start_c = int(np.sum(counts[:c]))
            p = start_c + i - int(self._cumulative(np.asarray([j]))[0][c])
            perm = FeistelPermutation(self.block_size, derive_seed(self.seed, 2, j))
            g = j * self.block_size + int(perm.inverse(p))
            if g < limit:
                found.append(g)
        return np.asarray(sorted(found), np.int64)

    def steps_of(self, component: str, document: int, *, max_step: int) -> list[tuple[int, int]]:
        """Every (step, row) before `max_step` that used `document` of `component`."""
        rows = self.sequence_indices_of(component, document, self.rows_before(int(max_step)))
        return [self.step_of_row(int(g)) for g in rows]
