"""Mixtures of packed datasets with exact per-block counts and weight stages.

Rows are grouped in blocks of `block_size` (default: one block per batch). Block `j` uses the
weights of the stage active at its first step, turned into exact integer counts (largest
remainder); a Feistel permutation of the block's slots decides which slot draws from which
component. Component `c`'s draws are numbered consecutively across blocks, so the `i`-th draw
is sequence `i` of that component (epochs included) and the proportions hold exactly in every
block, whatever the scale.
"""

from __future__ import annotations

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


class MixtureDataset:
    """Draws rows from several `PackedDataset`s by weight, with exact counts per block.

    Args:
        components: name -> dataset; all must share `seq_len`.
        weights: name -> weight, or stages `[(start_step, {name: weight}), ...]` (the first
            stage starts at step 0; from `start_step` on, that stage's weights apply).
        batch_size: global rows per step.
        seed: fixes which slot of each block draws from which component.
        block_size: rows per block; must divide `batch_size` (default: `batch_size`).
        stop: "restart" (components cycle through epochs forever), "first_exhausted" (end
            before any component repeats a sequence) or "all_exhausted" (end once every
            component has been seen whole; earlier finishers restart).
    """

    def __init__(
        self,
        components: Mapping[str, PackedDataset],
        weights: Mapping[str, float] | Sequence[tuple[int, Mapping[str, float]]],
        *,
        batch_size: int,
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
        self.batch_size = batch_size
        self.block_size = batch_size if block_size is None else block_size
        if self.block_size < 1 or batch_size % self.block_size:
            raise ValueError(
                f"MixtureDataset(block_size={block_size}): must divide batch_size={batch_size}"
            )
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
            blocks.append(start * self.batch_size // self.block_size)
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
        if self.stop == "first_exhausted":
            return min(ends) * self.block_size // self.batch_size
        return -(-(max(ends) + 1) * self.block_size // self.batch_size)

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

    def _check_step(self, step: int) -> None:
        if self.num_steps is not None and step >= self.num_steps:
            raise DatasetExhausted(
                f"step {step} is past the end of this mixture (stop={self.stop!r}, "
                f"num_steps={self.num_steps}); use stop='restart' to cycle forever"
            )

    def batch(self, step: int, process_index: int = 0, process_count: int = 1) -> dict:
        """The rows of `step` owned by `process_index`, plus `component` (int32 per row)."""
        rows = batch_rows(self.batch_size, step, process_index, process_count)
        self._check_step(int(step))
        comp, draw = self._assign(rows)
        out = None
        for c in np.unique(comp).tolist():
            sel = comp == c
            part = self.components[self.names[c]].sequences(draw[sel])
            if out is None:
                out = {k: np.empty((len(rows), *v.shape[1:]), v.dtype) for k, v in part.items()}
            for k, v in part.items():
                out[k][sel] = v
        out["component"] = comp.astype(np.int32)
        return out

    def locate(self, step: int, row: int) -> list[Piece]:
        """The (component, document, token offset, ...) pieces of one row of one step."""
        if not 0 <= row < self.batch_size:
            raise IndexError(f"row {row} outside the batch of {self.batch_size} rows")
        comp, draw = self._assign(np.asarray([int(step) * self.batch_size + int(row)]))
        name = self.names[int(comp[0])]
        pieces = self.components[name].locate_sequence(int(draw[0]))
        return [p._replace(component=name) for p in pieces]

    def steps_of(self, component: str, document: int, *, max_step: int) -> list[tuple[int, int]]:
        """Every (step, row) before `max_step` that used `document` of `component`."""
        if component not in self.components:
            raise KeyError(f"unknown component {component!r}; components are {self.names}")
        c = self.names.index(component)
        end_rows = int(max_step) * self.batch_size
        limit = int(self._cumulative(np.asarray([-(-end_rows // self.block_size)]))[0][c])
        draws = self.components[component].sequence_indices_of(document, limit)
        found = []
        for i in draws.tolist():
            j = self._block_of_draw(c, i)
            counts = self._stage_counts[self._stage_of(np.asarray([j]))[0]]
            start_c = int(np.sum(counts[:c]))
            p = start_c + i - int(self._cumulative(np.asarray([j]))[0][c])
            perm = FeistelPermutation(self.block_size, derive_seed(self.seed, 2, j))
            g = j * self.block_size + int(perm.inverse(p))
            if g < end_rows:
                found.append((g // self.batch_size, g % self.batch_size))
        return sorted(found)
