"""Named model presets: real sizes (Marin, Mixtral, GPT-2, Gemma, Qwen3-MoE) and tiny test ones.

Variants are overrides of a base (`_BASE.replace(...)`), never copies.
"""

from __future__ import annotations

import difflib

from meltemi.models._config import (
    LLAMA3_ROPE,
    ConfigError,
    ModelConfig,
    MoeConfig,
    RopeConfig,
)

_LLAMA3_VOCAB = 128_256

_MARIN_8B = ModelConfig(
    family="llama",
    vocab_size=_LLAMA3_VOCAB,
    hidden_dim=4096,
    intermediate_dim=14336,
    num_layers=32,
    num_heads=32,
    num_kv_heads=8,
    max_seq_len=4096,
    rope=LLAMA3_ROPE,
    bos_token_id=128_000,
    eos_token_id=128_001,
)
_MARIN_32B = _MARIN_8B.replace(
    hidden_dim=5120, intermediate_dim=27648, num_layers=64, num_heads=40, num_kv_heads=8
)

_TINY_LLAMA = ModelConfig(
    family="llama",
    vocab_size=67,
    hidden_dim=30,
    intermediate_dim=44,
    num_layers=3,
    num_heads=6,
    num_kv_heads=2,
    head_dim=8,
    max_seq_len=64,
    rope=RopeConfig(theta=10_000.0),
    bos_token_id=1,
    eos_token_id=2,
)
_TINY_MOE = MoeConfig(num_experts=5, top_k=2, expert_dim=12)

_PRESETS: dict[str, ModelConfig] = {
    "marin-8b": _MARIN_8B,
    "marin-32b": _MARIN_32B,
    "marin-32b-qk": _MARIN_32B.replace(family="qwen3", qk_norm=True),
    "mixtral-8x7b": _MARIN_8B.replace(
        family="mixtral",
        vocab_size=32_000,
        max_seq_len=32_768,
        rope=RopeConfig(theta=1_000_000.0),
        # router_aux_loss_coef of the published Mixtral-8x7B-v0.1 config.json
        moe=MoeConfig(num_experts=8, top_k=2, expert_dim=14336, load_balancing_coef=0.02),
        bos_token_id=1,
        eos_token_id=2,
    ),
    "qwen3-30b-a3b": ModelConfig(
        family="qwen3_moe",
        vocab_size=151_936,
        hidden_dim=2048,
        intermediate_dim=6144,
        num_layers=48,
        num_heads=32,
        num_kv_heads=4,
        head_dim=128,
        max_seq_len=40_960,
        norm_eps=1e-6,
        rope=RopeConfig(theta=1_000_000.0),
        qk_norm=True,
        # router_aux_loss_coef of the published Qwen3-30B-A3B config.json
        moe=MoeConfig(num_experts=128, top_k=8, expert_dim=768, load_balancing_coef=0.001),
        bos_token_id=151_643,
        eos_token_id=151_645,
    ),
    "gpt2-small": ModelConfig(
        family="gpt2",
        vocab_size=50_257,
        hidden_dim=768,
        intermediate_dim=3072,
        num_layers=12,
        num_heads=12,
        num_kv_heads=12,
        max_seq_len=1024,
        activation="gelu_tanh",
        tie_embeddings=True,
        bos_token_id=50_256,
        eos_token_id=50_256,
    ),
    "gemma-2b": ModelConfig(
        family="gemma",
        vocab_size=256_000,
        hidden_dim=2048,
        intermediate_dim=16384,
        num_layers=18,
        num_heads=8,
        num_kv_heads=1,
        head_dim=256,
        max_seq_len=8192,
        activation="gelu_tanh",
        norm_eps=1e-6,
        tie_embeddings=True,
        bos_token_id=2,
        eos_token_id=1,
    ),
    # Tiny presets for tests: odd, distinct sizes so that a transposed axis cannot hide.
    "tiny-llama": _TINY_LLAMA,
    "tiny-llama3": _TINY_LLAMA.replace(
        rope=RopeConfig(theta=500_000.0, llama3_factor=8.0, original_max_position=16),
        tie_embeddings=True,
    ),
    "tiny-qwen3": _TINY_LLAMA.replace(family="qwen3", qk_norm=True, norm_eps=1e-6),
    # Mixtral's `intermediate_size` is the expert width.
    "tiny-mixtral": _TINY_LLAMA.replace(
        family="mixtral", intermediate_dim=_TINY_MOE.expert_dim, moe=_TINY_MOE
    ),
    "tiny-qwen3-moe": _TINY_LLAMA.replace(
        family="qwen3_moe", qk_norm=True, moe=_TINY_MOE.replace(norm_topk_prob=False)
    ),
    "tiny-gpt2": _TINY_LLAMA.replace(
        family="gpt2",
        num_heads=5,
        num_kv_heads=5,
        head_dim=None,
        activation="gelu_tanh",
        tie_embeddings=True,
    ),
    "tiny-gemma": _TINY_LLAMA.replace(
        family="gemma", activation="gelu_tanh", norm_eps=1e-6, tie_embeddings=True
    ),
    # Sliding windows of 5 tokens, shorter than the test sequences; one KV head.
    "tiny-mistral": _TINY_LLAMA.replace(
        family="mistral", num_kv_heads=1, norm_eps=1e-6, sliding_window=5
    ),
    # Local / global / local layers; soft caps small enough to bite at these weights.
    "tiny-gemma2": _TINY_LLAMA.replace(
        family="gemma2",
        activation="gelu_tanh",
        norm_eps=1e-6,
        tie_embeddings=True,
        sliding_window=5,
        attn_logit_softcap=3.0,
        final_logit_softcap=4.0,
        query_pre_attn_scalar=7.0,
    ),
    # Five local layers to one global; the global rope is scaled (linear), the local is not.
    "tiny-gemma3": _TINY_LLAMA.replace(
        family="gemma3_text",
        activation="gelu_tanh",
        norm_eps=1e-6,
        tie_embeddings=True,
        num_layers=6,
        num_kv_heads=1,
        qk_norm=True,
        sliding_window=5,
        query_pre_attn_scalar=12.0,
        rope=RopeConfig(theta=1_000_000.0, scaling="linear", factor=2.0),
        rope_local_theta=10_000.0,
    ),
    # Qwen2: q/k/v biases; one KV head (head_dim 8 is not hidden 30 / 6 heads).
    "tiny-qwen2": _TINY_LLAMA.replace(family="qwen2", num_kv_heads=1, norm_eps=1e-6),
    # OLMo 2: norms after attention and MLP, QK-norm over the whole projection; one KV head.
    "tiny-olmo2": _TINY_LLAMA.replace(family="olmo2", num_kv_heads=1, qk_norm=True),
}


def list_presets() -> list[str]:
    """Names of every preset, sorted.

    >>> "marin-8b" in list_presets()
    True
    """
    return sorted(_PRESETS)


def get_preset(name: str) -> ModelConfig:
    """The config registered under `name`; an unknown name suggests the closest one.

    >>> get_preset("marin-32b").hidden_dim
    5120
    >>> get_preset("marin-32b-qk").qk_norm
    True
    """
    try:
        return _PRESETS[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(_PRESETS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown model preset {name!r}.{hint} Known: {list_presets()}") from None
