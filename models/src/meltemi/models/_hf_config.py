"""Mapping between `ModelConfig` and Hugging Face `config.json` dicts, per family."""

from __future__ import annotations

from typing import Any

from meltemi.models._config import ConfigError, ModelConfig, MoeConfig, RopeConfig

# family -> (HF model_type, HF architecture class)
HF_TYPES: dict[str, tuple[str, str]] = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "mixtral": ("mixtral", "MixtralForCausalLM"),
    "qwen3_moe": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "gpt2": ("gpt2", "GPT2LMHeadModel"),
    "gemma": ("gemma", "GemmaForCausalLM"),
}
_FAMILY_OF_TYPE = {model_type: family for family, (model_type, _) in HF_TYPES.items()}

# HF activation names -> ours. gelu_new / gelu_pytorch_tanh are the same tanh approximation.
_ACT_FROM_HF = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}


class HfConfigError(ConfigError):
    """A Hugging Face `config.json` uses a model type or option this library cannot represent."""


HfConfigError.__module__ = "meltemi.models"


def _act_to_hf(config: ModelConfig) -> str:
    if config.activation == "gelu_tanh":
        return "gelu_new" if config.family == "gpt2" else "gelu_pytorch_tanh"
    return config.activation


def _rope_to_hf(rope: RopeConfig) -> dict[str, Any]:
    if not rope.is_llama3:
        return {"rope_type": "default", "rope_theta": rope.theta}
    return {
        "rope_type": "llama3",
        "rope_theta": rope.theta,
        "factor": rope.llama3_factor,
        "low_freq_factor": rope.low_freq_factor,
        "high_freq_factor": rope.high_freq_factor,
        "original_max_position_embeddings": rope.original_max_position,
    }


def to_hf_config(config: ModelConfig) -> dict[str, Any]:
    """The Hugging Face `config.json` dict (transformers 5 layout) describing `config`.

    >>> from meltemi.models import get_preset
    >>> d = to_hf_config(get_preset("marin-32b-qk"))
    >>> d["model_type"], d["hidden_size"], d["num_key_value_heads"]
    ('qwen3', 5120, 8)
    >>> d["rope_parameters"]["rope_type"]
    'llama3'
    """
    model_type, arch = HF_TYPES[config.family]
    out: dict[str, Any] = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "initializer_range": config.initializer_range,
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "dtype": "float32",
    }
    if config.family == "gpt2":
        out.update(
            n_embd=config.hidden_dim,
            n_inner=config.intermediate_dim,
            n_layer=config.num_layers,
            n_head=config.num_heads,
            n_positions=config.max_seq_len,
            activation_function=_act_to_hf(config),
            layer_norm_epsilon=config.norm_eps,
            scale_attn_weights=True,
            scale_attn_by_inverse_layer_idx=False,
            reorder_and_upcast_attn=False,
        )
        return out
    rope = _rope_to_hf(config.rope)
    out.update(
        hidden_size=config.hidden_dim,
        intermediate_size=config.intermediate_dim,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_size,
        max_position_embeddings=config.max_seq_len,
        hidden_act=_act_to_hf(config),
        rms_norm_eps=config.norm_eps,
        # transformers >= 5 reads rope_parameters; older releases read rope_theta/rope_scaling.
        rope_parameters=rope,
        rope_theta=config.rope.theta,
    )
    if config.rope.is_llama3:
        out["rope_scaling"] = dict(rope)
    if config.family in ("llama", "qwen3", "qwen3_moe", "gemma"):
        out["attention_bias"] = False  # Mixtral's config has no such option
    if config.family == "llama":
        out["mlp_bias"] = False
    moe = config.moe
    if config.family == "mixtral":
        assert moe is not None
        out.update(
            intermediate_size=moe.expert_dim,
            num_local_experts=moe.num_experts,
            num_experts_per_tok=moe.top_k,
            router_aux_loss_coef=moe.load_balancing_coef,
        )
    if config.family == "qwen3_moe":
        assert moe is not None
        out.update(
            moe_intermediate_size=moe.expert_dim,
            num_experts=moe.num_experts,
            num_experts_per_tok=moe.top_k,
            norm_topk_prob=moe.norm_topk_prob,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            router_aux_loss_coef=moe.load_balancing_coef,
        )
    if config.family in ("qwen3", "qwen3_moe"):
        out.update(use_sliding_window=False, sliding_window=None)
    return out


def _get(d: dict[str, Any], *names: str, default: Any = KeyError) -> Any:
    for name in names:
        if name in d and d[name] is not None:
            return d[name]
    if default is KeyError:
        raise HfConfigError(
            f"config.json of model_type {d.get('model_type')!r} has none of {list(names)}; "
            "is it a complete Hugging Face config?"
        )
    return default


def _rope_from_hf(d: dict[str, Any]) -> RopeConfig:
    params = d.get("rope_parameters") or {}
    legacy = d.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", d.get("rope_theta", 10_000.0)))
    kind = params.get("rope_type") or legacy.get("rope_type") or legacy.get("type") or "default"
    if kind == "default":
        return RopeConfig(theta=theta)
    if kind != "llama3":
        raise HfConfigError(
            f"config.json rope type {kind!r} is not supported (only 'default' and 'llama3'); "
            "convert the checkpoint or add the scaling to meltemi.models"
        )
    src = params if "factor" in params else legacy
    return RopeConfig(
        theta=theta,
        llama3_factor=float(src["factor"]),
        low_freq_factor=float(src.get("low_freq_factor", 1.0)),
        high_freq_factor=float(src.get("high_freq_factor", 4.0)),
        original_max_position=int(src.get("original_max_position_embeddings", 8192)),
    )


