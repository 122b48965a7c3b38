"""Bits per byte need bytes: the UTF-8 bytes the evaluated (loss) tokens encode."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from meltemi import data as md

_REPLACEMENT = "\ufffd"


def _prefix_bytes(tokenizer: Any, ids: np.ndarray) -> int:
    """UTF-8 bytes of the text `ids` decode to, without incomplete characters at either end
    (a row may start or end inside a multi-byte character: those pieces decode to U+FFFD)."""
    text = tokenizer.decode(ids).strip(_REPLACEMENT)
    return len(text.encode("utf-8", errors="surrogatepass"))


def span_bytes(tokens: np.ndarray, targets: np.ndarray, loss_mask: np.ndarray, tokenizer) -> int:
    """UTF-8 bytes of the text the loss tokens of one row encode, span by span.

    Each maximal run of loss-masked targets is one span. With the byte tokenizer every byte
    token is one byte (exact, also for characters split across rows). Otherwise a span's bytes
    are the growth of the decoded row prefix over the span, `bytes(decode(row[:end])) -
    bytes(decode(row[:start]))` with the row `tokens[0], targets...`: a character split
    between two spans of a row counts once (where it completes), a SentencePiece word's
    leading space counts with its token, special tokens (eos) count zero, and only the pieces
    of a character cut by the row's own start or end (at most 3 bytes each) are not counted.

    Args:
        tokens: the row's inputs (`targets` shifted right by one).
        targets: the row's next-token targets.
        loss_mask: 1 where the target counts.
        tokenizer: a `meltemi.data.Tokenizer` (anything with `decode(ids) -> str`).
    """
    tokens, targets = np.asarray(tokens), np.asarray(targets)
    mask = np.asarray(loss_mask) > 0
    if not mask.any():
        return 0
    if isinstance(tokenizer, md.ByteTokenizer):
        return int(np.count_nonzero(mask & (targets < 256)))
    row = np.concatenate([tokens[:1], targets])
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    total = 0
    for s, e in zip(starts, ends, strict=True):  # targets[s:e] are row[s + 1 : e + 1]
        total += _prefix_bytes(tokenizer, row[: e + 1]) - _prefix_bytes(tokenizer, row[: s + 1])
    return max(total, 0)


def batch_bytes(batch: Mapping[str, np.ndarray], tokenizer) -> int:
    """UTF-8 bytes the loss tokens of a host batch encode (`span_bytes` of every row)."""
    return sum(
        span_bytes(t, g, m, tokenizer)
        for t, g, m in zip(batch["tokens"], batch["targets"], batch["loss_mask"], strict=True)
    )
