"""Shared fixtures: tiny corpora and stores built in each test's tmp_path."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from meltemi.data import ByteTokenizer, JsonlFiles, build_store


def write_jsonl(path: pathlib.Path, texts: list[str]) -> pathlib.Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def varied_texts(count: int, seed: int = 0) -> list[str]:
    """Documents of distinct, varied lengths (3..200 characters) and content."""
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota"]
    texts = []
    for i in range(count):
        n = int(rng.integers(1, 40))
        texts.append(f"doc{i}: " + " ".join(rng.choice(words, n)))
    return texts


@pytest.fixture
def tiny_store(tmp_path):
    """A store of 37 documents (bos + text + eos) from one JSON-lines source."""
    src = JsonlFiles("tiny", [str(write_jsonl(tmp_path / "tiny.jsonl", varied_texts(37)))])
    return build_store([src], ByteTokenizer(), tmp_path / "store")


WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "doc"]


def wordlevel_tokenizer(path: pathlib.Path, specials: tuple[str, ...], vocab_size: int = 1024):
    """Writes a WordLevel `tokenizer.json` of `vocab_size` ids: `specials` first, then words.

    Returns the path; load it with `HfTokenizer(path, ...)`.
    """
    import tokenizers

    words = list(specials) + WORDS
    words += [f"w{i}" for i in range(vocab_size - len(words))]
    vocab = {w: i for i, w in enumerate(words)}
    unk = "<unk>" if "<unk>" in vocab else None
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token=unk))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(specials))
    tok.save(str(path))
    return path
