"""Packed language-model datasets with a stateless, step-indexed API.

A `PackedDataset` turns a `TokenStore` into fixed-length sequences:

* documents are put in a Feistel order (`seed`), then packed: `mode="stream"` concatenates
  them and cuts every `seq_len` tokens; `mode="document"` never splits a document shorter than
  `seq_len` (longer ones are cut into `seq_len` pieces) and pads the rest, packing next-fit in
  document order or first-fit-decreasing within windows of documents (`_packing.py`);
* the packed sequences are visited in a fresh Feistel order each epoch;
* global row `g = step * batch_size + r` is sequence `g % Q` of epoch `g // Q` (Q sequences per
  epoch). A batch is therefore a pure function of (store, config, seed, step), whatever the
  number of processes asking for its rows; there is no iterator state to checkpoint.

On a chat store (`TokenStore.has_loss_mask`) only `mode="document"` is allowed and a
conversation is never split: one longer than `seq_len` is dropped or truncated at a turn end
(`overlong`), and `loss_mask` comes from the stored per-token mask.

On a preference store (`TokenStore.is_preference`) each pair is packed whole into one row and
split there into two segments, chosen then rejected; batches also carry `pair_ids` and
`is_chosen`. A pair longer than `seq_len` is dropped and counted (`overlong["dropped"]`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from meltemi.data._packing import (
    OVERLONG,
    conversation_weights,
    fit_conversations,
    pack_ffd,
    pack_next_fit,
    padding_fraction,
)
from meltemi.data._store import TokenStore
from meltemi.data.permutation import FeistelPermutation, derive_seed

__all__ = [
    "LOSS_AVERAGES",
    "OVERLONG",
    "PACKINGS",
    "PackedDataset",
    "Piece",
    "batch_rows",
    "packing_options",
]

PACKINGS = ("stream", "whole_documents")
LOSS_AVERAGES = ("token", "conversation")


def packing_options(packing: str, *, field: str = "data.packing") -> dict:
    """`PackedDataset` keyword arguments of a packing name (a trainer's `data.packing`).

    `"stream"` concatenates documents and cuts every `seq_len` tokens (no padding);
    `"whole_documents"` never lets a document shorter than `seq_len` straddle two rows (longer
    ones are cut at `seq_len` boundaries) and packs first-fit-decreasing within windows of
    documents, padding the rest (`PackedDataset.padding_fraction` reports how much).

    >>> packing_options("whole_documents")
    {'mode': 'document', 'packing': 'ffd'}

    Raises:
        ValueError: an unknown name; the message names `field`.
    """
    if packing == "stream":
        return {"mode": "stream"}
    if packing == "whole_documents":
        return {"mode": "document", "packing": "ffd"}
    raise ValueError(
        f"{field}={packing!r}: use one of {list(PACKINGS)}, e.g. {field}='whole_documents'"
    )


class Piece(NamedTuple):
    """A run of one document's tokens inside a row.

    Attributes:
        component: the mixture component's name (None for a plain dataset).
        document: the document's index in its store.
        token_offset: where the run starts inside the document.
        length: tokens in the run.
        row_offset: where the run starts inside the row.
    """

    component: str | None
    document: int
    token_offset: int
    length: int
    row_offset: int


def batch_rows(batch_size: int, step: int, process_index: int, process_count: int) -> np.ndarray:
    """Global row indices (`step * batch_size + r`) of the rows one process owns.

    >>> batch_rows(6, 2, 1, 3).tolist()
    [14, 15]
    """
    for name, value in (("step", step), ("process_index", process_index)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    if not isinstance(process_count, int | np.integer) or process_count < 1:
        raise ValueError(f"process_count must be an int >= 1, got {process_count!r}")
    if process_index >= process_count:
        raise ValueError(f"process_index={process_index} must be < process_count={process_count}")
    if batch_size % process_count:
        raise ValueError(
            f"batch_size={batch_size} is not divisible by process_count={process_count}; "
            f"use a global batch size that is a multiple of the number of processes"
        )
    per = batch_size // process_count
    start = int(step) * batch_size + int(process_index) * per
    return np.arange(start, start + per, dtype=np.int64)


def assemble(
    row: np.ndarray,
    row_offset: np.ndarray,
    length: np.ndarray,
    tokens_flat: np.ndarray,
    rows: int,
    seq_len: int,
    pad_id: int,
    mask_flat: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Builds the batch arrays from pieces (`row`, `row_offset`, `length`, sorted by row then
    row offset) and their tokens, concatenated in piece order; `mask_flat` (the stored loss
    mask of those tokens, chat stores) keeps loss only where the target token has it."""
    tokens = np.full((rows, seq_len), pad_id, np.int32)
    segment_ids = np.zeros((rows, seq_len), np.int32)
    positions = np.zeros((rows, seq_len), np.int32)
    if len(length):
        first_of_row = np.searchsorted(row, row, side="left")  # first piece of each piece's row
        seg = (np.arange(len(row)) - first_of_row + 1).astype(np.int32)
        within = np.arange(len(tokens_flat)) - np.repeat(np.cumsum(length) - length, length)
        to = np.repeat(row * seq_len + row_offset, length) + within
        tokens.reshape(-1)[to] = tokens_flat
        segment_ids.reshape(-1)[to] = np.repeat(seg, length)
        positions.reshape(-1)[to] = within
    same = np.zeros((rows, seq_len), bool)
    same[:, :-1] = (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, :-1] > 0)
    targets = np.full((rows, seq_len), pad_id, np.int32)
    targets[:, :-1] = np.where(same[:, :-1], tokens[:, 1:], pad_id)
    loss_mask = same.astype(np.float32)
    if mask_flat is not None:  # position i predicts token i + 1: the target's own mask counts
        stored = np.zeros((rows, seq_len), np.float32)
        if len(length):
            stored.reshape(-1)[to] = mask_flat
        loss_mask[:, :-1] *= stored[:, 1:]
    return {
        "tokens": tokens,
        "targets": targets,
        "loss_mask": loss_mask,
        "segment_ids": segment_ids,
        "positions": positions,
    }


