"""Stage 4, quality filters: Gopher-style heuristics (Rae et al. 2021, appendix A), each with
its threshold in `QualityConfig`; a dropped document is counted under the first rule it fails
(in the order of `RULES`), so the per-rule counts add up to the documents dropped.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import unicodedata

import numpy as np

from meltemi.data._clean import IS_SPACE, SPACE_TABLE_TOP

__all__ = ["RULES", "QualityConfig", "QualityError", "quality_reason", "quality_reasons"]

RULES = (
    "too_few_words",
    "too_many_words",
    "mean_word_length",
    "symbol_to_word_ratio",
    "ellipsis_lines",
    "bullet_lines",
    "alphabetic_words",
    "duplicate_lines",
    "duplicate_paragraphs",
)

# RE2 patterns (pyarrow.compute), matched against each line of a batch.
_ELLIPSIS_LINE = r"(?:\.\.\.|\x{2026})[ \t]*$"
_BULLET_LINE = r"^[ \t]*(?:\x{2022}|- |\* )"


@functools.lru_cache(maxsize=1)
def _letters() -> np.ndarray:
    """Whether each code point of the BMP is a letter as Python's `[^\\W\\d_]` sees it:
    Unicode letters and the non-decimal numerics (Nl, No)."""
    cats = [unicodedata.category(chr(c)) for c in range(0x10000)]
    return np.asarray([c[0] == "L" or c in ("Nl", "No") for c in cats], bool)


def _code_points(arr) -> tuple[np.ndarray, np.ndarray]:
    """(code points, index of each document's first one) of a pyarrow string array: its
    UTF-8 buffer decoded in numpy (ASCII, the common case, is its own code points)."""
    _, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, np.int32)[arr.offset : arr.offset + len(arr) + 1]
    offsets = offsets.astype(np.int64)
    if data_buf is None or offsets[-1] == offsets[0]:
        return np.zeros(0, np.uint8), np.zeros(len(arr) + 1, np.int64)
    data = np.frombuffer(data_buf, np.uint8)[offsets[0] : offsets[-1]]
    offsets -= offsets[0]
    if int(data.max()) < 0x80:
        return data, offsets
    at = np.flatnonzero((data & 0xC0) != 0x80)  # the first byte of each character
    b = np.concatenate([data, np.zeros(3, np.uint8)]).astype(np.uint32)
    lead = b[at]
    cp = lead.copy()
    for size, low, high in ((2, 0xC0, 0xE0), (3, 0xE0, 0xF0), (4, 0xF0, 0x100)):
        sel = np.flatnonzero((lead >= low) & (lead < high))
        value = lead[sel] & (0x7F >> size)
        for k in range(1, size):
            value = (value << 6) | (b[at[sel] + k] & 0x3F)
        cp[sel] = value
    return cp, np.searchsorted(at, offsets)


def _doc_sums(flags: np.ndarray, starts: np.ndarray, n: int) -> np.ndarray:
    """Per document, how many of `flags` (bool, one per code point) are set: one
    `np.add.reduceat` over the documents that are not empty."""
    out = np.zeros(n)
    nonempty = np.flatnonzero(starts[1:] > starts[:-1])
    if len(nonempty):
        dtype = np.int32 if len(flags) < 2**31 else np.int64
        out[nonempty] = np.add.reduceat(flags.view(np.uint8), starts[nonempty], dtype=dtype)
    return out


def _word_stats(cp: np.ndarray, starts: np.ndarray, n: int) -> tuple[np.ndarray, ...]:
    """Per document: words (as str.split() finds them), their characters, and the words
    holding a letter; a few numpy passes over the code points of the whole batch
    (`_code_points`)."""
    if not len(cp):
        return np.zeros(n), np.zeros(n), np.zeros(n)
    if cp.dtype == np.uint8:  # ASCII: whitespace is 9-13 and 28-32, letters A-Z and a-z
        space = (cp == 32) | ((cp - 9) <= 4) | ((cp - 28) <= 3)  # (uint8 wraps below)
        letter = ((cp | 32) - 97) <= 25
    else:
        space = IS_SPACE[np.minimum(cp, SPACE_TABLE_TOP)]
        letter = _letters()[np.minimum(cp, 0xFFFF)]
        for i in np.flatnonzero(cp > 0xFFFF).tolist():  # rare: outside the BMP
            c = unicodedata.category(chr(int(cp[i])))
            letter[i] = c[0] == "L" or c in ("Nl", "No")
    starts_word = np.empty(len(cp), bool)  # a non-space after a space or a document start
    starts_word[0] = True
    starts_word[1:] = space[:-1]
    firsts = starts[:-1]
    starts_word[firsts[firsts < len(cp)]] = True
    starts_word &= ~space
    word_at = np.flatnonzero(starts_word)
    lettered = np.zeros(len(cp), bool)  # at the start of each word holding a letter
    if len(word_at):
        # A word's characters run to the next word's start (spaces between are not letters).
        lettered[word_at[np.logical_or.reduceat(letter, word_at)]] = True
    return (
        _doc_sums(starts_word, starts, n),
        np.diff(starts) - _doc_sums(space, starts, n),
        _doc_sums(lettered, starts, n),
    )


def _symbols(cp: np.ndarray, starts: np.ndarray, n: int) -> np.ndarray:
    """Per document, `#`, `…` and non-overlapping `...` (as `re.findall("#|[.]{3}|…")`
    counts them): a run of k dots holds k // 3. Symbols are rare, so only their positions
    are looked at."""
    out = np.zeros(n)
    if not len(cp):
        return out

    def doc_of(positions: np.ndarray) -> np.ndarray:
        return np.searchsorted(starts, positions, side="right") - 1

    out += np.bincount(doc_of(np.flatnonzero(cp == 35)), minlength=n)[:n]  # '#'
    if cp.dtype != np.uint8:  # not all ASCII: '…' may occur
        out += np.bincount(doc_of(np.flatnonzero(cp == 0x2026)), minlength=n)[:n]
    dots = np.flatnonzero(cp == 46)
    if len(dots):
        head = np.ones(len(dots), bool)  # the first dot of each run
        head[1:] = dots[1:] != dots[:-1] + 1
        head[np.isin(dots, starts)] = True  # a run never continues into the next document
        first = np.flatnonzero(head)
        runs = np.diff(np.append(first, len(dots)))
        out += np.bincount(doc_of(dots[first]), weights=runs // 3, minlength=n)[:n]
    return out


_FRACTIONS = {
    "max_ellipsis_lines",
    "max_bullet_lines",
    "min_alphabetic_words",
    "max_duplicate_lines",
    "max_duplicate_paragraphs",
}


class QualityError(ValueError):
    """A quality threshold is out of range."""


@dataclasses.dataclass(frozen=True)
class QualityConfig:
    """Thresholds of the quality rules (Gopher's values by default; `enabled=False`: none).

    Attributes:
        min_words, max_words: document length in words (whitespace-separated).
        min_mean_word_length, max_mean_word_length: mean characters per word.
        max_symbol_to_word_ratio: ('#' + '...' + '…') per word.
        max_ellipsis_lines: fraction of non-empty lines ending in '...' or '…'.
        max_bullet_lines: fraction of non-empty lines starting with a bullet ('•', '-', '*').
        min_alphabetic_words: fraction of words holding at least one letter.
        max_duplicate_lines: fraction of non-empty lines that repeat an earlier line.
        max_duplicate_paragraphs: fraction of paragraphs (split on blank lines) repeating one.
    """

    enabled: bool = True
    min_words: int = 50
    max_words: int = 100_000
    min_mean_word_length: float = 3.0
    max_mean_word_length: float = 10.0
    max_symbol_to_word_ratio: float = 0.1
    max_ellipsis_lines: float = 0.3
    max_bullet_lines: float = 0.9
    min_alphabetic_words: float = 0.8
    max_duplicate_lines: float = 0.3
    max_duplicate_paragraphs: float = 0.3

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "enabled":
                if not isinstance(value, bool):
                    raise QualityError(f"quality.enabled={value!r}: use True or False")
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
                raise QualityError(f"quality.{f.name}={value!r}: need a number")
            fraction = f.name in _FRACTIONS
            if value < 0 or (fraction and value > 1):
                hint = "a fraction in [0, 1]" if fraction else "a number >= 0"
                raise QualityError(
                    f"quality.{f.name}={value!r}: need {hint}, e.g. "
                    f"quality.{f.name}={getattr(QualityConfig, f.name)!r}"
                )
        if self.min_words > self.max_words:
            raise QualityError(
                f"quality.min_words={self.min_words} > quality.max_words={self.max_words}: "
                f"lower min_words or raise max_words"
            )


def _per_doc(parents: np.ndarray, values: np.ndarray | None, n: int) -> np.ndarray:
    """Sums `values` (or counts items) per document, given each item's document index."""
    return np.bincount(parents, weights=values, minlength=n)[:n]


def _items(texts, pattern: str):
    """The non-blank pieces of each text split on `pattern`, and each piece's document."""
    import pyarrow.compute as pc

    pieces = pc.split_pattern(texts, pattern)
    parents = np.asarray(pc.list_parent_indices(pieces))
    flat = pc.list_flatten(pieces)
    keep = np.asarray(pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(flat)), 0))
    return flat.filter(keep), parents[keep]


