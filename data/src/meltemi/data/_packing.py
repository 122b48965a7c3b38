"""Whole-document packing, vectorised: next-fit in document order, or first-fit-decreasing
within windows of consecutive documents.

Both cut only documents of at least `seq_len` tokens (into `seq_len`-token pieces plus the
rest), so every piece fits a row; a plan lists the pieces of each packed sequence.

Conversations (chat stores) are never cut: `fit_conversations` first drops each one longer
than a row, or truncates it at its last turn end that fits, so every length is at most
`seq_len` and the packers place each conversation whole in one row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

__all__ = [
    "OVERLONG",
    "DocumentPlan",
    "conversation_weights",
    "fit_conversations",
    "pack_ffd",
    "pack_next_fit",
    "padding_fraction",
]

OVERLONG = ("drop", "truncate")


@dataclasses.dataclass(frozen=True)
class DocumentPlan:
    """Piece arrays and each sequence's slice of them.

    Attributes:
        pos: position of the piece's document in the document order.
        offset: token offset of the piece inside its document.
        length: tokens in the piece.
        row_offset: where the piece starts inside its row.
        seq_start: pieces of sequence q are `[seq_start[q], seq_start[q + 1])`.
    """

    pos: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    row_offset: np.ndarray
    seq_start: np.ndarray

    @property
    def num_sequences(self) -> int:
        return len(self.seq_start) - 1


def _items(lengths: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(document position, token offset, length) of every piece, in document order."""
    lengths = np.asarray(lengths, np.int64)
    if len(lengths) and 0 < lengths.min() and lengths.max() < seq_len:  # nothing to cut
        return np.arange(len(lengths), dtype=np.int64), np.zeros(len(lengths), np.int64), lengths
    full, rest = np.divmod(lengths, seq_len)
    count = full + (rest > 0)
    pos = np.repeat(np.arange(len(lengths), dtype=np.int64), count)
    first = np.cumsum(count) - count
    k = np.arange(len(pos), dtype=np.int64) - first[pos]  # piece index inside its document
    length = np.where(k < full[pos], seq_len, rest[pos])
    return pos, k * seq_len, length


def pack_next_fit(lengths: np.ndarray, seq_len: int) -> DocumentPlan:
    """Pieces in document order; a new row starts when the next piece does not fit.

    >>> plan = pack_next_fit(np.array([3, 4, 9, 2]), 8)
    >>> plan.length.tolist(), plan.row_offset.tolist(), plan.seq_start.tolist()
    ([3, 4, 8, 1, 2], [0, 3, 0, 0, 1], [0, 2, 3, 5])
    """
    pos, offset, length = _items(lengths, seq_len)
    n = len(length)
    cum = np.concatenate([[0], np.cumsum(length)])
    # A row starting at piece i holds pieces [i, nxt[i]): every piece fits, so nxt[i] > i.
    nxt = (np.searchsorted(cum, cum[:-1] + seq_len, side="right") - 1).tolist()
    starts = []
    i = 0
    while i < n:  # one step per row, not per document
        starts.append(i)
        i = nxt[i]
    starts_arr = np.asarray(starts, np.int64)
    row = np.searchsorted(starts_arr, np.arange(n), side="right") - 1
    row_offset = cum[:-1] - cum[starts_arr][row]
    return DocumentPlan(pos, offset, length, row_offset, np.append(starts_arr, n))


