"""The engine's greedy tokens against `transformers`' `generate` on the same weights, for every
family (the tiny preset of each: biases, post-norms, QK-norm, soft caps, local/global layers,
learned positions, mixtures of experts)."""

import hf_harness as H
import pytest

import meltemi.models as mm
from meltemi.models import hf
from meltemi.models.engine import Engine, EngineConfig, Request

PROMPTS = [[3, 17, 29, 4, 41, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19], [5, 60], [7, 1, 33]]
CONFIG = EngineConfig(kv_bytes=1 << 20, page_size=8, max_seqs=4, prefill_chunk=8, max_seq_len=48)


@pytest.mark.parametrize("preset", [p for p in mm.list_presets() if p.startswith("tiny-")])
def test_greedy_tokens_equal_transformers(preset, tmp_path):
    torch_model = H.random_hf_model(preset, seed=5)
    model, _ = hf.load(H.save_hf(torch_model, tmp_path))
    ref = H.hf_generate(torch_model, PROMPTS, 20, None)
    engine = Engine(model, CONFIG)
    ids = [engine.submit(Request(PROMPTS[0], 20, stop_ids=()))]
    engine.step()  # the others arrive while the first decodes
    ids += [engine.submit(Request(p, 20, stop_ids=())) for p in PROMPTS[1:]]
    out = engine.run_until_done()
    assert [out[i][0] for i in ids] == ref


def test_stop_ids_end_samples_as_transformers_eos(tmp_path):
    torch_model = H.random_hf_model("tiny-llama", seed=6)
    model, _ = hf.load(H.save_hf(torch_model, tmp_path))
    free = H.hf_generate(torch_model, PROMPTS, 12, None)
    eos = [free[0][2], free[1][5], 66]
    ref = H.hf_generate(torch_model, PROMPTS, 12, eos)
    engine = Engine(model, CONFIG)
    ids = [engine.submit(Request(p, 12, stop_ids=eos)) for p in PROMPTS]
    out = engine.run_until_done()
    assert [out[i][0] for i in ids] == ref
