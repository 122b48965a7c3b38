"""The shipped DPO data and the presets the shipped configs share (no training).

`configs/dpo_data/make_pairs.py` reproduces the shipped pairs, and every pair fits one
`dpo.py` row, measured with the trainer's own encoder and packer (so `dpo.py` trains on all
600). `sibling_config` / `smoke_variant` (`meltemi.levanter.config`) are what `dpo.py`,
`sft.py`, `long_context.py` and `default.py` build their warm-start base and `:smoke` from.
"""

import json
import pathlib
import runpy
import types

import numpy as np
import pytest

from meltemi.data.chat import encode_preference
from meltemi.levanter.config import (
    SMOKE_MODEL,
    SMOKE_RUN,
    ConfigError,
    flatten,
    load_config,
    resolve,
    sibling_config,
    smoke_variant,
)
from meltemi.levanter.trainer._data import build_stores, chat_line, packed

CONFIGS = pathlib.Path(__file__).parent.parent / "configs"
PAIRS = CONFIGS / "dpo_data"


def _make_pairs() -> types.SimpleNamespace:
    """The names `dpo_data/make_pairs.py` defines (the script, run as a module would be)."""
    return types.SimpleNamespace(**runpy.run_path(str(PAIRS / "make_pairs.py")))


def _rows(name):
    return [json.loads(x) for x in (PAIRS / f"{name}.jsonl").read_text().splitlines()]


def test_make_pairs_reproduces_the_shipped_files():
    train, validation = _make_pairs().make()
    assert train == _rows("train") and validation == _rows("validation")
    assert len(train) == 600 and len(validation) == 64


def test_every_shipped_pair_fits_one_dpo_row():
    spec = resolve(load_config(str(CONFIGS / "dpo.py")))
    tokens = _make_pairs().tokens
    lengths = []
    for row in _rows("train") + _rows("validation"):
        pair = encode_preference(row["prompt"], row["chosen"], row["rejected"], spec.tokenizer,
                                 spec.data.template)  # fmt: skip
        n = len(pair.chosen.ids) + len(pair.rejected.ids)
        # make_pairs.py's own count (what it keeps pairs within) is the encoder's.
        assert n == sum(tokens(row["prompt"], row[k][0]["content"]) for k in ("chosen", "rejected"))
        lengths.append(n)
    print(f"pair tokens: max {max(lengths)}, mean {np.mean(lengths):.1f} (row {spec.data.seq_len})")
    assert max(lengths) <= spec.data.seq_len


def test_the_trainer_drops_no_shipped_pair(tmp_path):
    spec = resolve(load_config(str(CONFIGS / "dpo.py"), [("data.cache_dir", str(tmp_path))]))
    store, _ = build_stores(spec)
    dataset = packed(spec, store)
    assert store.num_documents == 600 and store.skipped_summary() is None
    assert dataset.overlong == {"dropped": 0, "truncated": 0}
    line = chat_line("train", dataset)  # what the trainer prints at start-up
    print(line)
    assert line.startswith("data: train: 600 preference pairs in 600 rows per epoch; longer")
    assert "data.seq_len=128: 0 dropped" in line


def test_sibling_config_is_the_sibling_files_config():
    sft = sibling_config(CONFIGS / "dpo.py", "sft.py")
    assert sft.name == "sft" and sft.data.source == "chat"
    smoke = sibling_config(CONFIGS, "default.py", variant="smoke")
    assert smoke.name == "default-smoke" and smoke.data.seq_len == 32


def test_sibling_config_names_a_missing_file():
    with pytest.raises(ConfigError, match=r"sibling_config\('nope.py'\): no such file .*nope.py"):
        sibling_config(CONFIGS / "dpo.py", "nope.py")


@pytest.mark.parametrize("name", ["default", "sft", "dpo", "long_context"])
def test_every_smoke_variant_is_the_smoke_model_and_run(name):
    values = flatten(load_config(f"{CONFIGS / name}.py:smoke").config)
    wanted = {"name": f"{name.replace('_', '-')}-smoke", **SMOKE_RUN, **SMOKE_MODEL}
    if name == "long_context":  # two 256-token rows per batch
        wanted.update({"trainer.train_batch_size": 2, "eval.batch_size": 2})
    assert {k: values[k] for k in wanted} == wanted


def test_smoke_variant_puts_the_extra_keys_last():
    v = smoke_variant("x", {"trainer.train_batch_size": 2, "data.seq_len": 32})
    assert v["trainer.train_batch_size"] == 2 and v["data.seq_len"] == 32
    assert v["model.num_layers"] == 2 and v["name"] == "x"
