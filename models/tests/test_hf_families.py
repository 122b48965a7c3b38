"""Qwen2 (q/k/v biases) and OLMo 2 (post-norms, QK-norm over the whole projection) against
`transformers` in float32: load, save, bit-exact round trip and KV-cache greedy generation.

The tiny presets have one KV head and a head size (8) that is not hidden / heads (30 / 6).
The HF models are built from the literal configs of `hf_configs.py` with random weights,
biases and norm weights, so an unloaded bias or a misplaced norm changes the logits.
"""

import equinox as eqx
import hf_harness as H
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from hf_configs import reference_config
from safetensors.numpy import load_file

import meltemi.models as mm
from meltemi.models import hf

PRESETS = ["tiny-qwen2", "tiny-olmo2"]
TOKENS = (np.arange(3 * 13).reshape(3, 13) * 7 + 2) % 67  # batch 3, seq 13, vocab 67
TOL = 1e-4
PROMPTS = [[3, 17, 29, 4, 41, 8, 9, 10, 11], [5, 60], [7, 1, 33]]


@eqx.filter_jit
def _logits(model, tokens):
    return model(tokens).array


@pytest.fixture(scope="module", params=PRESETS)
def pair(request, tmp_path_factory):
    name = request.param
    torch_model = H.random_hf_model(name, seed=11)
    directory = H.save_hf(torch_model, tmp_path_factory.mktemp(name))
    model, cfg = hf.load(directory)
    assert cfg == mm.get_preset(name)
    return name, torch_model, directory, model


def test_logits_match_transformers_for_its_checkpoint(pair):
    _, torch_model, _, model = pair
    np.testing.assert_allclose(
        np.asarray(_logits(model, TOKENS)), H.hf_logits(torch_model, TOKENS), atol=TOL, rtol=0
    )


def test_transformers_loads_our_checkpoint_with_our_logits(pair, tmp_path):
    _, _, _, model = pair
    rng = np.random.default_rng(4)
    leaves, treedef = jax.tree.flatten(model)
    leaves = [np.asarray(x) + 0.1 * rng.standard_normal(x.shape, np.float32) for x in leaves]
    ours = jax.tree.unflatten(treedef, [jnp.asarray(x) for x in leaves])
    hf.save(ours, None, tmp_path)
    np.testing.assert_allclose(
        H.hf_logits(H.load_hf(tmp_path), TOKENS),
        np.asarray(_logits(ours, TOKENS)),
        atol=TOL,
        rtol=0,
    )


def test_round_trip_through_our_save_is_bit_exact(pair, tmp_path):
    _, _, directory, model = pair
    hf.save(model, None, tmp_path)
    theirs, ours = load_file(directory / "model.safetensors"), {}
    for f in tmp_path.glob("*.safetensors"):
        ours.update(load_file(f))
    assert sorted(theirs) == sorted(ours)
    for k in theirs:
        np.testing.assert_array_equal(theirs[k], ours[k], err_msg=k)


def test_family_specific_tensors_are_in_the_checkpoint(pair):
    name, _, directory, _ = pair
    keys = set(load_file(directory / "model.safetensors"))
    layer = "model.layers.0."
    if name == "tiny-qwen2":
        assert {layer + f"self_attn.{p}_proj.bias" for p in "qkv"} <= keys
        assert layer + "self_attn.o_proj.bias" not in keys
    else:
        assert layer + "post_feedforward_layernorm.weight" in keys
        assert layer + "input_layernorm.weight" not in keys
        # QK-norm over all heads at once: 6 heads x 8 for q, 1 KV head x 8 for k.
        shapes = {k: v.shape for k, v in load_file(directory / "model.safetensors").items()}
        assert shapes[layer + "self_attn.q_norm.weight"] == (48,)
        assert shapes[layer + "self_attn.k_norm.weight"] == (8,)


def test_kv_cache_greedy_generation_equals_transformers(pair):
    _, torch_model, _, model = pair
    ref = H.hf_generate(torch_model, PROMPTS, 12)
    assert mm.generate(model, PROMPTS, max_new_tokens=12, eos_token_id=None) == ref


def test_qwen2_sliding_window_layers_match_transformers(tmp_path):
    # use_sliding_window with max_window_layers=1: layer 0 global, layers 1-2 slide over 4
    # positions (shorter than the 13 of the input).
    ref = reference_config("tiny-qwen2").to_dict()
    config = transformers.Qwen2Config(
        **ref
        | dict(use_sliding_window=True, sliding_window=4, max_window_layers=1)
        | dict(layer_types=None)
    )
    torch.manual_seed(0)
    torch_model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for name, p in torch_model.named_parameters():
            p.copy_((1.0 if "norm" in name else 0.0) + 0.2 * torch.randn_like(p))
    model, cfg = hf.load(H.save_hf(torch_model, tmp_path))
    assert cfg.sliding_window == 4
    assert cfg.layer_types == ("full_attention", "sliding_attention", "sliding_attention")
    np.testing.assert_allclose(
        np.asarray(_logits(model, TOKENS)), H.hf_logits(torch_model, TOKENS), atol=TOL, rtol=0
    )
    # The window changes the logits (so the comparison above is not one of full attention).
    full = transformers.AutoModelForCausalLM.from_config(reference_config("tiny-qwen2"))
    full.load_state_dict(torch_model.state_dict())
    assert (
        np.abs(H.hf_logits(full.float().eval(), TOKENS) - H.hf_logits(torch_model, TOKENS)).max()
        > 0.1
    )
    hf.save(model, None, tmp_path / "ours")
    assert hf.load_config(tmp_path / "ours") == cfg