def split_pairs(
    row: np.ndarray,
    doc: np.ndarray,
    offset: np.ndarray,
    length: np.ndarray,
    row_offset: np.ndarray,
    chosen_length: np.ndarray,
) -> tuple[np.ndarray, ...]:
    """Pieces that are whole pairs, each cut into its chosen and its rejected conversation
    (two adjacent pieces of the same row, chosen first)."""
    c = np.asarray(chosen_length, np.int64)
    two = lambda a, b: np.stack([a, b], axis=1).reshape(-1)  # noqa: E731
    return (
        np.repeat(row, 2),
        np.repeat(doc, 2),
        two(offset, offset + c),
        two(c, length - c),
        two(row_offset, row_offset + c),
    )


def pair_arrays(segment_ids: np.ndarray) -> dict[str, np.ndarray]:
    """`pair_ids` (1, 2, ... per pair in a row, 0 on padding) and `is_chosen` (1 on the chosen
    conversation's tokens) of rows whose segments are chosen, rejected, chosen, ..."""
    seg = np.asarray(segment_ids, np.int32)
    return {
        "pair_ids": ((seg + 1) // 2).astype(np.int32),
        "is_chosen": ((seg % 2) == 1).astype(np.int32),
    }


class PackedDataset:
    """Fixed-length sequences packed from a `TokenStore`; `batch(step)` is stateless.

    Args:
        store: the token store.
        seq_len: tokens per row.
        batch_size: global rows per step (all processes together).
        seed: fixes the document order and every epoch's sequence order.
        mode: "stream" (concatenate and cut; no padding) or "document" (never split a
            document shorter than `seq_len`; pad).
        pad_id: filler token (default: the store's tokenizer pad id).
        packing: in document mode, "next_fit" (rows in document order; the default) or
            "ffd" (first-fit-decreasing within windows of `pack_window` documents: much less
            padding; `padding_fraction` reports it).
        pack_window: documents per first-fit-decreasing window.
        overlong: chat stores: a conversation longer than `seq_len` is "drop"ped or
            "truncate"d at its last turn end that fits (dropped if none fits); never cut
            mid-turn. `overlong` counts them: `{"dropped": n, "truncated": n}`.
        loss_average: chat stores: "token" (every trained token weighs 1) or "conversation"
            (`loss_mask` holds weights summing to 1 per conversation, so that
            `sum(loss * w) / sum(w)` is the mean of per-conversation mean losses).

    On a preference store each row holds whole pairs, each as two segments (chosen, then
    rejected: segment ids 1, 2 for the first pair, 3, 4 for the second, ...), and batches
    also carry `pair_ids` (int32, 1, 2, ... per pair in the row, 0 on padding) and
    `is_chosen` (int32, 1 on the chosen conversation); `loss_mask` covers the replies only.
    Pairs longer than `seq_len` are dropped (`overlong["dropped"]` counts them).

    Each batch is a dict of numpy arrays of shape (rows, seq_len): `tokens`, `targets` (the next
    token in the same document piece, else pad), `loss_mask` (float32, 1 where `targets` is
    real; on a chat store, also only where the target token carries loss), `segment_ids`
    (1, 2, ... per piece, 0 on padding) and `positions` (within a piece).
    """

    def __init__(
        self,
        store: TokenStore,
        *,
        seq_len: int,
        batch_size: int,
        seed: int = 0,
        mode: str = "stream",
        pad_id: int | None = None,
        packing: str = "next_fit",
        pack_window: int = 1024,
        overlong: str = "drop",
        loss_average: str = "token",
    ):
        self._check_chat_options(store, mode, overlong, loss_average)
        if mode not in ("stream", "document"):
            raise ValueError(f"PackedDataset(mode={mode!r}): use 'stream' or 'document'")
        if packing not in ("next_fit", "ffd"):
            raise ValueError(f"PackedDataset(packing={packing!r}): use 'next_fit' or 'ffd'")
        for name, value in (("seq_len", seq_len), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PackedDataset({name}={value!r}): need an int >= 1")
        if store.num_documents == 0:
            raise ValueError(f"PackedDataset: the store at {store.path} has no documents")
        self.store = store
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.mode = mode
        self.packing = packing
        self.pack_window = pack_window
        self.overlong_policy = overlong
        self.loss_average = loss_average
        #: Conversations longer than `seq_len` (chat stores), one epoch: dropped / truncated.
        self.overlong = {"dropped": 0, "truncated": 0}
        self.pad_id = int(store.metadata["tokenizer"]["pad_id"] if pad_id is None else pad_id)
        self.document_order = FeistelPermutation(store.num_documents, derive_seed(seed, 0))
        self._order = self.document_order(np.arange(store.num_documents))  # doc at position p
        lengths = store.document_lengths[self._order]
        if mode == "stream":
            self._cum_end = np.cumsum(lengths)
            total = int(self._cum_end[-1])
            if total < seq_len:
                raise ValueError(
                    f"PackedDataset(seq_len={seq_len}): the store holds only {total} tokens; "
                    f"use a shorter seq_len or mode='document'"
                )
            self.num_sequences = total // seq_len
            self._lengths_in_order = lengths
        else:
            if store.has_loss_mask:  # whole conversations (or pairs): every length <= seq_len
                order = self._order
                lengths, self.overlong = fit_conversations(
                    lengths, lambda p: store.turn_ends(int(order[p])), seq_len, overlong
                )
                if not lengths.any():
                    what = "pair" if store.is_preference else "conversation"
                    raise ValueError(
                        f"PackedDataset(seq_len={seq_len}, overlong={overlong!r}): every "
                        f"{what} of the store at {store.path} is longer than seq_len "
                        f"and was dropped; use a longer seq_len"
                        + (
                            " or overlong='truncate'"
                            if overlong == "drop" and not store.is_preference
                            else ""
                        )
                    )
            if packing == "ffd":
                self._plan = pack_ffd(lengths, seq_len, pack_window)
            else:
                self._plan = pack_next_fit(lengths, seq_len)
            self.num_sequences = self._plan.num_sequences
            self._pieces_by_pos: np.ndarray | None = None
        self._epoch_perms: dict[int, FeistelPermutation] = {}

    @staticmethod
    def _check_chat_options(store: TokenStore, mode: str, overlong: str, loss_average: str) -> None:
        """Chat-only options, and the packing a chat store needs, checked with their fix."""
        if overlong not in OVERLONG:
            raise ValueError(
                f"PackedDataset(overlong={overlong!r}): use one of {list(OVERLONG)} (what "
                f"happens to a conversation longer than seq_len)"
            )
        if loss_average not in LOSS_AVERAGES:
            raise ValueError(
                f"PackedDataset(loss_average={loss_average!r}): use one of {list(LOSS_AVERAGES)}"
            )
        if store.has_loss_mask and mode != "document":
            raise ValueError(
                f"PackedDataset(mode={mode!r}): the store at {store.path} holds conversations, "
                f"which are packed whole; use mode='document' (e.g. packing='ffd')"
            )
        if store.is_preference and overlong != "drop":
            raise ValueError(
                f"PackedDataset(overlong={overlong!r}): the store at {store.path} holds "
                f"preference pairs, which are never truncated (a pair without its rejected "
                f"reply is no pair); use overlong='drop' (dropped pairs are counted)"
            )
        if store.is_preference and loss_average != "token":
            raise ValueError(
                f"PackedDataset(loss_average={loss_average!r}): the store at {store.path} "
                f"holds preference pairs, whose losses sum per reply; use loss_average='token'"
            )
        if loss_average == "conversation" and not store.has_loss_mask:
            raise ValueError(
                f"PackedDataset(loss_average='conversation'): the store at {store.path} is a "
                f"text store (no conversations); use loss_average='token'"
            )

    def __repr__(self) -> str:
        return (
            f"PackedDataset({self.store!r}, seq_len={self.seq_len}, batch_size={self.batch_size}, "
            f"seed={self.seed}, mode={self.mode!r})"
        )

    @property
    def steps_per_epoch(self) -> int:
        """Full steps before the first sequence repeats."""
        return self.num_sequences // self.batch_size

    def _epoch_perm(self, epoch: int) -> FeistelPermutation:
        if epoch not in self._epoch_perms:
            if len(self._epoch_perms) > 8:
                self._epoch_perms.clear()
            self._epoch_perms[epoch] = FeistelPermutation(
                self.num_sequences, derive_seed(self.seed, 1, epoch)
            )
        return self._epoch_perms[epoch]

    def _packed_of(self, indices: np.ndarray) -> np.ndarray:
        """Packed sequence ids of global sequence indices (epoch-wise shuffled)."""
        epochs, within = np.divmod(indices, self.num_sequences)
        out = np.empty_like(indices)
        for e in np.unique(epochs).tolist():
            sel = epochs == e
            out[sel] = self._epoch_perm(e)(within[sel])
        return out

    @property
    def padding_fraction(self) -> float:
        """The share of row tokens that are padding in one epoch (0 in stream mode)."""
        return 0.0 if self.mode == "stream" else padding_fraction(self._plan, self.seq_len)

    def _piece_arrays(self, packed: np.ndarray) -> tuple[np.ndarray, ...]:
        """(row, document, token offset, length, row offset) of every piece of the packed
        sequences `packed` (row i is `packed[i]`), sorted by row then row offset."""
        packed = np.asarray(packed, np.int64)
        if self.mode == "stream":
            start = packed * self.seq_len
            first = np.searchsorted(self._cum_end, start, side="right")
            last = np.searchsorted(self._cum_end, start + self.seq_len - 1, side="right")
            count = last - first + 1
            row = np.repeat(np.arange(len(packed)), count)
            pos = np.repeat(first - (np.cumsum(count) - count), count) + np.arange(len(row))
            doc_end = self._cum_end[pos]
            doc_start = doc_end - self._lengths_in_order[pos]
            row_start = start[row]
            lo = np.maximum(row_start, doc_start)
            hi = np.minimum(row_start + self.seq_len, doc_end)
            keep = hi > lo  # empty documents leave no piece
            row, pos, lo, hi, row_start = row[keep], pos[keep], lo[keep], hi[keep], row_start[keep]
            return row, self._order[pos], lo - doc_start[keep], hi - lo, lo - row_start
        plan = self._plan
        count = plan.seq_start[packed + 1] - plan.seq_start[packed]
        row = np.repeat(np.arange(len(packed)), count)
        k = np.repeat(plan.seq_start[packed] - (np.cumsum(count) - count), count)
        k = k + np.arange(len(row))
        return row, self._order[plan.pos[k]], plan.offset[k], plan.length[k], plan.row_offset[k]

    def _pieces(self, q: int) -> list[Piece]:
        _, doc, offset, length, row_offset = self._piece_arrays(np.asarray([q]))
        return [
            Piece(None, int(d), int(o), int(n), int(r))
            for d, o, n, r in zip(doc, offset, length, row_offset, strict=True)
        ]

    def locate_sequence(self, index: int) -> list[Piece]:
        """The pieces of global sequence `index` (epochs included)."""
        if index < 0:
            raise ValueError(f"sequence index must be >= 0, got {index}")
        return self._pieces(int(self._packed_of(np.asarray([index]))[0]))

    def sequences(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """The rows of global sequence indices (epochs included)."""
        indices = np.asarray(indices, np.int64).reshape(-1)
        row, doc, offset, length, row_offset = self._piece_arrays(self._packed_of(indices))
        flat = self.store.read_flat(doc, offset, offset + length)
        if not self.store.has_loss_mask:
            return assemble(row, row_offset, length, flat, len(indices), self.seq_len, self.pad_id)
        if self.store.is_preference:  # each pair piece becomes its two conversations
            row, doc, offset, length, row_offset = split_pairs(
                row, doc, offset, length, row_offset, self.store.pair_splits(doc)
            )
        masks = self.store.read_mask_flat(doc, offset, offset + length)
        out = assemble(
            row, row_offset, length, flat, len(indices), self.seq_len, self.pad_id, masks
        )
        if self.store.is_preference:
            out.update(pair_arrays(out["segment_ids"]))
        if self.loss_average == "conversation":
            out["loss_mask"] = conversation_weights(out["loss_mask"], out["segment_ids"])
        return out

    def batch(self, step: int, process_index: int = 0, process_count: int = 1) -> dict:
        """The rows of `step` owned by `process_index` (of `process_count`); see class doc."""
        return self.sequences(batch_rows(self.batch_size, step, process_index, process_count))

    def locate(self, step: int, row: int) -> list[Piece]:
        """Which documents (and token ranges) make up row `row` of the global batch of `step`."""
        if not 0 <= row < self.batch_size:
            raise IndexError(f"row {row} outside the batch of {self.batch_size} rows")
        return self.locate_sequence(int(step) * self.batch_size + int(row))

    def sequence_indices_of(self, document: int, limit: int) -> np.ndarray:
        """Sorted global sequence indices `< limit` whose rows contain `document`."""
        d = int(document)
        if not 0 <= d < self.store.num_documents:
            raise IndexError(
                f"document {d} outside the store's {self.store.num_documents} documents"
            )
        p = int(self.document_order.inverse(d))
        if self.mode == "stream":
            end = int(self._cum_end[p])
            start = end - int(self.store.document_lengths[d])
            packed = np.arange(start // self.seq_len, (end - 1) // self.seq_len + 1)
            packed = packed[packed < self.num_sequences]
        else:
            if self._pieces_by_pos is None:
                self._pieces_by_pos = np.argsort(self._plan.pos, kind="stable")
            pos_sorted = self._plan.pos[self._pieces_by_pos]
            lo, hi = np.searchsorted(pos_sorted, [p, p + 1])
            pieces = self._pieces_by_pos[lo:hi]
            packed = np.unique(np.searchsorted(self._plan.seq_start, pieces, side="right") - 1)
        out = []
        q = self.num_sequences
        for e in range(-(-int(limit) // q)):
            idx = e * q + self._epoch_perm(e).inverse(packed)
            out.append(idx[idx < limit])
        return np.sort(np.concatenate(out)) if out else np.zeros(0, np.int64)

    def steps_of(self, document: int, *, max_step: int) -> list[tuple[int, int]]:
        """Every (step, row) before `max_step` whose row contains `document` (via inverses)."""
        idx = self.sequence_indices_of(document, int(max_step) * self.batch_size)
        return [(int(i) // self.batch_size, int(i) % self.batch_size) for i in idx]
