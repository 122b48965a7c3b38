"""Analytic parameter and FLOP counts of a `ModelConfig` (no arrays are created)."""

from __future__ import annotations

from meltemi.models._config import ModelConfig


def _norm_params(config: ModelConfig) -> int:
    return 2 * config.hidden_dim if config.norm_kind == "layer" else config.hidden_dim


def _attention_params(config: ModelConfig) -> int:
    d, hd = config.hidden_dim, config.head_size
    q, kv = config.num_heads * hd, config.num_kv_heads * hd
    n = d * q + 2 * d * kv + q * d
    if config.use_bias:
        n += q + 2 * kv + d
    elif config.qkv_bias:  # Qwen2: q/k/v only
        n += q + 2 * kv
    if config.qk_norm:
        n += q + kv if config.qk_norm_whole else 2 * hd
    return n


def _mlp_params(config: ModelConfig, *, active: bool) -> int:
    d = config.hidden_dim
    if config.moe is not None:
        experts = config.moe.top_k if active else config.moe.num_experts
        return d * config.moe.num_experts + experts * 3 * d * config.moe.expert_dim
    i = config.intermediate_dim
    if config.gated_mlp:
        return 3 * d * i
    return 2 * d * i + (i + d if config.use_bias else 0)


def param_count(config: ModelConfig, *, active: bool = False, embeddings: bool = True) -> int:
    """Number of parameters of the model `config` describes.

    Args:
        config: the model.
        active: count only the `top_k` experts a token uses (MoE), not all of them.
        embeddings: include the token (and position) embeddings and an untied output head.

    >>> from meltemi.models import get_preset
    >>> round(param_count(get_preset("marin-8b")) / 1e9, 2)
    8.03
    """
    d = config.hidden_dim
    norms = 2 * int(config.pre_norms) + 2 * int(config.post_norms)
    block = (
        _attention_params(config)
        + _mlp_params(config, active=active)
        + norms * _norm_params(config)
    )
    n = config.num_layers * block + _norm_params(config)
    if embeddings:
        n += config.vocab_size * d
        if not config.tie_embeddings:
            n += config.vocab_size * d
        if not config.uses_rope:
            n += config.max_seq_len * d
    return n


def flops_per_token(config: ModelConfig, seq_len: int, *, training: bool = True) -> float:
    """Model FLOPs per token: `2N` forward matmul FLOPs plus causal attention, x3 for training.

    `N` counts the active non-embedding parameters plus the output projection (the input
    embedding is a gather, not a matmul). Attention adds `2 * 2 * seq_len * heads * head_dim`
    per layer for QK^T and AV over the full (unmasked) key length, as in the PaLM appendix.

    >>> from meltemi.models import get_preset
    >>> cfg = get_preset("marin-8b")
    >>> f"{flops_per_token(cfg, 4096) / 1e9:.1f} GFLOP"
    '51.5 GFLOP'
    """
    n = param_count(config, active=True, embeddings=False) + config.vocab_size * config.hidden_dim
    attention = 4 * seq_len * config.num_heads * config.head_size * config.num_layers
    forward = 2 * n + attention
    return float(3 * forward if training else forward)
