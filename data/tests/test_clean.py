"""Run truncation and n-gram hashing (the pure parts of the cleaning policy)."""

from __future__ import annotations

import numpy as np
import pytest

from meltemi.data import CleanPolicy, ngram_hashes, truncate_runs


def test_runs_of_a_non_ascii_character_are_cut():
    out, cut = truncate_runs("né" + "é" * 5000 + "!", 7)
    assert (out, cut) == ("n" + "é" * 7 + "!", True)


def test_mixed_unicode_whitespace_counts_as_one_run():
    out, cut = truncate_runs("a" + "\u3000 \u2003\n" * 300 + "b", 5)
    assert (out, cut) == ("a\u3000 \u2003\n\u3000b", True)


def test_text_without_long_runs_is_returned_unchanged():
    text = "def f(x):\n    return x  # ok\n" * 200
    out, cut = truncate_runs(text, 8)
    assert out is text and not cut


def test_ngram_hashes_match_only_identical_windows():
    a = ngram_hashes(np.arange(20), 13)
    b = ngram_hashes(np.arange(3, 23), 13)
    assert len(a) == 8 and len(np.intersect1d(a, b)) == 5
    assert len(ngram_hashes(np.arange(12), 13)) == 0


def test_policy_rejects_bad_values():
    with pytest.raises(ValueError, match=r"invalid_utf8='drop'.*'replace' or 'skip'"):
        CleanPolicy(invalid_utf8="drop")
    with pytest.raises(ValueError, match=r"max_run=0.*need an int >= 1"):
        CleanPolicy(max_run=0)
