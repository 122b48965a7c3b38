"""Stage 4, quality filters: Gopher-style heuristics (Rae et al. 2021, appendix A), each with
its threshold in `QualityConfig`; a dropped document is counted under the first rule it fails
(in the order of `RULES`), so the per-rule counts add up to the documents dropped.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re

__all__ = ["RULES", "QualityConfig", "QualityError", "quality_reason"]

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

_SYMBOLS = re.compile(r"#|\.\.\.|\u2026")
# Words (maximal runs of non-space characters) without an ASCII letter; those holding a
# non-ASCII letter are then told apart by _ALPHA.
_NO_ASCII_LETTER_WORD = re.compile(r"(?<!\S)[^\sA-Za-z]+(?!\S)")
_ALPHA = re.compile(r"[^\W\d_]")
# Lines ending in an ellipsis / starting with a bullet (normalised text: no trailing spaces).
_ELLIPSIS_LINE = re.compile(r"(?:\.\.\.|\u2026)[ \t]*$", re.MULTILINE)
_BULLET_LINE = re.compile(r"^[ \t]*(?:\u2022|- |\* )", re.MULTILINE)


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


def _duplicate_fraction(items: list[str]) -> float:
    if not items:
        return 0.0
    return 1.0 - len(set(items)) / len(items)


def quality_reason(text: str, config: QualityConfig) -> str | None:
    """The first rule (of `RULES`) that `text` fails, or None when it passes them all.

    >>> quality_reason("word " * 60, QualityConfig(max_duplicate_lines=1.0))
    >>> quality_reason("too short", QualityConfig())
    'too_few_words'
    """
    if not config.enabled:
        return None
    words = text.split()
    n = len(words)
    if n < config.min_words:
        return "too_few_words"
    if n > config.max_words:
        return "too_many_words"
    mean = len("".join(words)) / n
    if not config.min_mean_word_length <= mean <= config.max_mean_word_length:
        return "mean_word_length"
    if len(_SYMBOLS.findall(text)) / n > config.max_symbol_to_word_ratio:
        return "symbol_to_word_ratio"
    lines = [line for line in text.split("\n") if line.strip()]
    if lines:
        if len(_ELLIPSIS_LINE.findall(text)) / len(lines) > config.max_ellipsis_lines:
            return "ellipsis_lines"
        if len(_BULLET_LINE.findall(text)) / len(lines) > config.max_bullet_lines:
            return "bullet_lines"
    no_letter = sum(1 for w in _NO_ASCII_LETTER_WORD.findall(text) if not _ALPHA.search(w))
    if 1 - no_letter / n < config.min_alphabetic_words:
        return "alphabetic_words"
    if _duplicate_fraction(lines) > config.max_duplicate_lines:
        return "duplicate_lines"
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    if _duplicate_fraction(paragraphs) > config.max_duplicate_paragraphs:
        return "duplicate_paragraphs"
    return None


def count_rules(texts: list[str], config: QualityConfig) -> collections.Counter:
    """Documents dropped per rule (first failing rule) among `texts`."""
    return collections.Counter(r for t in texts if (r := quality_reason(t, config)) is not None)
