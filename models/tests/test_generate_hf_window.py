"""Cached greedy generation of the sliding-window families equals `transformers`' `generate`.

Prompts of different lengths (left-padded, as transformers pads them) and 12 new tokens: the
sequences run far past the 5-token windows, so every layer's window (and Gemma's local/global
alternation) decides which cache slots a new token sees.
"""

import equinox as eqx
import hf_harness as H
import jax
import pytest

import meltemi.models as mm
from meltemi.models.hf import _keys as _hf_keys

FAMILIES = ["tiny-mistral", "tiny-gemma2", "tiny-gemma3"]


PROMPTS = [[3, 17, 29, 4, 41, 8, 9, 10, 11, 12, 13], [5, 60], [7, 1, 33]]


@pytest.mark.parametrize("preset", FAMILIES)
def test_cached_greedy_generation_equals_transformers_generate(preset):
    torch_model = H.random_hf_model(preset, seed=5)
    state = {k: v.numpy() for k, v in torch_model.state_dict().items()}
    template = eqx.filter_eval_shape(
        mm.Transformer.init, mm.get_preset(preset), key=jax.random.key(0)
    )
    model = _hf_keys.from_state_dict(template, state)[0]
    ref = H.hf_generate(torch_model, PROMPTS, 12)  # 11 + 12 tokens: far past the window of 5
    assert mm.generate(model, PROMPTS, max_new_tokens=12, eos_token_id=None) == ref
