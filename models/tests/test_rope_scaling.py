"""Rope scaling by config (`RopeConfig.scaled`, a Hugging Face `rope_scaling` dict) against
`transformers`' rotary embedding at long-context sizes: Llama 3 (8k -> 64k) and YaRN
(4k -> 64k), inverse frequencies bit for bit and cos/sin within 1e-6 up to position 131,071."""

import numpy as np
import pytest
import torch
import transformers
from transformers.models.llama import modeling_llama

import meltemi.haliax as hax
from meltemi.models import ConfigError, RopeConfig
from meltemi.models._rope import Rotary

HEAD = 128
THETA = 500_000.0
SCALINGS = {
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "yarn": {
        "rope_type": "yarn",
        "factor": 16.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    },
}
POSITIONS = [0, 1, 4095, 4096, 8191, 8192, 40_000, 65_535, 131_071]


def _hf(scaling: dict) -> modeling_llama.LlamaRotaryEmbedding:
    config = transformers.LlamaConfig(
        hidden_size=HEAD * 2,
        num_attention_heads=2,
        head_dim=HEAD,
        max_position_embeddings=131_072,
        rope_parameters={"rope_theta": THETA, **scaling},
    )
    return modeling_llama.LlamaRotaryEmbedding(config)


def _ours(scaling: dict) -> Rotary:
    return Rotary(RopeConfig(theta=THETA).scaled(scaling), HEAD)


def _cos_sin(rotary: Rotary) -> tuple[np.ndarray, np.ndarray]:
    # Rotating (1, ..., 1 | 0, ..., 0) gives (cos | sin) at each position.
    Pos, Head = hax.Axis("position", len(POSITIONS)), hax.Axis("head_size", HEAD)  # noqa: N806
    half = np.concatenate([np.ones(HEAD // 2), np.zeros(HEAD // 2)]).astype(np.float32)
    x = hax.named(np.tile(half, (len(POSITIONS), 1)), (Pos, Head))
    out = np.asarray(rotary(x, hax.named(np.asarray(POSITIONS), (Pos,)), "head_size").array)
    return out[:, : HEAD // 2], out[:, HEAD // 2 :]


@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_inverse_frequencies_equal_transformers_bit_for_bit(kind):
    # Bit for bit: at position 131,071 one ulp of an inverse frequency moves an angle by
    # ~0.008 rad (float32 angles), far beyond the 1e-6 asked of cos/sin.
    hf = _hf(SCALINGS[kind])
    inv, scale = _ours(SCALINGS[kind]).static_frequencies()
    np.testing.assert_array_equal(inv, hf.inv_freq.numpy())
    assert scale == pytest.approx(hf.attention_scaling, abs=1e-6)


@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_cos_sin_match_transformers_to_128k(kind):
    hf = _hf(SCALINGS[kind])
    x = torch.zeros(1, len(POSITIONS), HEAD)
    cos, sin = hf(x, torch.tensor(POSITIONS)[None])
    ours_cos, ours_sin = _cos_sin(_ours(SCALINGS[kind]))
    np.testing.assert_allclose(ours_cos, cos[0, :, : HEAD // 2].numpy(), atol=1e-6, rtol=0)
    np.testing.assert_allclose(ours_sin, sin[0, :, : HEAD // 2].numpy(), atol=1e-6, rtol=0)


def test_scaling_changes_the_long_wavelengths_only():
    # Guards the comparisons above against two unscaled ropes: the scaled inverse frequencies
    # equal plain RoPE's at the highest frequency and are slower at the lowest.
    plain, _ = Rotary(RopeConfig(theta=THETA), HEAD).static_frequencies()
    for kind in SCALINGS:
        inv, _ = _ours(SCALINGS[kind]).static_frequencies()
        assert inv[0] == pytest.approx(plain[0], rel=1e-6)
        assert inv[-1] < plain[-1] / 7.9


def test_scaled_keeps_theta_and_rejects_what_a_type_does_not_use():
    rope = RopeConfig(theta=THETA).scaled(SCALINGS["llama3"])
    assert (rope.scaling, rope.theta, rope.llama3_factor) == ("llama3", THETA, 8.0)
    with pytest.raises(ConfigError, match=r"rope_type 'llama3' does not use \['beta_fast'\]"):
        RopeConfig().scaled({**SCALINGS["llama3"], "beta_fast": 32.0})
    with pytest.raises(ConfigError, match=r'unknown rope_type .yarm.\. Fix: "rope_type": "yarn"'):
        RopeConfig().scaled({"rope_type": "yarm", "factor": 2.0})
    with pytest.raises(ConfigError, match=r"rope_type 'yarn' needs its 'factor'"):
        RopeConfig().scaled({"rope_type": "yarn"})
