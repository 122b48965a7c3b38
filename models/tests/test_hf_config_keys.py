"""Nothing in a Hugging Face `config.json` is silently ignored: every key is used, listed as
irrelevant (with a reason, in one place), or refused with an error naming it and its value."""

import json

import pytest
import transformers
from hf_configs import reference_config

import meltemi.models as mm
from meltemi.models.hf._config import _from_hf_config
from meltemi.models.hf._config_keys import IRRELEVANT_KEYS, TrackedConfig


def _llama() -> dict:
    return json.loads(reference_config("tiny-llama").to_json_string())


@pytest.mark.parametrize("name", mm.list_presets())
def test_every_key_transformers_writes_is_accounted_for(name):
    # to_json_string() is what save_pretrained writes: every default key of the config class.
    d = json.loads(reference_config(name).to_json_string(use_diff=False))
    assert mm.from_hf_config(d) == mm.from_hf_config(mm.to_hf_config(mm.get_preset(name)))


@pytest.mark.parametrize(
    "key, value",
    [("attn_logit_softcapping", 30.0), ("scale_embeddings", True), ("rope_foo", 2.0)],
)
def test_an_unknown_option_is_refused_naming_key_and_value(key, value):
    d = _llama() | {key: value}
    with pytest.raises(mm.HfConfigError, match=rf"sets {key}={value!r}, an option"):
        mm.from_hf_config(d)


def test_the_same_config_without_the_option_loads():
    # The refusal above is about the key, not the rest of the config.
    assert mm.from_hf_config(_llama()) == mm.get_preset("tiny-llama")


def test_gemma_query_pre_attn_scalar_is_not_ignored():
    # Gemma 1 has no such option: transformers' GemmaAttention scales by head_dim ** -0.5
    # whatever the key says, so a Gemma-1 config carrying it cannot be loaded as meant.
    d = json.loads(reference_config("tiny-gemma").to_json_string()) | {"query_pre_attn_scalar": 144}
    with pytest.raises(mm.HfConfigError, match="query_pre_attn_scalar=144"):
        mm.from_hf_config(d)


def test_gemma_partial_rotary_factor_is_not_ignored():
    d = json.loads(reference_config("tiny-gemma").to_json_string())
    d["partial_rotary_factor"] = 0.5
    with pytest.raises(mm.HfConfigError, match=r"partial_rotary_factor=0\.5"):
        mm.from_hf_config(d)


def test_a_rope_key_its_type_does_not_use_is_refused():
    d = _llama()
    d["rope_parameters"] = {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0, "beta": 3}
    with pytest.raises(mm.HfConfigError, match=r"rope 'linear' has keys \['beta'\]"):
        mm.from_hf_config(d)


def test_an_unknown_rope_type_names_the_supported_ones():
    d = _llama()
    d["rope_parameters"] = {"rope_type": "proportional", "rope_theta": 1e4}
    with pytest.raises(mm.HfConfigError, match="rope_type='proportional' is not supported"):
        mm.from_hf_config(d)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("attention_bias", True, "attention_bias=True"),
        ("mlp_bias", True, "mlp_bias=True"),
    ],
)
def test_unsupported_values_of_used_keys_are_refused(key, value, message):
    with pytest.raises(mm.HfConfigError, match=message):
        mm.from_hf_config(_llama() | {key: value})


def test_qwen3_sliding_window_is_refused_and_mixtral_window_too():
    qwen3 = json.loads(reference_config("tiny-qwen3").to_json_string())
    with pytest.raises(mm.HfConfigError, match="use_sliding_window=true"):
        mm.from_hf_config(qwen3 | {"use_sliding_window": True, "sliding_window": 4})
    mixtral = json.loads(reference_config("tiny-mixtral").to_json_string())
    with pytest.raises(mm.HfConfigError, match="sliding_window=4"):
        mm.from_hf_config(mixtral | {"sliding_window": 4})


def test_null_values_mean_unset():
    assert mm.from_hf_config(_llama() | {"some_future_key": None}) == mm.get_preset("tiny-llama")


def test_every_irrelevant_key_has_a_reason_and_none_is_read_by_the_llama_path():
    assert all(isinstance(r, str) and len(r) > 10 for r in IRRELEVANT_KEYS.values())
    # A key both listed as irrelevant and read would be ambiguous; the llama path reads none.
    d = TrackedConfig(_llama())
    _from_hf_config(d)
    assert not (d.used & set(IRRELEVANT_KEYS)), d.used & set(IRRELEVANT_KEYS)


def test_transformers_loads_the_exported_config_of_every_preset_unchanged():
    # The strict reader is also the round-trip of the exporter.
    for name in mm.list_presets():
        cfg = mm.get_preset(name)
        d = mm.to_hf_config(cfg)
        again = transformers.AutoConfig.for_model(d.pop("model_type"), **d).to_json_string()
        assert mm.from_hf_config(json.loads(again)) == mm.from_hf_config(mm.to_hf_config(cfg))
