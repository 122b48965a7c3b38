"""`data.tokenizer` with a tokenizer.json, and `data.bos_token` / `data.eos_token`.

The tokenizer is a 1,024-id WordLevel one with only `<unk>` and `<eos>` as special tokens
(no bos, like GPT-2 or Qwen): the trainer uses it without a bos by default, and the keys
name other special tokens or none.
"""

import string

import numpy as np
import pytest
import tokenizers
from _subprocess import DEFAULT

from meltemi.levanter.config import ConfigError, load_config, resolve
from meltemi.levanter.trainer import train


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    chars = sorted(set(string.printable))
    vocab = {"<unk>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    vocab.update({f"<filler{i}>": i for i in range(len(vocab), 1024)})
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    tok.add_special_tokens(["<unk>", "<eos>"])
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def _resolved(root, tokenizer, *extra):
    return load_config(
        f"{DEFAULT}:smoke",
        [
            ("run_dir", str(root / "run")),
            ("data.cache_dir", str(root / "cache")),
            ("data.tokenizer", str(tokenizer)),
            ("checkpoint.enabled", "false"),
            *extra,
        ],
    )


def test_a_tokenizer_without_bos_trains_without_one(tokenizer_json, tmp_path):
    resolved = _resolved(tmp_path, tokenizer_json)
    spec = resolve(resolved)
    assert spec.tokenizer.bos_id is None and spec.tokenizer.eos_id == 1
    assert spec.model.vocab_size == 1024 and spec.model.bos_token_id is None
    result = train(spec)
    assert result.step == 2 and np.isfinite(list(result.losses.values())).all()


def test_bos_token_names_a_special_token(tokenizer_json, tmp_path):
    spec = resolve(_resolved(tmp_path, tokenizer_json, ("data.bos_token", "<eos>")))
    assert spec.tokenizer.bos_id == 1


def test_an_empty_bos_token_means_none(tokenizer_json, tmp_path):
    spec = resolve(_resolved(tmp_path, tokenizer_json, ("data.bos_token", "")))
    assert spec.tokenizer.bos_id is None and spec.tokenizer.eos_id == 1


def test_a_bos_token_the_tokenizer_lacks_names_the_key(tokenizer_json, tmp_path):
    with pytest.raises(ConfigError, match=r"data.tokenizer=.*'<s>'.*config key: data.bos_token"):
        resolve(_resolved(tmp_path, tokenizer_json, ("data.bos_token", "<s>")))
