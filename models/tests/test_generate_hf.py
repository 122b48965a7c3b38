"""Compiled generation against `transformers`' `generate`, side by side on the same weights.

Both directions of the checkpoint are covered: a model built in `transformers` and read with
`hf.load`, and one of ours written with `hf.save` and read with `from_pretrained`. Batches mix
prompt lengths (HF left-pads with an attention mask, as we do) and stop on a list of eos ids.
"""

import hf_harness as H
import model_testing as T
import pytest

import meltemi.models as mm
from meltemi.models import hf

PROMPTS = [[3, 17, 29, 4, 41, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19], [5, 60], [7, 1, 33]]


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3", "tiny-gpt2"])
def test_greedy_batch_equals_transformers_token_for_token(preset, tmp_path):
    torch_model = H.random_hf_model(preset, seed=5)
    model, _ = hf.load(H.save_hf(torch_model, tmp_path))
    ref = H.hf_generate(torch_model, PROMPTS, 20, None)
    assert mm.generate(model, PROMPTS, max_new_tokens=20, eos_token_id=None) == ref
    assert [len(r) for r in ref] == [20, 20, 20]


def test_eos_lists_stop_rows_as_in_transformers(tmp_path):
    torch_model = H.random_hf_model("tiny-llama", seed=6)
    model, _ = hf.load(H.save_hf(torch_model, tmp_path))
    free = H.hf_generate(torch_model, PROMPTS, 12, None)
    eos = [free[0][2], free[1][5], 66]  # row 0 stops at its 3rd token, row 1 by its 6th
    ref = H.hf_generate(torch_model, PROMPTS, 12, eos)
    assert len(ref[0]) <= 3 and len(ref[1]) <= 6
    assert mm.generate(model, PROMPTS, max_new_tokens=12, eos_token_id=eos) == ref


def test_our_checkpoint_generates_the_same_in_transformers(tmp_path):
    cfg = mm.get_preset("tiny-llama")
    model = T.random_model(cfg, seed=7)
    hf.save(model, cfg, tmp_path)
    ref = H.hf_generate(H.load_hf(tmp_path), PROMPTS, 16, None)
    assert mm.generate(model, PROMPTS, max_new_tokens=16, eos_token_id=None) == ref
