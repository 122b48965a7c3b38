"""Per-document cleaning policies and n-gram decontamination (pure numpy, no state)."""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["CleanPolicy", "contains_any", "ngram_hashes", "truncate_runs"]

# Unicode whitespace (str.isspace() is True for exactly these code points): a run of mixed
# whitespace counts as one run. A lookup table indexed by min(code point, SPACE_TABLE_TOP)
# classifies them.
_SPACE = [9, 10, 11, 12, 13, 28, 29, 30, 31, 32, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B)]
_SPACE += [0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
SPACE_TABLE_TOP = 0x3001
IS_SPACE = np.zeros(SPACE_TABLE_TOP + 1, bool)
IS_SPACE[_SPACE] = True
_SPACE_KEY = np.uint32(0xFFFFFFFF)


@dataclasses.dataclass(frozen=True)
class CleanPolicy:
    """What the build does with bad input (every action is counted in the ledger).

    Attributes:
        invalid_utf8: "replace" (decode with U+FFFD and keep) or "skip" the document.
        max_run: runs of one character, or of whitespace, longer than this are cut to it.
        max_document_chars: longer documents are truncated to this many characters.
        min_document_chars: documents shorter than this (after stripping) are skipped as empty.
        add_bos, add_eos: wrap every document in the tokenizer's bos/eos tokens.
        ngram: n-gram length (in tokens) for decontamination.
    """

    invalid_utf8: str = "replace"
    max_run: int = 1000
    max_document_chars: int = 1 << 24
    min_document_chars: int = 1
    add_bos: bool = True
    add_eos: bool = True
    ngram: int = 13

    def __post_init__(self):
        if self.invalid_utf8 not in ("replace", "skip"):
            raise ValueError(
                f"CleanPolicy(invalid_utf8={self.invalid_utf8!r}): use 'replace' or 'skip'"
            )
        for name in ("max_run", "max_document_chars", "min_document_chars", "ngram"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"CleanPolicy({name}={value!r}): need an int >= 1")


def may_have_long_run(text: str, max_run: int) -> bool:
    """False only if `text` has no run longer than `max_run` (of one character, or of
    whitespace); a cheap check, so that ordinary text never reaches numpy.

    With stride `s = max(1, max_run // 2)`, a run of at least `2s + 1` characters covers
    some whole window `[k s, k s + s]`, so it suffices to look at the windows whose two ends
    agree (`len(text) / s` comparisons) and test those windows whole.
    """
    s = max(1, max_run // 2)
    for a in range(0, len(text) - s, s):
        x, y = text[a], text[a + s]
        if x == y or (x.isspace() and y.isspace()):
            window = text[a : a + s + 1]
            if window.isspace() or window.count(x) == len(window):
                return True
    return False


def truncate_runs(text: str, max_run: int) -> tuple[str, bool]:
    """Cuts every run of one character (or of whitespace) longer than `max_run` to `max_run`.

    Linear time, vectorised: megabyte-long runs cost what any megabyte costs.

    >>> truncate_runs("ab" + "x" * 10 + " \\n\\t  " + "c", 3)
    ('abxxx \\n\\tc', True)
    >>> truncate_runs("abc", 3)
    ('abc', False)
    """
    if len(text) <= max_run or not may_have_long_run(text, max_run):
        return text, False
    ascii_only = text.isascii()
    if ascii_only:
        cps = np.frombuffer(text.encode("ascii"), np.uint8)
    else:
        cps = np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), np.uint32)
    keys = cps.astype(np.uint32)
    keys[IS_SPACE[np.minimum(keys, SPACE_TABLE_TOP)]] = _SPACE_KEY
    starts = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    bounds = np.concatenate([[0], starts, [len(keys)]])
    run_lengths = np.diff(bounds)
    if run_lengths.max() <= max_run:
        return text, False
    keep = (np.arange(len(keys)) - np.repeat(bounds[:-1], run_lengths)) < max_run
    kept = cps[keep].tobytes()
    out = kept.decode("ascii") if ascii_only else kept.decode("utf-32-le", errors="surrogatepass")
    return out, True


_P = np.uint64(0x100000001B3)


def ngram_hashes(tokens: np.ndarray, n: int) -> np.ndarray:
    """64-bit hashes of every window of `n` consecutive tokens (empty if fewer than n).

    >>> h = ngram_hashes(np.array([1, 2, 3, 1, 2, 3]), 3)
    >>> len(h), bool(h[0] == h[3]), bool(h[0] == h[1])
    (4, True, False)
    """
    tokens = np.asarray(tokens)
    if len(tokens) < n:
        return np.zeros(0, np.uint64)
    t = tokens.astype(np.uint64) + np.uint64(1)
    h = np.zeros(len(t) - n + 1, np.uint64)
    for j in range(n):  # polynomial rolling hash, wrapping mod 2**64
        h *= _P
        h += t[j : j + len(h)]
    # splitmix64 finaliser spreads the bits before set membership tests.
    h ^= h >> np.uint64(30)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(27)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    return h


def contains_any(sorted_set: np.ndarray, values: np.ndarray) -> bool:
    """Whether any of `values` is in `sorted_set` (sorted ascending): a binary search per
    value, O(len(values) log len(sorted_set)), where `np.isin` would sort the whole set again.

    >>> contains_any(np.array([2, 5, 9], np.uint64), np.array([4, 9], np.uint64))
    True
    """
    if not len(sorted_set) or not len(values):
        return False
    at = np.searchsorted(sorted_set, values)
    at[at == len(sorted_set)] = 0
    return bool((sorted_set[at] == values).any())