def _duplicate_fraction(flat, parents: np.ndarray, n: int) -> np.ndarray:
    """Per document, the fraction of its items that repeat an earlier item of it."""
    import pyarrow.compute as pc

    total = _per_doc(parents, None, n)
    if not len(parents):
        return np.zeros(n)
    codes = np.asarray(pc.dictionary_encode(flat).indices, np.int64)
    keys = np.unique(parents.astype(np.int64) * (int(codes.max()) + 1) + codes)
    unique = _per_doc(keys // (int(codes.max()) + 1), None, n)
    return np.divide(total - unique, total, out=np.zeros(n), where=total > 0)


def quality_reasons(texts, config: QualityConfig) -> list[str | None]:
    """For each text, the first rule (of `RULES`) it fails, or None when it passes them all.

    Vectorised over the whole batch (pyarrow.compute and numpy, no Python per document or
    word); `texts` is a list of str or a pyarrow string array. Words are split on Unicode
    whitespace, lines on '\\n', paragraphs on blank lines ('\\n\\n'); blank lines and
    paragraphs do not count.

    >>> quality_reasons(["too short", "word " * 60], QualityConfig(max_duplicate_lines=1.0))
    ['too_few_words', None]
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(texts)
    if not config.enabled or n == 0:
        return [None] * n
    arr = texts if isinstance(texts, pa.Array | pa.ChunkedArray) else pa.array(texts, pa.string())
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    cp, starts = _code_points(arr)
    n_words, chars, lettered = _word_stats(cp, starts, n)
    safe = np.maximum(n_words, 1)
    symbols = _symbols(cp, starts, n)
    lines, line_parents = _items(arr, "\n")
    n_lines = np.maximum(_per_doc(line_parents, None, n), 1)
    ellipsis = _per_doc(line_parents, np.asarray(pc.match_substring_regex(lines, _ELLIPSIS_LINE),
                                                 np.float64), n)  # fmt: skip
    bullets = _per_doc(line_parents, np.asarray(pc.match_substring_regex(lines, _BULLET_LINE),
                                                np.float64), n)  # fmt: skip
    no_letter = n_words - lettered
    paragraphs, paragraph_parents = _items(arr, "\n\n")
    mean = chars / safe
    fails = {
        "too_few_words": n_words < config.min_words,
        "too_many_words": n_words > config.max_words,
        "mean_word_length": (mean < config.min_mean_word_length)
        | (mean > config.max_mean_word_length),
        "symbol_to_word_ratio": symbols / safe > config.max_symbol_to_word_ratio,
        "ellipsis_lines": ellipsis / n_lines > config.max_ellipsis_lines,
        "bullet_lines": bullets / n_lines > config.max_bullet_lines,
        "alphabetic_words": 1 - no_letter / safe < config.min_alphabetic_words,
        "duplicate_lines": _duplicate_fraction(lines, line_parents, n) > config.max_duplicate_lines,
        "duplicate_paragraphs": _duplicate_fraction(paragraphs, paragraph_parents, n)
        > config.max_duplicate_paragraphs,
    }
    reason = np.full(n, len(RULES))
    for i, rule in reversed(list(enumerate(RULES))):
        reason[fails[rule]] = i
    names = [*RULES, None]
    return [names[r] for r in reason.tolist()]


def quality_reason(text: str, config: QualityConfig) -> str | None:
    """The first rule (of `RULES`) that `text` fails, or None (`quality_reasons` of one).

    >>> quality_reason("word " * 60, QualityConfig(max_duplicate_lines=1.0))
    >>> quality_reason("too short", QualityConfig())
    'too_few_words'
    """
    return quality_reasons([text], config)[0]


def count_rules(texts: list[str], config: QualityConfig) -> collections.Counter:
    """Documents dropped per rule (first failing rule) among `texts`."""
    return collections.Counter(r for r in quality_reasons(texts, config) if r is not None)
