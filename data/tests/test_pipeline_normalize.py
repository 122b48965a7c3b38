"""Normalisation: each step, its counts, and linear cost on absurd runs."""

from __future__ import annotations

import collections
import random
import time
import unicodedata

from meltemi.data.pipeline import normalize_text
from meltemi.data.pipeline._normalize import digest, digests, normalize_texts


def _norm(text, max_run=1000):
    c = collections.Counter()
    return normalize_text(text, max_run, c), dict(c)


def test_invalid_utf8_is_replaced_and_counted():
    assert _norm(b"ok \xff\xfe bytes") == ("ok \ufffd\ufffd bytes", {"invalid_utf8_replaced": 1})
    assert _norm("lone \ud800 surrogate") == ("lone ? surrogate", {"invalid_utf8_replaced": 1})


def test_text_is_nfc():
    decomposed = "Cafe\u0301 \u1f00\u0301"
    out, counts = _norm(decomposed)
    assert out == unicodedata.normalize("NFC", decomposed) != decomposed and counts == {}


def test_line_endings_control_characters_and_whitespace_are_normalised():
    text = "  a\u00a0b\r\nline\x07 two \t\r\r\r\rthird\u200b\x00 \n\n\n\n\nlast  "
    out, counts = _norm(text)
    assert out == "a b\nline two\n\nthird\n\nlast"
    assert counts == {"control_chars_removed": 1}


def test_absurd_runs_are_capped_in_linear_time():
    small = "x " + " " * 2_000_000 + "y" + "z" * 2_000_000
    big = "x " + " " * 8_000_000 + "y" + "z" * 8_000_000

    def cpu_seconds(text):  # CPU time, best of 3: the other jobs' load moves wall time 10x
        times = []
        for _ in range(3):
            start = time.process_time()
            result = _norm(text, max_run=100)
            times.append(time.process_time() - start)
        return min(times), result

    t_small, (out, counts) = cpu_seconds(small)
    t_big, (out_big, _) = cpu_seconds(big)
    assert out == out_big == "x" + " " * 100 + "y" + "z" * 100  # a run of spaces is one run
    assert counts == {"truncated_runs": 1}
    assert t_big < 10 * t_small + 0.5  # 4x the input, not 16x the time


def test_the_vectorised_batch_equals_normalize_text_one_by_one():
    rng = random.Random(0)
    pieces = ["word", "Ωμέγα", "Cafe\u0301", "\u00e9", " ", "  ", "\t", "\n", "\n\n\n", " \n",
              "\t\n", "\r\n", "\r", "\x07", "\u200b", "\u00a0", "\u3000", "\ufeff", "x" * 40,
              "é" * 40, " " * 40, "\n" * 40, "...", "-", "\x85"]  # fmt: skip
    texts: list = ["".join(rng.choices(pieces, k=rng.randint(0, 60))) for _ in range(600)]
    texts += [b"raw \xff bytes", "lone \ud800 surrogate", "", "   ", "a" * 31, "ab" * 20]
    got, changes = normalize_texts(texts, 30)
    for i, text in enumerate(texts):
        counts = collections.Counter()
        assert got[i] == normalize_text(text, 30, counts), repr(text)
        assert changes.get(i, collections.Counter()) == counts, repr(text)
    assert sum("truncated_runs" in c for c in changes.values()) > 50  # runs were exercised


def test_digests_equal_the_digest_of_each_text():
    texts = ["a  b\n c", "a b c", "a bc", "", "Ωμέγα\tλέξη", "x " * 500]
    rng = random.Random(2)  # every kind of whitespace, at the ends too, next to non-ASCII
    pieces = ["a", "é", "Ω", "😀", "word", " ", "  ", "\t", "\n", "\n\n", "\r", "\x0b", "\x1c",
              "\x85", "\xa0", "\u2028", "\u3000"]  # fmt: skip
    texts += ["".join(rng.choices(pieces, k=rng.randint(0, 12))) for _ in range(3000)]
    assert digests(texts).tolist() == [digest(t) for t in texts]
