"""Byte tokenizer, Hugging Face tokenizer.json loading, BPE training."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import numpy as np
import pytest
from conftest import wordlevel_tokenizer, write_jsonl

from meltemi.data import (
    ByteTokenizer,
    HfTokenizer,
    JsonlFiles,
    PackedDataset,
    TokenizerError,
    build_store,
    train_bpe,
)


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


def test_byte_tokenizer_fingerprint_is_the_same_in_another_process():
    code = "from meltemi.data import ByteTokenizer; print(ByteTokenizer().fingerprint())"
    env_path = ":".join(sys.path)
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={"PYTHONPATH": env_path, "PYTHONHASHSEED": "123"},
    ).stdout.strip()  # fmt: skip
    assert other == ByteTokenizer().fingerprint() and len(other) == 64


def test_byte_tokenizer_saves_an_equal_tokenizer_json(tmp_path):
    tok = ByteTokenizer()
    written = tok.save_pretrained(tmp_path)
    assert sorted(p.rsplit("/", 1)[1] for p in written) == [
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    hf = HfTokenizer(tmp_path / "tokenizer.json", bos=config["bos_token"], eos=config["eos_token"],
                     pad=config["pad_token"])  # fmt: skip
    assert (hf.vocab_size, hf.bos_id, hf.eos_id, hf.pad_id) == (259, 256, 257, 258)
    every_byte = bytes(range(256)).decode("latin-1")  # code points 0-255: 1-2 UTF-8 bytes each
    for text in ("naïve ☃ code\n\tdef f():  pass 🙂", every_byte, "<bos>hi<eos> <pad>x"):
        ids, _ = tok.encode_with_offsets(text.replace("<pad>", ""))
        assert hf.encode(text.replace("<pad>", "")).tolist() == ids.tolist()
        assert hf.decode(ids) == tok.decode(ids)
    assert hf.encode("<pad>").tolist() == [258]


def test_hf_fingerprint_follows_the_mapping_not_the_file_layout(tmp_path):
    path = wordlevel_tokenizer(tmp_path / "a.json", ("<unk>", "<eos>"))
    data = json.loads(path.read_text())
    (tmp_path / "b.json").write_text(json.dumps(data, indent=4, sort_keys=True))
    vocab = data["model"]["vocab"]
    vocab["alpha"], vocab["beta"] = vocab["beta"], vocab["alpha"]
    (tmp_path / "c.json").write_text(json.dumps(data))
    a, b, c = (HfTokenizer(tmp_path / f"{n}.json") for n in "abc")
    assert a.fingerprint() == b.fingerprint()  # same mapping, other layout
    assert a.fingerprint() != c.fingerprint()  # two ids swapped
    assert a.fingerprint() != HfTokenizer(path, pad="<unk>").fingerprint()  # other pad


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


@pytest.fixture
def no_bos(tmp_path):
    """A 1,024-id WordLevel tokenizer whose only special tokens are <unk> and <eos>."""
    return wordlevel_tokenizer(tmp_path / "no_bos.json", ("<unk>", "<eos>"))


def test_a_tokenizer_without_bos_has_no_bos_by_default(no_bos):
    tok = HfTokenizer(no_bos)
    assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.pad_id) == (1024, None, 1, 1)
    assert (tok.bos_token, tok.eos_token) == (None, "<eos>")


def test_a_store_of_a_tokenizer_without_bos_says_so(no_bos, tmp_path):
    tok = HfTokenizer(no_bos)
    src = JsonlFiles("w", [str(write_jsonl(tmp_path / "w.jsonl", ["alpha beta", "gamma"]))])
    store = build_store([src], tok, tmp_path / "s")
    assert store.metadata["tokenizer"]["bos"] == "none"
    assert store.metadata["tokenizer"]["eos"] == "<eos>"
    assert store.metadata["tokenizer"]["bos_id"] is None
    assert [store.document(d).tolist() for d in range(2)] == [
        tok.encode("alpha beta").tolist() + [1],
        tok.encode("gamma").tolist() + [1],
    ]
    batch = PackedDataset(store, seq_len=4, batch_size=1).batch(0)
    assert batch["tokens"].shape == (1, 4)


def test_bos_and_eos_can_be_named_or_left_out(bpe, no_bos):
    assert HfTokenizer(bpe._path, bos="").bos_id is None
    assert HfTokenizer(bpe._path, bos="<pad>").bos_id == 2
    tok = HfTokenizer(no_bos, bos="<unk>", eos="", pad="<unk>")
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (0, None, 0)
    with pytest.raises(TokenizerError, match=r"no pad token among .* and no eos to pad with"):
        HfTokenizer(no_bos, eos="")


def test_a_missing_eos_by_default_is_an_error_that_offers_none(tmp_path):
    path = wordlevel_tokenizer(tmp_path / "t.json", ("<unk>", "<pad>"))
    with pytest.raises(TokenizerError, match=r"no eos token among .*or eos='' for none"):
        HfTokenizer(path)
    assert HfTokenizer(path, eos="").pad_id == 1


def test_an_empty_pad_is_refused():
    with pytest.raises(TokenizerError, match=r"pad=''\): rows need a pad token"):
        HfTokenizer(__file__, pad="")
