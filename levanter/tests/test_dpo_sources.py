"""DPO from other starts and data: a Hugging Face checkpoint (`model.init_from_hf`) as policy
and live reference, and a mixture of two preference sources with per-component fractions.

Every run is `configs/dpo.py:smoke`'s tiny model for a few steps. The checkpoint is a random
`transformers` Llama of that size saved in the test (never downloaded); the two sources are
the shipped pairs split by word length.
"""

import json
import pathlib

import jax
import numpy as np
import pytest
import torch
import transformers

from meltemi.levanter.config import load_config
from meltemi.levanter.trainer import Trainer

CONFIGS = pathlib.Path(__file__).parent.parent / "configs"
DPO = f"{CONFIGS / 'dpo.py'}:smoke"
PAIRS = CONFIGS / "dpo_data"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("dpo_sources")


def _records(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _hf_checkpoint(directory: pathlib.Path) -> transformers.LlamaForCausalLM:
    """A random Llama with dpo.py:smoke's model config (259 byte-tokenizer ids), so the runs
    of this file compile one program (the persistent compilation cache shares it)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=259, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(directory)
    return model


def _abs_sum(arrays) -> float:
    return float(sum(np.abs(np.asarray(a, np.float64)).sum() for a in arrays))


def test_dpo_from_a_hf_checkpoint_uses_its_weights_as_the_live_reference(root):
    hf = _hf_checkpoint(root / "hf")
    config = load_config(DPO, [("run_dir", str(root / "from_hf")),
                               ("data.cache_dir", str(root / "cache")),
                               ("model.init_from_hf", str(root / "hf")),
                               ("trainer.num_train_steps", "3")])  # fmt: skip
    trainer = Trainer(config)
    result = trainer.run()
    # The reference holds the checkpoint's weights: the same number of values and the same
    # total magnitude as transformers' tensors (however the arrays are laid out).
    theirs = [t.detach().numpy() for t in hf.state_dict().values()]
    ours = jax.tree.leaves(trainer.state.reference)
    assert sum(a.size for a in ours) == sum(t.size for t in theirs)
    assert _abs_sum(ours) == pytest.approx(_abs_sum(theirs), rel=1e-6)
    # Step 1: the policy starts as the checkpoint too, so it equals its reference (loss log 2).
    assert result.losses[1] == pytest.approx(np.log(2), abs=1e-6)
    assert all(np.isfinite(v) for v in result.losses.values())
    assert result.losses[3] != result.losses[1]  # and it trains
    assert "rewards/accuracies" in result.eval["validation"]


def _split_by_length(root: pathlib.Path) -> dict[str, dict[str, pathlib.Path]]:
    """The shipped pairs as two sources: words of up to 4 letters, and longer ones."""
    out = {"short": {}, "long": {}}
    for split in ("train", "validation"):
        rows = [json.loads(x) for x in (PAIRS / f"{split}.jsonl").read_text().splitlines()]
        for name in out:
            keep = [r for r in rows
                    if (len(r["chosen"][0]["content"]) <= 7) == (name == "short")]  # fmt: skip
            path = root / f"{name}_{split}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in keep))
            out[name][split] = path
    return out


MIXTURE = """
from meltemi.levanter.config import mixture_component, sibling_config, with_variant


def get_config(variant=None):
    config = sibling_config({configs!r}, "dpo.py", variant="smoke")
    config.unlock()
    config.name = "dpo-mixture"
    config.data.source = "mixture"
    config.data.train_files = ()
    config.data.validation_files = ()
    config.data.components.short = mixture_component(
        "chat:{short[train]}", 0.75, validation="chat:{short[validation]}"
    )
    config.data.components.long = mixture_component(
        "chat:{long[train]}", 0.25, validation="chat:{long[validation]}"
    )
    return with_variant(config, variant, {{}})
"""


def test_dpo_on_a_mixture_of_two_preference_sources_logs_their_fractions(root):
    files = _split_by_length(root)
    path = root / "dpo_mixture.py"
    path.write_text(MIXTURE.format(configs=str(CONFIGS), **files))
    config = load_config(str(path), [("run_dir", str(root / "mixture")),
                                     ("data.cache_dir", str(root / "cache")),
                                     ("trainer.num_train_steps", "3")])  # fmt: skip
    trainer = Trainer(config)
    result = trainer.run()
    assert result.losses[1] == pytest.approx(np.log(2), abs=1e-6)
    records = [r for r in _records(root / "mixture") if "train/loss" in r]
    assert len(records) == 3
    for r in records:  # every step logs each component's share of its rows
        assert r["data/short/fraction"] + r["data/long/fraction"] == pytest.approx(1.0)
        assert "train/rewards/accuracies" in r
    # Over many rows the shares are the weights (the function the log uses, on 100k rows).
    shares = trainer.parts.data_metrics(np.arange(100_000))
    assert shares["data/short/fraction"] == pytest.approx(0.75, abs=0.01)
    assert shares["data/long/fraction"] == pytest.approx(0.25, abs=0.01)
    # Rows of either source hold whole pairs: each pair's chosen and rejected reply together.
    batch = trainer.host_batch(0)
    for row_ids, chosen, mask in zip(batch["pair_ids"], batch["is_chosen"], batch["loss_mask"]):
        trained = mask > 0
        for pair in set(row_ids[trained].tolist()):
            assert set(chosen[trained & (row_ids == pair)].tolist()) == {0, 1}
    # Each source's held-out pairs are an evaluation set of their own.
    assert set(result.eval) == {"short", "long"}
    assert all("rewards/accuracies" in ev for ev in result.eval.values())