def _first_id(value: Any) -> int | None:
    if isinstance(value, list):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def from_hf_config(d: dict[str, Any]) -> ModelConfig:
    """The `ModelConfig` a Hugging Face `config.json` dict describes.

    >>> from meltemi.models import get_preset
    >>> cfg = get_preset("tiny-qwen3-moe")
    >>> from_hf_config(to_hf_config(cfg)) == cfg
    True
    """
    model_type = d.get("model_type")
    if model_type not in _FAMILY_OF_TYPE:
        raise HfConfigError(
            f"config.json model_type={model_type!r} is not supported; supported: "
            f"{sorted(_FAMILY_OF_TYPE)}"
        )
    family = _FAMILY_OF_TYPE[model_type]
    act_name = _get(d, "activation_function", "hidden_act", "hidden_activation", default="silu")
    if family == "gemma":
        # Official Gemma configs say hidden_act="gelu" but mean the tanh approximation, as
        # transformers does; a hidden_activation key, where present, takes precedence.
        act_name = d.get("hidden_activation") or act_name
        act_name = "gelu_pytorch_tanh" if act_name == "gelu" else act_name
    if act_name not in _ACT_FROM_HF:
        raise HfConfigError(
            f"config.json activation {act_name!r} is not supported; supported: "
            f"{sorted(_ACT_FROM_HF)}"
        )
    common: dict[str, Any] = dict(
        family=family,
        vocab_size=int(_get(d, "vocab_size")),
        activation=_ACT_FROM_HF[act_name],
        initializer_range=float(d.get("initializer_range", 0.02)),
        bos_token_id=_first_id(d.get("bos_token_id")),
        eos_token_id=_first_id(d.get("eos_token_id")),
    )
    if family == "gpt2":
        for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if d.get(flag):
                raise HfConfigError(f"config.json sets {flag}=true, which is not supported")
        if d.get("scale_attn_weights") is False:
            raise HfConfigError("config.json sets scale_attn_weights=false, which is not supported")
        hidden = int(_get(d, "n_embd", "hidden_size"))
        heads = int(_get(d, "n_head", "num_attention_heads"))
        return ModelConfig(
            **common,
            hidden_dim=hidden,
            intermediate_dim=int(d.get("n_inner") or 4 * hidden),
            num_layers=int(_get(d, "n_layer", "num_hidden_layers")),
            num_heads=heads,
            num_kv_heads=heads,
            max_seq_len=int(_get(d, "n_positions", "max_position_embeddings")),
            norm_eps=float(d.get("layer_norm_epsilon", 1e-5)),
            tie_embeddings=bool(d.get("tie_word_embeddings", True)),
        )
    if d.get("attention_bias") or d.get("mlp_bias"):
        raise HfConfigError(
            f"config.json ({model_type}) sets attention_bias/mlp_bias=true, which is not supported"
        )
    if d.get("use_sliding_window"):
        raise HfConfigError(f"config.json ({model_type}) uses a sliding window; not supported")
    hidden = int(_get(d, "hidden_size"))
    heads = int(_get(d, "num_attention_heads"))
    moe = None
    intermediate = int(_get(d, "intermediate_size", "moe_intermediate_size"))
    if family == "mixtral":
        moe = MoeConfig(
            num_experts=int(_get(d, "num_local_experts", "num_experts")),
            top_k=int(_get(d, "num_experts_per_tok")),
            expert_dim=intermediate,
            norm_topk_prob=True,
            load_balancing_coef=float(d.get("router_aux_loss_coef", 0.01)),
        )
    if family == "qwen3_moe":
        if d.get("mlp_only_layers") or int(d.get("decoder_sparse_step", 1)) != 1:
            raise HfConfigError(
                "config.json (qwen3_moe) mixes dense and sparse layers (mlp_only_layers / "
                "decoder_sparse_step); only all-MoE stacks are supported"
            )
        moe = MoeConfig(
            num_experts=int(_get(d, "num_experts", "num_local_experts")),
            top_k=int(_get(d, "num_experts_per_tok")),
            expert_dim=int(_get(d, "moe_intermediate_size")),
            norm_topk_prob=bool(d.get("norm_topk_prob", False)),
            load_balancing_coef=float(d.get("router_aux_loss_coef", 0.01)),
        )
    default_tie = family == "gemma"
    head_dim = int(d.get("head_dim") or hidden // heads)
    return ModelConfig(
        **common,
        hidden_dim=hidden,
        intermediate_dim=intermediate,
        num_layers=int(_get(d, "num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=int(d.get("num_key_value_heads") or heads),
        # `None` when it is the default, so that configs round-trip exactly.
        head_dim=None if head_dim == hidden // heads else head_dim,
        max_seq_len=int(_get(d, "max_position_embeddings", default=4096)),
        norm_eps=float(_get(d, "rms_norm_eps", default=1e-6)),
        rope=_rope_from_hf(d),
        tie_embeddings=bool(d.get("tie_word_embeddings", default_tie)),
        qk_norm=family in ("qwen3", "qwen3_moe"),
        moe=moe,
    )