def pack_ffd(lengths: np.ndarray, seq_len: int, window: int) -> DocumentPlan:
    """First-fit-decreasing inside each window of `window` consecutive documents.

    Inside a window, pieces are taken longest first (ties: document order) and each goes into
    the first row of the window with room, or a new row. Rows are numbered window by window.
    Deterministic; all windows are packed at once, one vectorised step per piece rank.

    >>> plan = pack_ffd(np.array([3, 4, 5, 2]), 8, window=4)
    >>> plan.seq_start.tolist(), plan.length.tolist(), plan.row_offset.tolist()
    ([0, 2, 4], [5, 3, 4, 2], [0, 5, 0, 4])
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"pack_ffd(window={window!r}): need an int >= 1, e.g. window=512")
    pos, offset, length = _items(lengths, seq_len)
    n = len(length)
    if n == 0:
        return DocumentPlan(pos, offset, length, np.zeros(0, np.int64), np.zeros(1, np.int64))
    win = pos // window  # non-decreasing: pieces are in document order
    num_windows = int(win[-1]) + 1
    # A full piece (seq_len tokens) is the longest there is: first-fit-decreasing gives each a
    # new row of its own, in document order, before any shorter piece, and no shorter piece
    # fits there. So full pieces take rows 0..F-1 of their window directly, and only the
    # shorter ones (at most one per document) go through the search.
    full = length == seq_len
    full_rows = np.bincount(win[full], minlength=num_windows)
    idx_full = np.flatnonzero(full)
    row_of = np.empty(n, np.int64)
    at = np.zeros(n, np.int64)
    row_of[idx_full] = np.arange(len(idx_full)) - (np.cumsum(full_rows) - full_rows)[win[idx_full]]
    part = np.flatnonzero(~full)
    part_row, part_at, part_rows = _first_fit_decreasing(
        win[part], length[part], seq_len, num_windows
    )
    row_of[part] = full_rows[win[part]] + part_row
    at[part] = part_at
    rows_per_window = full_rows + part_rows
    seq = (np.cumsum(rows_per_window) - rows_per_window)[win] + row_of
    final = np.argsort(seq * (seq_len + 1) + at)  # by row, then place in the row (unique)
    seq_start = np.searchsorted(seq[final], np.arange(int(rows_per_window.sum()) + 1))
    return DocumentPlan(pos[final], offset[final], length[final], at[final], seq_start)


def _first_fit_decreasing(
    win: np.ndarray, length: np.ndarray, seq_len: int, num_windows: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row inside its window, start inside the row) of each piece, and rows per window.

    Inside a window, pieces are taken longest first (ties: the given order) and each goes into
    the first row with room, or a new row; one vectorised step per piece rank, all windows
    together.
    """
    n = len(length)
    rows_open = np.zeros(num_windows, np.int64)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), rows_open
    # By window, longest first; a stable sort keeps the given order among equal lengths.
    order = np.argsort(win * (seq_len + 1) + (seq_len - length), kind="stable")
    w_sorted = win[order]
    per_window = np.bincount(w_sorted, minlength=num_windows)
    rank = np.arange(n) - (np.cumsum(per_window) - per_window)[w_sorted]
    ranks = int(per_window.max())
    # sizes[r, w]: the r-th longest piece of window w (seq_len + 1, which fits nowhere, if none).
    sizes = np.full((ranks, num_windows), seq_len + 1, np.int64)
    sizes[rank, w_sorted] = length[order]
    rem = np.zeros((num_windows, ranks), np.int64)  # room left in each row of each window
    rows = np.empty((ranks, num_windows), np.int64)
    starts = np.empty((ranks, num_windows), np.int64)
    every = np.arange(num_windows)
    for r in range(ranks):
        size = sizes[r]
        width = max(1, int(rows_open.max()))  # rows not open yet have no room: never fit
        fits = rem[:, :width] >= size[:, None]
        has = fits.any(axis=1)
        row = np.where(has, fits.argmax(axis=1), rows_open)
        fresh = np.flatnonzero(~has & (size <= seq_len))
        rem[fresh, rows_open[fresh]] = seq_len
        rows_open[fresh] += 1
        left = rem[every, row]
        starts[r] = seq_len - left
        rem[every, row] = np.where(size <= seq_len, left - size, left)
        rows[r] = row
    row_of = np.empty(n, np.int64)
    at = np.empty(n, np.int64)
    row_of[order] = rows[rank, w_sorted]
    at[order] = starts[rank, w_sorted]
    return row_of, at, rows_open


def padding_fraction(plan: DocumentPlan, seq_len: int) -> float:
    """The share of row tokens that are padding."""
    rows = plan.num_sequences
    return 1.0 - float(plan.length.sum()) / (rows * seq_len) if rows else 0.0


def fit_conversations(
    lengths: np.ndarray,
    turn_ends: Callable[[int], np.ndarray],
    seq_len: int,
    overlong: str,
) -> tuple[np.ndarray, dict[str, int]]:
    """Lengths to pack so that no conversation is cut mid-turn, and what that cost.

    A conversation of at most `seq_len` tokens keeps its length. A longer one is dropped
    (length 0: no piece) with `overlong="drop"`; with `"truncate"` it keeps its tokens up to
    its last turn end `<= seq_len`, and is dropped when even its first turn does not fit.

    Args:
        lengths: tokens per conversation.
        turn_ends: `turn_ends(i)`, the offsets just after each assistant turn of conversation
            `i` (ascending); asked only of conversations longer than `seq_len`.
        seq_len: tokens per row.
        overlong: "drop" or "truncate".

    Returns:
        (new lengths, `{"dropped": n, "truncated": n}`).

    >>> ends = [np.array([3, 5]), np.array([4, 9]), np.array([10, 12])]
    >>> fit_conversations(np.array([5, 9, 12]), ends.__getitem__, 8, "truncate")
    (array([5, 4, 0]), {'dropped': 1, 'truncated': 1})
    """
    if overlong not in OVERLONG:
        raise ValueError(f"overlong={overlong!r}: use one of {list(OVERLONG)}")
    out = np.asarray(lengths, np.int64).copy()
    over = np.flatnonzero(out > seq_len)
    truncated = 0
    for i in over.tolist():
        ends = np.asarray(turn_ends(i), np.int64)
        fit = ends[ends <= seq_len]
        if overlong == "truncate" and len(fit):
            out[i] = fit[-1]
            truncated += 1
        else:
            out[i] = 0
    return out, {"dropped": len(over) - truncated, "truncated": truncated}


def conversation_weights(loss_mask: np.ndarray, segment_ids: np.ndarray) -> np.ndarray:
    """Rescales a (rows, seq_len) 0/1 loss mask so that each segment's weights sum to 1.

    With whole conversations as segments, `sum(loss * w) / sum(w)` is then the mean over
    conversations of each one's mean loss (a segment without trained tokens weighs nothing).
    """
    mask = np.asarray(loss_mask, np.float32)
    rows, seq_len = mask.shape
    key = (np.arange(rows, dtype=np.int64)[:, None] * (seq_len + 1) + segment_ids).reshape(-1)
    per = np.bincount(key, weights=mask.reshape(-1), minlength=rows * (seq_len + 1))
    denom = np.maximum(per[key], 1.0).reshape(rows, seq_len)
    return (mask / denom).astype(np.float32)
