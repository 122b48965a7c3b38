"""Every rope scaling against `transformers` (`modeling_rope_utils.py`), at positions beyond
the original context: the rotation alone, whole models' logits, and KV-cache generation.

The HF side is built from literal `rope_parameters` dicts, read on our side with
`from_hf_config`, so the translation of each key is tested along with the formulas.
"""

import hf_harness as H
import numpy as np
import pytest
import torch
import transformers
from transformers.models.llama import modeling_llama
from transformers.models.phi3 import modeling_phi3

import meltemi.haliax as hax
import meltemi.models as mm
from meltemi.models import hf
from meltemi.models._config import RopeConfig
from meltemi.models._rope import Rotary

HEAD = 8  # rotated halves of 4 frequencies
OLD = 16  # the original context; every test runs past it
SCALINGS = {
    "default": {"rope_type": "default", "rope_theta": 10_000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10_000.0, "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10_000.0, "factor": 3.0},
    "yarn": {
        "rope_type": "yarn",
        "rope_theta": 10_000.0,
        "factor": 4.0,
        "original_max_position_embeddings": OLD,
        "beta_fast": 8.0,
        "beta_slow": 1.0,
    },
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 500_000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": OLD,
    },
    "longrope": {
        "rope_type": "longrope",
        "rope_theta": 10_000.0,
        "original_max_position_embeddings": OLD,
        "short_factor": [1.0, 1.3, 1.9, 2.4],
        "long_factor": [1.5, 2.5, 4.0, 7.0],
    },
}


def _hf_config(rope: dict, *, max_position: int, **extra) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        vocab_size=67,
        hidden_size=30,
        intermediate_size=44,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=1,
        head_dim=HEAD,
        max_position_embeddings=max_position,
        rms_norm_eps=1e-5,
        rope_parameters=dict(rope),
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        architectures=["LlamaForCausalLM"],
        **extra,
    )


def _ours(config: transformers.LlamaConfig) -> mm.ModelConfig:
    return mm.from_hf_config(config.to_dict())


def _rotate_hf(config, q, positions, apply=modeling_llama.apply_rotary_pos_emb):
    rotary = modeling_llama.LlamaRotaryEmbedding(config)
    pos = torch.tensor(positions)[None]
    cos, sin = rotary(torch.tensor(q), pos)
    out, _ = apply(torch.tensor(q), torch.tensor(q), cos, sin)
    return out.numpy()


def _rotate_ours(rope: RopeConfig, q, positions):
    Heads, Pos, Head = hax.Axis("heads", q.shape[1]), hax.Axis("position", q.shape[2]), None  # noqa: N806
    Head = hax.Axis("head_size", q.shape[3])  # noqa: N806
    x = hax.named(q[0], (Heads, Pos, Head))
    out = Rotary(rope, Head.size)(x, hax.named(np.asarray(positions), (Pos,)), "head_size")
    return np.asarray(out.array)[None]


@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_rotation_matches_transformers_beyond_the_original_context(kind):
    # dynamic grows past max_position_embeddings: keep it at the original context.
    config = _hf_config(SCALINGS[kind], max_position=OLD if kind == "dynamic" else 4 * OLD)
    rope = _ours(config).rope
    assert rope.scaling == kind
    q = np.random.default_rng(0).standard_normal((1, 3, 9, HEAD)).astype(np.float32)
    positions = [0, 5, 15, 16, 17, 30, 41, 50, 60]  # straddles OLD = 16
    np.testing.assert_allclose(
        _rotate_ours(rope, q, positions), _rotate_hf(config, q, positions), atol=1e-5, rtol=0
    )


