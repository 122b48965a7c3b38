"""Plain-Python reference implementations, one item at a time, that the tests and
`//data:bench` compare the vectorised code against (never used by the library itself).

>>> pos, offset, length, row_offset, seq_start = next_fit_reference([3, 5], seq_len=4)
>>> pos, offset, length, row_offset, seq_start
([0, 1, 1], [0, 0, 4], [3, 4, 1], [0, 0, 0], [0, 1, 2, 3])
>>> quality_reason_reference("too short", QualityConfig())
'too_few_words'
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from meltemi.data.pipeline._quality import QualityConfig

__all__ = ["next_fit_reference", "quality_reason_reference"]


def next_fit_reference(lengths: Sequence[int], seq_len: int) -> tuple[list[int], ...]:
    """Next-fit packing piece by piece (the loop of the release before the vectorised
    `pack_next_fit`): (pos, offset, length, row_offset, seq_start) as lists."""
    pos, off, ln, row_off, seq_start = [], [], [], [], [0]
    fill = 0
    for p, total in enumerate(int(x) for x in lengths):
        start = 0
        while total - start >= seq_len:
            if fill:
                seq_start.append(len(pos))
                fill = 0
            pos.append(p), off.append(start), ln.append(seq_len), row_off.append(0)
            seq_start.append(len(pos))
            start += seq_len
        rest = total - start
        if rest == 0:
            continue
        if fill + rest > seq_len:
            seq_start.append(len(pos))
            fill = 0
        pos.append(p), off.append(start), ln.append(rest), row_off.append(fill)
        fill += rest
    if fill:
        seq_start.append(len(pos))
    return pos, off, ln, row_off, seq_start


_SYMBOLS = re.compile(r"#|\.\.\.|\u2026")
_ELLIPSIS = re.compile(r"(?:\.\.\.|\u2026)[ \t]*$", re.MULTILINE)
_BULLET = re.compile(r"^[ \t]*(?:\u2022|- |\* )", re.MULTILINE)
_ALPHA = re.compile(r"[^\W\d_]")


def quality_reason_reference(text: str, c: QualityConfig) -> str | None:
    """The Gopher rules on one document with `str.split` and `re` (the implementation
    before the vectorised `quality_reasons`): the first rule of `RULES` it fails, or None."""
    if not c.enabled:
        return None
    words = text.split()
    n = len(words)
    if n < c.min_words:
        return "too_few_words"
    if n > c.max_words:
        return "too_many_words"
    if not n or not c.min_mean_word_length <= len("".join(words)) / n <= c.max_mean_word_length:
        return "mean_word_length"
    if len(_SYMBOLS.findall(text)) / n > c.max_symbol_to_word_ratio:
        return "symbol_to_word_ratio"
    lines = [line for line in text.split("\n") if line.strip()]
    if len(_ELLIPSIS.findall(text)) / len(lines) > c.max_ellipsis_lines:
        return "ellipsis_lines"
    if len(_BULLET.findall(text)) / len(lines) > c.max_bullet_lines:
        return "bullet_lines"
    if sum(1 for w in words if _ALPHA.search(w)) / n < c.min_alphabetic_words:
        return "alphabetic_words"
    if 1 - len(set(lines)) / len(lines) > c.max_duplicate_lines:
        return "duplicate_lines"
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    if 1 - len(set(paragraphs)) / len(paragraphs) > c.max_duplicate_paragraphs:
        return "duplicate_paragraphs"
    return None
