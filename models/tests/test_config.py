"""Config validation, presets and the HF config mapping (no arrays, no torch)."""

import pytest

from meltemi.models import (
    ConfigError,
    HfConfigError,
    ModelConfig,
    MoeConfig,
    RopeConfig,
    from_hf_config,
    get_preset,
    list_presets,
    param_count,
    to_hf_config,
)


def test_presets_round_trip_through_hf_config():
    for name in list_presets():
        cfg = get_preset(name)
        assert from_hf_config(to_hf_config(cfg)) == cfg, name


def _sizes(cfg):
    return (
        cfg.family,
        cfg.vocab_size,
        cfg.hidden_dim,
        cfg.intermediate_dim,
        cfg.num_layers,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_size,
        cfg.qk_norm,
        cfg.activation,
        cfg.tie_embeddings,
        cfg.rope,
    )


def test_marin_presets_have_the_issue_sizes():
    # Literal values (Marin 8B / 32B from the issue, Llama 3 vocabulary and rope scaling);
    # never derived from another preset's definition.
    rope = RopeConfig(theta=500_000.0, llama3_factor=8.0, original_max_position=8192)
    assert _sizes(get_preset("marin-8b")) == (
        "llama", 128_256, 4096, 14336, 32, 32, 8, 128, False, "silu", False, rope
    )  # fmt: skip
    assert _sizes(get_preset("marin-32b")) == (
        "llama", 128_256, 5120, 27648, 64, 40, 8, 128, False, "silu", False, rope
    )  # fmt: skip
    assert _sizes(get_preset("marin-32b-qk")) == (
        "qwen3", 128_256, 5120, 27648, 64, 40, 8, 128, True, "silu", False, rope
    )  # fmt: skip


def test_unknown_preset_suggests_the_closest_name():
    with pytest.raises(ConfigError, match="Did you mean 'marin-8b'"):
        get_preset("marin-8")


def test_replace_with_a_typo_suggests_the_field():
    with pytest.raises(ConfigError, match="Did you mean 'num_kv_heads'"):
        get_preset("tiny-llama").replace(num_kv_head=1)


def test_kv_heads_must_divide_heads():
    with pytest.raises(ConfigError, match=r"num_kv_heads=4: must divide num_heads=6"):
        get_preset("tiny-llama").replace(num_kv_heads=4)


def test_qk_norm_is_rejected_on_llama_with_the_fix():
    with pytest.raises(ConfigError, match='qk_norm=True.*family="qwen3"'):
        get_preset("tiny-llama").replace(qk_norm=True)


def test_moe_family_requires_moe_settings():
    with pytest.raises(ConfigError, match=r"moe=None: family 'mixtral' is a mixture of experts"):
        get_preset("tiny-llama").replace(family="mixtral")


def test_top_k_above_num_experts_is_rejected():
    with pytest.raises(ConfigError, match=r"MoeConfig.top_k=6: exceeds num_experts=5"):
        MoeConfig(num_experts=5, top_k=6, expert_dim=4)


def test_odd_head_size_is_rejected_with_rope():
    with pytest.raises(ConfigError, match="even head size"):
        get_preset("tiny-llama").replace(head_dim=7)


def test_unknown_family_suggests_one():
    with pytest.raises(ConfigError, match='family="llama"'):
        get_preset("tiny-llama").replace(family="lama")


def test_bad_remat_policy_is_rejected():
    with pytest.raises(ConfigError, match="remat='some'"):
        get_preset("tiny-llama").replace(remat="some")


def test_capacity_rounds_up_and_caps_at_group_size():
    moe = MoeConfig(num_experts=5, top_k=2, expert_dim=4, capacity_factor=1.0)
    assert moe.capacity(13) == 6  # ceil(13 * 2 / 5)
    assert moe.replace(capacity_factor=100.0).capacity(13) == 13


def test_from_dict_inverts_to_dict_and_rejects_unknown_keys():
    cfg = get_preset("tiny-qwen3-moe")
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match=r"unknown keys \['hidden'\]"):
        ModelConfig.from_dict({**cfg.to_dict(), "hidden": 3})


def test_hf_config_reads_legacy_rope_scaling():
    d = to_hf_config(get_preset("marin-8b"))
    d.pop("rope_parameters")
    assert from_hf_config(d).rope == RopeConfig(theta=500_000.0, llama3_factor=8.0)


def test_hf_config_rejects_unknown_model_type():
    with pytest.raises(HfConfigError, match=r"model_type='bert' is not supported"):
        from_hf_config({"model_type": "bert"})


def test_hf_config_rejects_unsupported_rope_type():
    d = to_hf_config(get_preset("tiny-llama"))
    d["rope_parameters"] = {"rope_type": "proportional", "rope_theta": 1.0, "factor": 2.0}
    with pytest.raises(HfConfigError, match="rope_type='proportional' is not supported"):
        from_hf_config(d)


def test_moe_active_count_is_smaller_than_total():
    cfg = get_preset("mixtral-8x7b")
    total, active = param_count(cfg), param_count(cfg, active=True)
    assert round(total / 1e9, 1) == 46.7 and round(active / 1e9, 1) == 12.9


def test_legacy_gemma_gelu_means_the_tanh_approximation():
    d = to_hf_config(get_preset("gemma-2b"))
    d["hidden_act"] = "gelu"
    assert from_hf_config(d).activation == "gelu_tanh"
