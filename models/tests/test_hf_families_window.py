"""Parity with `transformers` for the sliding-window families: Mistral, Gemma 2, Gemma 3.

fp32 on the CPU, both directions, odd sizes (head_dim 8 is not hidden 30 / 6 heads; one KV
head for Mistral and Gemma 3), windows of 5 tokens, shorter than every test sequence. Models are
tiny and random, built locally from the literal configs of `hf_configs.py`.
"""

import equinox as eqx
import hf_harness as H
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from safetensors.numpy import load_file

import meltemi.models as mm
from meltemi.models import hf
from meltemi.models.hf import _keys as _hf_keys

FAMILIES = ["tiny-mistral", "tiny-gemma2", "tiny-gemma3"]
TOKENS = (np.arange(3 * 13).reshape(3, 13) * 7 + 2) % 67  # batch 3, seq 13, vocab 67
TOL = 1e-4


@eqx.filter_jit
def _logits(model, tokens):
    return model(tokens).array


def _all_tensors(directory):
    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update(load_file(f))
    return out


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request, tmp_path_factory):
    """(preset, HF model, its checkpoint dir, our model loaded from it)."""
    name = request.param
    torch_model = H.random_hf_model(name)
    directory = H.save_hf(torch_model, tmp_path_factory.mktemp(name))
    model, loaded_cfg = hf.load(directory)
    assert loaded_cfg == mm.get_preset(name)
    return name, torch_model, directory, model


def test_logits_match_transformers_for_its_checkpoint(pair):
    _, torch_model, _, model = pair
    np.testing.assert_allclose(
        np.asarray(_logits(model, TOKENS)), H.hf_logits(torch_model, TOKENS), atol=TOL, rtol=0
    )


def test_transformers_loads_our_checkpoint_with_our_logits(pair, tmp_path):
    _, _, _, model = pair
    rng = np.random.default_rng(3)  # move every parameter off the loaded values
    leaves, treedef = jax.tree.flatten(model)
    leaves = [np.asarray(x) + 0.1 * rng.standard_normal(x.shape, np.float32) for x in leaves]
    ours = jax.tree.unflatten(treedef, [jnp.asarray(x) for x in leaves])
    hf.save(ours, None, tmp_path)
    reloaded = H.load_hf(tmp_path)
    np.testing.assert_allclose(
        H.hf_logits(reloaded, TOKENS), np.asarray(_logits(ours, TOKENS)), atol=TOL, rtol=0
    )


def test_round_trip_through_our_save_is_bit_exact(pair, tmp_path):
    _, _, directory, model = pair
    hf.save(model, None, tmp_path)
    theirs, ours = _all_tensors(directory), _all_tensors(tmp_path)
    assert sorted(theirs) == sorted(ours)
    for k in theirs:
        np.testing.assert_array_equal(theirs[k], ours[k], err_msg=k)


def test_saved_config_equals_transformers_own_on_every_key(pair, tmp_path):
    _, _, directory, model = pair
    hf.save(model, None, tmp_path)
    ours = transformers.AutoConfig.from_pretrained(tmp_path).to_dict()
    theirs = transformers.AutoConfig.from_pretrained(directory).to_dict()
    keys = (set(ours) | set(theirs)) - {"_name_or_path"}
    assert {k: (ours.get(k), theirs.get(k)) for k in keys if ours.get(k) != theirs.get(k)} == {}


# Each option of these families changes the logits: dropping it from our config breaks parity.
# (Shows the parity tests above can fail on exactly what these families add.)
@pytest.mark.parametrize(
    "preset, change",
    [
        ("tiny-mistral", {"sliding_window": None}),
        ("tiny-gemma2", {"layer_types": ("sliding_attention",) * 3}),
        ("tiny-gemma2", {"attn_logit_softcap": None}),
        ("tiny-gemma2", {"final_logit_softcap": None}),
        ("tiny-gemma2", {"query_pre_attn_scalar": None}),
        ("tiny-gemma3", {"rope_local_theta": None}),
        ("tiny-gemma3", {"sliding_window": 13}),
    ],
)
def test_each_family_option_changes_the_logits(preset, change):
    torch_model = H.random_hf_model(preset)
    ref = H.hf_logits(torch_model, TOKENS)
    state = {k: v.numpy() for k, v in torch_model.state_dict().items()}
    cfg = mm.get_preset(preset).replace(**change)
    template = eqx.filter_eval_shape(mm.Transformer.init, cfg, key=jax.random.key(0))
    model, _, _, missing = _hf_keys.from_state_dict(template, state)
    assert not missing
    diff = np.abs(np.asarray(_logits(model, TOKENS)) - ref).max()
    assert diff > 100 * TOL, (change, diff)


@pytest.mark.parametrize(
    "preset, key, value, match",
    [
        ("tiny-gemma3", "attn_logit_softcapping", 50.0, r"attn_logit_softcapping=50.0.*Fix"),
        ("tiny-gemma2", "use_bidirectional_attention", True, r"use_bidirectional_attention=True"),
    ],
)
def test_options_we_cannot_match_are_refused_by_name(preset, key, value, match):
    d = mm.to_hf_config(mm.get_preset(preset)) | {key: value}
    with pytest.raises(mm.ConfigError, match=match):
        mm.from_hf_config(d)


def test_an_old_gemma3_config_with_top_level_rope_keys_loads():
    d = mm.to_hf_config(mm.get_preset("tiny-gemma3"))
    full = d.pop("rope_parameters")["full_attention"]
    d.pop("layer_types")
    d |= {
        "rope_theta": full["rope_theta"],
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        "rope_local_base_freq": 10_000.0,
        "sliding_window_pattern": 6,
    }
    assert mm.from_hf_config(d) == mm.get_preset("tiny-gemma3")
