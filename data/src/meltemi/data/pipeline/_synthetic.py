"""A synthetic corpus with planted exact duplicates, near-duplicates and junk, labelled, to
measure the pipeline (tests, `//data:bench`); no download.

Distinct documents are sentences of Zipf-distributed pseudo-words (so two of them share
almost no 5-word shingle); an exact duplicate is a copy with its whitespace changed (spaces
doubled, CRLF line ends); a near-duplicate is a copy with `substitute` of its words (at least
one) replaced by random words; junk is one of the kinds the quality rules target.
"""

from __future__ import annotations

import json
import os

import numpy as np

__all__ = ["JUNK_KINDS", "synthetic_corpus", "write_corpus"]

JUNK_KINDS = ("short", "symbols", "repeated_lines", "numbers", "ellipsis", "long_words")


def _vocabulary(rng: np.random.Generator, size: int) -> np.ndarray:
    letters = rng.integers(97, 123, (size, 9), dtype=np.uint8)
    lengths = rng.integers(2, 10, size)
    return np.array([bytes(row[:n]).decode() for row, n in zip(letters, lengths, strict=True)])


def _document(rng, vocab, cdf, words: int) -> str:
    picks = np.minimum(np.searchsorted(cdf, rng.random(words)), len(vocab) - 1)
    out, sentence = [], []
    for k, w in enumerate(picks):
        sentence.append(vocab[w])
        if len(sentence) >= 6 + (k * 7) % 12 or k == words - 1:
            out.append(" ".join(sentence).capitalize() + ".")
            sentence = []
    lines, i = [], 0
    while i < len(out):  # 1..4 sentences a line, a blank line now and then
        n = int(rng.integers(1, 5))
        lines.append(" ".join(out[i : i + n]))
        if rng.random() < 0.2:
            lines.append("")
        i += n
    return "\n".join(lines)


def junk_text(rng, vocab, kind: str) -> str:
    if kind == "short":
        return " ".join(rng.choice(vocab, int(rng.integers(3, 20))))
    if kind == "symbols":
        return " ".join(f"#{w} ###" for w in rng.choice(vocab, 80))
    if kind == "repeated_lines":
        line = " ".join(rng.choice(vocab, 8))
        return "\n".join([line] * 30)
    if kind == "numbers":
        return "\n".join(" ".join(str(x) for x in rng.integers(0, 10**6, 8)) for _ in range(12))
    if kind == "ellipsis":
        return "\n".join(" ".join(rng.choice(vocab, 10)) + " ..." for _ in range(12))
    return " ".join("".join(rng.choice(vocab, 6)) for _ in range(80))  # long_words


def synthetic_corpus(
    distinct: int,
    *,
    exact: int,
    near: int,
    junk: int,
    substitute: float = 0.01,
    min_words: int = 80,
    max_words: int = 400,
    seed: int = 0,
) -> list[dict]:
    """Records `{"id", "text", "kind", "group"}` in a shuffled order.

    `kind` is `distinct`, `exact`, `near` or `junk:<kind>`; `group` is the index of the
    distinct document a copy was made from (its own index for a distinct one, -1 for junk).

    Args:
        distinct: original documents.
        exact: exact copies (of random originals).
        near: near copies (of random originals), `substitute` of their words replaced.
        junk: junk documents, kinds in turn.
        substitute: fraction of words replaced in a near copy (at least one word).
        min_words, max_words: length range of originals, in words.
        seed: fixes everything.
    """
    rng = np.random.default_rng(seed)
    vocab = _vocabulary(rng, 20_000)
    cdf = np.cumsum(1.0 / np.arange(1, len(vocab) + 1))
    cdf /= cdf[-1]  # Zipf
    records = []
    originals = []
    for i in range(distinct):
        text = _document(rng, vocab, cdf, int(rng.integers(min_words, max_words + 1)))
        originals.append(text)
        records.append({"text": text, "kind": "distinct", "group": i})
    for _ in range(exact):
        g = int(rng.integers(distinct))
        text = originals[g].replace(". ", ".  ").replace("\n", "\r\n")
        records.append({"text": text, "kind": "exact", "group": g})
    for _ in range(near):
        g = int(rng.integers(distinct))
        tokens = originals[g].split(" ")
        k = max(1, round(substitute * len(tokens)))
        for at in rng.choice(len(tokens), k, replace=False):
            tokens[at] = str(vocab[rng.integers(len(vocab))])
        records.append({"text": " ".join(tokens), "kind": "near", "group": g})
    for j in range(junk):
        kind = JUNK_KINDS[j % len(JUNK_KINDS)]
        records.append({"text": junk_text(rng, vocab, kind), "kind": f"junk:{kind}", "group": -1})
    order = rng.permutation(len(records))
    out = [records[i] for i in order]
    for i, r in enumerate(out):
        r["id"] = f"doc-{i:06d}"
    return out


def write_corpus(records: list[dict], directory: str, files: int = 4) -> list[str]:
    """Writes `records` as `files` JSON-lines files (`part-N.jsonl`); returns their paths."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    per = -(-len(records) // files)
    for f in range(files):
        path = os.path.join(directory, f"part-{f}.jsonl")
        with open(path, "w") as fh:
            for r in records[f * per : (f + 1) * per]:
                fh.write(json.dumps(r) + "\n")
        paths.append(path)
    return paths
