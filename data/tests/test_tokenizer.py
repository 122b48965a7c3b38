"""Byte tokenizer, Hugging Face tokenizer.json loading, BPE training."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from meltemi.data import ByteTokenizer, HfTokenizer, TokenizerError, train_bpe


def test_byte_tokenizer_round_trips_unicode():
    tok = ByteTokenizer()
    text = "naïve ☃ code\n\tdef f(): pass"
    ids = tok.encode(text)
    assert ids.dtype == np.int32 and ids.max() < 256
    assert tok.decode(ids) == text


def test_byte_tokenizer_specials_follow_the_bytes():
    tok = ByteTokenizer()
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (256, 257, 258, 259)
    assert tok.decode([tok.bos_id, 104, 105, tok.eos_id, tok.pad_id]) == "hi"


def test_byte_tokenizer_fingerprint_is_stable():
    assert ByteTokenizer().fingerprint() == ByteTokenizer().fingerprint()
    assert len(ByteTokenizer().fingerprint()) == 64


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    texts = ["def function(argument):\n    return argument + 1\n"] * 50 + ["class Thing: pass"] * 20
    return train_bpe(texts, 300, tmp_path_factory.mktemp("tok") / "tokenizer.json")


def test_trained_bpe_round_trips_and_compresses(bpe):
    text = "def function(argument):\n    return argument + 1\n"
    ids = bpe.encode(text)
    assert bpe.decode(ids) == text
    assert len(ids) < len(text.encode()) // 2


def test_trained_bpe_has_named_specials(bpe):
    assert (bpe.bos_id, bpe.eos_id, bpe.pad_id) == (0, 1, 2)
    assert bpe.vocab_size <= 300


def test_hf_tokenizer_pickles_with_the_same_fingerprint(bpe):
    again = pickle.loads(pickle.dumps(bpe))
    assert again.fingerprint() == bpe.fingerprint()
    assert again.encode("return").tolist() == bpe.encode("return").tolist()


def test_hf_tokenizer_fingerprint_differs_from_byte_tokenizer(bpe):
    assert bpe.fingerprint() != ByteTokenizer().fingerprint()


def test_missing_tokenizer_file_names_the_path(tmp_path):
    with pytest.raises(TokenizerError, match=r"nope\.json'\): no such file"):
        HfTokenizer(tmp_path / "nope.json")


def test_unknown_special_token_is_an_error(bpe, tmp_path):
    with pytest.raises(TokenizerError, match=r"no bos token among \['<start>'\]"):
        HfTokenizer(bpe._path, bos="<start>")


def test_train_bpe_rejects_tiny_vocab(tmp_path):
    with pytest.raises(TokenizerError, match=r"vocab_size=100.*at least 260"):
        train_bpe(["x"], 100, tmp_path / "t.json")
