"""Gopher-style quality rules: each fires on its own kind of junk, thresholds are honoured,
and the per-rule counts add up."""

from __future__ import annotations

import random

import pytest

from meltemi.data.pipeline import RULES, QualityConfig, QualityError, quality_reason
from meltemi.data.pipeline._quality import count_rules, quality_reasons
from meltemi.data.pipeline._synthetic import synthetic_corpus
from meltemi.data.testing import quality_reason_reference

GOOD = "\n\n".join(
    " ".join(f"{w}{i}{p}" for i in range(12)) + "."
    for w, p in zip("abcdefg", "klmnopq", strict=True)
)
CASES = {
    "too_few_words": "only a handful of words here",
    "too_many_words": " ".join(["word"] * 60),  # with max_words=59 below
    "mean_word_length": " ".join(["a"] * 60),
    "symbol_to_word_ratio": " ".join(["#tag word"] * 40),
    "ellipsis_lines": "\n".join(["these are some words of a line ..."] * 4 + [GOOD]),
    "bullet_lines": "\n".join(f"- item number {i} with words in it" for i in range(12)),
    "alphabetic_words": " ".join(str(i * 7919) for i in range(80)),
    "duplicate_lines": "\n".join(["the same line again and again"] * 20),
    "duplicate_paragraphs": "\n\n".join(["one paragraph\nof two lines"] * 6 + [GOOD]),
}


def test_good_text_passes_every_rule():
    assert quality_reason(GOOD, QualityConfig()) is None


@pytest.mark.parametrize("rule", RULES)
def test_each_rule_drops_its_kind_of_junk(rule):
    cfg = QualityConfig(max_words=59) if rule == "too_many_words" else QualityConfig()
    if rule == "duplicate_paragraphs":  # its lines repeat too: isolate the paragraph rule
        cfg = QualityConfig(max_duplicate_lines=1.0)
    if rule == "bullet_lines":
        cfg = QualityConfig(min_words=10)
    assert quality_reason(CASES[rule], cfg) == rule


def test_a_looser_threshold_keeps_what_a_strict_one_drops():
    text = CASES["symbol_to_word_ratio"]  # 40 '#' over 80 words: ratio 0.5
    assert quality_reason(text, QualityConfig(max_symbol_to_word_ratio=0.49)) is not None
    assert quality_reason(text, QualityConfig(max_symbol_to_word_ratio=0.5)) is None


def test_counts_are_by_first_failing_rule_and_add_up():
    texts = [GOOD, CASES["too_few_words"], CASES["duplicate_lines"], CASES["duplicate_lines"]]
    counts = count_rules(texts, QualityConfig())
    assert counts == {"too_few_words": 1, "duplicate_lines": 2}


def test_disabled_rules_keep_everything():
    assert all(quality_reason(t, QualityConfig(enabled=False)) is None for t in CASES.values())


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (
            {"max_duplicate_lines": 1.5},
            r"quality.max_duplicate_lines=1.5: need a fraction in \[0, 1\], "
            r"e.g. quality.max_duplicate_lines=0.3",
        ),
        ({"min_words": -1}, r"quality.min_words=-1: need a number >= 0"),
        ({"min_words": 10, "max_words": 5}, r"min_words=10 > quality.max_words=5"),
        ({"max_bullet_lines": "x"}, r"quality.max_bullet_lines='x': need a number"),
    ],
)
def test_invalid_thresholds_name_the_field_and_the_fix(kw, match):
    with pytest.raises(QualityError, match=match):
        QualityConfig(**kw)


def test_the_vectorised_rules_agree_with_a_plain_python_reference():
    recs = synthetic_corpus(400, exact=20, near=20, junk=200, seed=5)
    rng = random.Random(0)
    extra = []
    for _ in range(300):  # random mixtures of the hard cases: unicode, bullets, ellipses, dups
        parts = rng.choices(
            ["Ωμέγα λέξη", "١٢٣ ٤٥٦", "½ ⅷ", "x_y", "- item", "• dot", "wait...", "so…",
             "#tag", "same line", "\n", "\n\n", "  ", "\t", "12345", "word", "𝐀𝐁", "😀",
             "....", "\u3000", "\x0b"], k=rng.randint(1, 400),
        )  # fmt: skip
        extra.append(" ".join(parts) or "w")  # not stripped: leading/trailing blanks too
    texts = ["", " "] + [r["text"] for r in recs] + extra + list(CASES.values()) + ["", "é"]
    for cfg in (QualityConfig(), QualityConfig(min_words=5, max_words=300, max_bullet_lines=0.2)):
        got = quality_reasons(texts, cfg)
        want = [quality_reason_reference(t, cfg) for t in texts]
        assert got == want
        assert len(set(want)) >= 8  # the mixture exercises most rules