def test_scalings_differ_from_plain_rope_past_the_context():
    # Guards the test above against comparing two unscaled rotations.
    q = np.random.default_rng(1).standard_normal((1, 2, 4, HEAD)).astype(np.float32)
    positions = [20, 33, 47, 60]
    plain = _rotate_ours(RopeConfig(), q, positions)
    for kind in ("linear", "dynamic", "yarn", "longrope"):
        config = _hf_config(SCALINGS[kind], max_position=OLD if kind == "dynamic" else 4 * OLD)
        assert np.abs(_rotate_ours(_ours(config).rope, q, positions) - plain).max() > 1e-2, kind


@pytest.mark.parametrize("factor", [0.5, 0.25])
def test_partial_rotation_matches_transformers(factor):
    # Llama's rotary embedding gives cos/sin for the rotated part; Phi-3's apply rotates the
    # first int(head * factor) entries and passes the rest, as ours does.
    config = _hf_config(SCALINGS["yarn"] | {"partial_rotary_factor": factor}, max_position=4 * OLD)
    rope = RopeConfig(
        scaling="yarn",
        factor=4.0,
        original_max_position=OLD,
        beta_fast=8.0,
        partial_rotary_factor=factor,
    )
    q = np.random.default_rng(2).standard_normal((1, 2, 5, 16)).astype(np.float32)
    config.head_dim = 16
    positions = [1, 16, 25, 40, 63]
    ref = _rotate_hf(config, q, positions, apply=modeling_phi3.apply_rotary_pos_emb)
    ours = _rotate_ours(rope, q, positions)
    np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=0)
    keep = int(16 * factor)
    np.testing.assert_array_equal(ours[..., keep:], q[..., keep:])


def test_partial_rotary_factor_of_a_llama_config_is_refused():
    d = _hf_config(SCALINGS["default"], max_position=OLD).to_dict()
    d["partial_rotary_factor"] = 0.5
    d["rope_parameters"]["partial_rotary_factor"] = 0.5
    with pytest.raises(mm.ConfigError, match="partial_rotary_factor=0.5"):
        mm.from_hf_config(d)


def _random_llama(config, seed):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.3 if "norm" in name else 0.2
            p.copy_((1.0 if "norm" in name else 0.0) + scale * torch.randn_like(p))
    return model


@pytest.mark.parametrize("kind", ["linear", "dynamic", "yarn", "longrope"])
def test_model_logits_match_transformers_past_the_context(kind, tmp_path):
    config = _hf_config(SCALINGS[kind], max_position=OLD if kind == "dynamic" else 4 * OLD)
    torch_model = _random_llama(config, seed=3)
    model, cfg = hf.load(H.save_hf(torch_model, tmp_path))
    assert cfg.rope.scaling == kind
    tokens = (np.arange(2 * 29).reshape(2, 29) * 5 + 3) % 67  # 29 positions > OLD
    np.testing.assert_allclose(
        np.asarray(model(tokens).array), H.hf_logits(torch_model, tokens), atol=1e-4, rtol=0
    )
    # Our export reads back into the same transformers config.
    hf.save(model, None, tmp_path / "ours")
    again = transformers.AutoConfig.from_pretrained(tmp_path / "ours")
    assert (
        again.rope_parameters == transformers.AutoConfig.from_pretrained(tmp_path).rope_parameters
    )


@pytest.mark.parametrize("kind", ["dynamic", "longrope"])
def test_generation_across_the_context_boundary_equals_transformers(kind, tmp_path):
    # Both recompute frequencies from the longest position of each call: the prompt (12) is
    # inside the original context, the generated tokens run past it.
    config = _hf_config(SCALINGS[kind], max_position=OLD if kind == "dynamic" else 4 * OLD)
    torch_model = _random_llama(config, seed=4)
    model, _ = hf.load(H.save_hf(torch_model, tmp_path))
    prompt = [3, 17, 29, 4, 41, 8, 9, 10, 11, 12, 13, 14]
    with torch.no_grad():
        ref = torch_model.generate(
            torch.tensor([prompt]),
            max_new_tokens=10,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    assert mm.generate(model, [prompt], max_new_tokens=10, eos_token_id=None)[0] == ref
