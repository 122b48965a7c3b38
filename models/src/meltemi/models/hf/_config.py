"""Mapping between `ModelConfig` and Hugging Face `config.json` dicts, per family."""

from __future__ import annotations

from typing import Any

from meltemi.models._config import (
    ModelConfig,
    MoeConfig,
    RopeConfig,
    sliding_layer_types,
)
from meltemi.models._families import FAMILY_FACTS, FAMILY_OF_MODEL_TYPE, FamilyFacts, families_with
from meltemi.models.hf._config_keys import HfConfigError, TrackedConfig, check_all_used

# transformers' Qwen2Config default: without `layer_types`, layers from this index on slide.
_QWEN_MAX_WINDOW_LAYERS = 28

# HF activation names -> ours. gelu_new / gelu_pytorch_tanh are the same tanh approximation.
_ACT_FROM_HF = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}


def _act_to_hf(config: ModelConfig) -> str:
    if config.activation == "gelu_tanh":
        return config.facts.hf_gelu_tanh
    return config.activation


# rope_type -> the keys transformers reads for it (besides rope_type / type / rope_theta).
_ROPE_KEYS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": (
        "factor",
        "original_max_position_embeddings",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    ),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "longrope": (
        "short_factor",
        "long_factor",
        "factor",
        "attention_factor",
        "original_max_position_embeddings",
    ),
}


def _rope_to_hf(rope: RopeConfig, max_position: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"rope_type": rope.scaling, "rope_theta": rope.theta}
    kind = rope.scaling
    if kind == "llama3":
        out.update(
            factor=rope.llama3_factor,
            low_freq_factor=rope.low_freq_factor,
            high_freq_factor=rope.high_freq_factor,
            original_max_position_embeddings=rope.original_max_position,
        )
    elif kind in ("linear", "dynamic"):
        out["factor"] = rope.factor
    elif kind == "yarn":
        out.update(
            factor=rope.factor,
            original_max_position_embeddings=rope.original_max_position,
            beta_fast=rope.beta_fast,
            beta_slow=rope.beta_slow,
        )
        if not rope.truncate:  # transformers' default is True
            out["truncate"] = False
    elif kind == "longrope":
        if max_position is None or rope.factor != max_position / rope.original_max_position:
            out["factor"] = rope.factor  # else transformers derives the same value
        out.update(
            original_max_position_embeddings=rope.original_max_position,
            short_factor=list(rope.short_factor or ()),
            long_factor=list(rope.long_factor or ()),
        )
    for name in ("attention_factor", "mscale", "mscale_all_dim"):
        if getattr(rope, name) is not None and kind in ("yarn", "longrope"):
            out[name] = getattr(rope, name)
    return out


def _rope_from_hf(d: dict[str, Any], max_position: int) -> RopeConfig:
    """The rope of a config, as transformers 5 standardises it: `rope_scaling` (old name)
    wins over `rope_parameters`; `rope_theta` / `partial_rotary_factor` /
    `original_max_position_embeddings` at the top level fill in what the dict lacks."""
    legacy, current = d.get("rope_scaling"), d.get("rope_parameters")
    params = dict(legacy or current or {})
    model_type = d.get("model_type")
    if params and all(isinstance(v, dict) for v in params.values()):
        raise HfConfigError(
            f"config.json ({model_type}) has rope_parameters per layer type {sorted(params)}; "
            "only one rope for all layers is supported for this model_type"
        )
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if kind not in _ROPE_KEYS:
        raise HfConfigError(
            f"config.json ({model_type}) rope_type={kind!r} is not supported; supported: "
            f"{sorted(_ROPE_KEYS)}"
        )
    top_theta = d.get("rope_theta")
    theta = float(params.pop("rope_theta", None) or top_theta or 10_000.0)
    partial = params.pop("partial_rotary_factor", None)
    if partial is None:
        partial = d.get("partial_rotary_factor")
    unknown = sorted(set(params) - set(_ROPE_KEYS[kind]))
    if unknown:
        raise HfConfigError(
            f"config.json ({model_type}) rope {kind!r} has keys {unknown} "
            f"(values {[params[k] for k in unknown]}) that {kind!r} does not use; its keys: "
            f"{list(_ROPE_KEYS[kind])}"
        )
    top_old = d.get("original_max_position_embeddings")
    old = int(top_old or params.get("original_max_position_embeddings") or max_position)
    partial = float(1.0 if partial is None else partial)
    rope = RopeConfig(theta=theta, partial_rotary_factor=partial)
    if kind == "default":
        return rope
    if kind == "llama3":
        return rope.replace(
            llama3_factor=float(params["factor"]),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position=old,
        )
    if kind in ("linear", "dynamic"):
        # dynamic grows past max_position_embeddings (transformers ignores an "original").
        return rope.replace(
            scaling=kind,
            factor=float(params["factor"]),
            original_max_position=max_position if kind == "dynamic" else rope.original_max_position,
        )
    factor = params.get("factor")
    factor = float(max_position / old if factor is None else factor)
    attention = params.get("attention_factor")
    common = dict(
        scaling=kind,
        factor=factor,
        original_max_position=old,
        attention_factor=None if attention is None else float(attention),
    )
    if kind == "yarn":
        return rope.replace(
            **common,
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            mscale=params.get("mscale"),
            mscale_all_dim=params.get("mscale_all_dim"),
            truncate=bool(params.get("truncate", True)),
        )
    return rope.replace(
        **common,
        short_factor=tuple(float(v) for v in params["short_factor"]),
        long_factor=tuple(float(v) for v in params["long_factor"]),
    )


def to_hf_config(config: ModelConfig) -> dict[str, Any]:
    """The Hugging Face `config.json` dict (transformers 5 layout) describing `config`.

    >>> from meltemi.models import get_preset
    >>> d = to_hf_config(get_preset("marin-32b-qk"))
    >>> d["model_type"], d["hidden_size"], d["num_key_value_heads"]
    ('qwen3', 5120, 8)
    >>> d["rope_parameters"]["rope_type"]
    'llama3'
    """
    facts = config.facts
    model_type, arch = facts.hf_model_type, facts.hf_architecture
    out: dict[str, Any] = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "initializer_range": config.initializer_range,
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": _ids_to_hf(config.eos_token_id),
        "dtype": "float32",
    }
    if facts.hf_layout == "gpt2":
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
    if config.rope.partial_rotary_factor != 1.0:
        raise HfConfigError(
            f"RopeConfig.partial_rotary_factor={config.rope.partial_rotary_factor}: transformers' "
            f"{model_type} rotates whole heads, so it could not load this model. Fix: "
            "partial_rotary_factor=1.0 to export to Hugging Face"
        )
    rope = _rope_to_hf(config.rope, config.max_seq_len)
    out.update(
        hidden_size=config.hidden_dim,
        intermediate_size=config.intermediate_dim,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_size,
        # Dynamic NTK rope grows its base past max_position_embeddings (its original context).
        max_position_embeddings=(
            config.rope.original_max_position
            if config.rope.scaling == "dynamic"
            else config.max_seq_len
        ),
        hidden_act=_act_to_hf(config),
        rms_norm_eps=config.norm_eps,
        # transformers >= 5 reads rope_parameters; older releases read rope_theta/rope_scaling.
        rope_parameters=rope,
        rope_theta=config.rope.theta,
    )
    if config.rope.scaling != "default":
        out["rope_scaling"] = dict(rope)
    if facts.hf_attention_bias_key:
        out["attention_bias"] = False  # Mixtral's config has no such option
    if facts.hf_mlp_bias_key:
        out["mlp_bias"] = False
    moe = config.moe
    if facts.moe == "mixtral":
        assert moe is not None
        out.update(
            intermediate_size=moe.expert_dim,
            num_local_experts=moe.num_experts,
            num_experts_per_tok=moe.top_k,
            router_aux_loss_coef=moe.load_balancing_coef,
        )
    if facts.moe == "qwen3_moe":
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
    if facts.hf_window_keys == "qwen" and not facts.sliding_window:
        out.update(use_sliding_window=False, sliding_window=None)
    if facts.hf_window_keys == "qwen" and facts.sliding_window:
        sliding = config.sliding_window is not None
        out.update(
            use_sliding_window=sliding,
            sliding_window=config.sliding_window,
            max_window_layers=config.num_layers,
            layer_types=[
                "sliding_attention" if s else "full_attention" for s in config.sliding_layers
            ],
        )
    _window_families_to_hf(config, out)
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


def _ids_to_hf(value: int | tuple[int, ...] | None) -> int | list[int] | None:
    return list(value) if isinstance(value, tuple) else value


def _ids(value: Any) -> int | tuple[int, ...] | None:
    """An id or a list of ids (HF's eos_token_id) as `ModelConfig` keeps it."""
    if isinstance(value, list):
        ids = tuple(int(v) for v in value)
        return None if not ids else ids[0] if len(ids) == 1 else ids
    return None if value is None else int(value)


def _sliding_from_hf(d: dict[str, Any], facts: FamilyFacts) -> dict[str, Any]:
    """Qwen's sliding-window options (`use_sliding_window`, `sliding_window`,
    `max_window_layers`, `layer_types`), and a `sliding_window` key of a family without
    windows (Mixtral), which is refused when set."""
    model_type = d.get("model_type")
    if facts.hf_window_keys == "sliding_window" and not facts.sliding_window:
        if d.get("sliding_window") is not None:
            raise HfConfigError(
                f"config.json ({model_type}) sets sliding_window={d.get('sliding_window')!r}; "
                f"sliding windows are not supported for {model_type}. Fix: sliding_window=null"
            )
        return {}
    if facts.hf_window_keys != "qwen":
        return {}
    types = d.get("layer_types")
    d.get("max_window_layers")  # only shapes the default layer_types below
    if not d.get("use_sliding_window"):
        d.get("sliding_window")  # transformers sets it to None without use_sliding_window
        if types and any(t != "full_attention" for t in types):
            raise HfConfigError(
                f"config.json ({model_type}) sets layer_types={types!r} with "
                "use_sliding_window=false; expected every layer 'full_attention'"
            )
        return {}
    if not facts.sliding_window:
        raise HfConfigError(
            f"config.json ({model_type}) sets use_sliding_window=true; sliding windows are "
            f"supported for {', '.join(families_with(sliding_window=True))}, not {model_type}"
        )
    window = int(_get(d, "sliding_window"))
    num_layers = int(_get(d, "num_hidden_layers"))
    if not types:
        start = d.get("max_window_layers")
        start = _QWEN_MAX_WINDOW_LAYERS if start is None else int(start)
        types = ["sliding_attention" if i >= start else "full_attention" for i in range(num_layers)]
    return {"sliding_window": window, "layer_types": tuple(types)}


def _first_id(value: Any) -> int | None:
    if isinstance(value, list):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def from_hf_config(d: dict[str, Any]) -> ModelConfig:
    """The `ModelConfig` a Hugging Face `config.json` dict describes.

    Every key is accounted for: read into the config (options we cannot represent raise),
    or listed in `_config_keys.IRRELEVANT_KEYS`; any other key raises `HfConfigError`
    naming it and its value.

    >>> from meltemi.models import get_preset
    >>> cfg = get_preset("tiny-qwen3-moe")
    >>> from_hf_config(to_hf_config(cfg)) == cfg
    True
    """
    tracked = TrackedConfig(d)
    config = _from_hf_config(tracked)
    fp8_block_size(tracked)  # the weights' storage, not the model: validated, read by hf.load
    check_all_used(tracked)
    return config


# -- quantization_config: block-scaled FP8 checkpoints are dequantized on load -----------------
_FP8_KEYS = frozenset(
    {
        "quant_method",
        "fmt",
        "activation_scheme",
        "weight_block_size",
        "scale_fmt",
        "dequantize",
        "expert_dtype",
        # Which tensors are float8: the checkpoint's dtypes say it tensor by tensor.
        "modules_to_not_convert",
        "ignored_layers",
        "modules_to_convert",
    }
)
_UNQUANTIZED_FIX = (
    "Fix: load the unquantized (bfloat16) checkpoint the quantized one was made from, or "
    "dequantize it with transformers first (from_pretrained(dir, dtype=torch.bfloat16), then "
    "save_pretrained)"
)


def fp8_block_size(d: dict[str, Any]) -> tuple[int, int] | None:
    """The `[rows, cols]` block of a block-scaled FP8 checkpoint (DeepSeek-V3 / Qwen3-FP8
    style: `quantization_config = {"quant_method": "fp8", "weight_block_size": [128, 128],
    ...}`), which `hf.load` dequantizes on load; `None` without a `quantization_config`.

    Any other quantization (gptq, awq, bitsandbytes, per-tensor fp8 without a block size,
    static activation scales) raises `HfConfigError` naming the key, its value and the fix.

    >>> fp8_block_size({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
    ...     "activation_scheme": "dynamic", "weight_block_size": [128, 128]}})
    (128, 128)
    >>> fp8_block_size({"quantization_config": {"quant_method": "awq", "bits": 4}})
    Traceback (most recent call last):
    ...
    meltemi.models.HfConfigError: config.json sets quantization_config.quant_method='awq'; ...
    """
    q = d.get("quantization_config")
    if q is None or q == {}:
        return None
    if not isinstance(q, dict):
        raise HfConfigError(f"config.json sets quantization_config={q!r}, which is not a dict")
    method = q.get("quant_method")
    if method != "fp8":
        raise HfConfigError(
            f"config.json sets quantization_config.quant_method={method!r}; meltemi.models "
            "reads only block-scaled FP8 checkpoints (quant_method 'fp8' with a "
            f"weight_block_size), which it dequantizes on load. {_UNQUANTIZED_FIX}"
        )
    unknown = sorted(set(q) - _FP8_KEYS)
    if unknown:
        raise HfConfigError(
            f"config.json sets quantization_config.{unknown[0]}={q[unknown[0]]!r}, an fp8 "
            f"option meltemi.models does not know (it knows {sorted(_FP8_KEYS)}). "
            f"{_UNQUANTIZED_FIX}"
        )
    block = q.get("weight_block_size")
    if not (
        isinstance(block, (list, tuple))
        and len(block) == 2
        and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
    ):
        raise HfConfigError(
            f"config.json sets quantization_config.weight_block_size={block!r}; only "
            "block-scaled FP8 (two positive ints, e.g. [128, 128]) is supported, not per-tensor "
            f"or per-channel scales. {_UNQUANTIZED_FIX}"
        )
    checks = {
        "activation_scheme": ("dynamic",),  # static: activation scales the math would need
        "fmt": ("e4m3", "e5m2"),  # the tensors' own dtype is read from the shards
        "scale_fmt": ("float", "ue8m0"),
        "expert_dtype": ("fp8",),
    }
    for key, allowed in checks.items():
        value = q.get(key)
        if value is not None and str(value).lower() not in allowed:
            raise HfConfigError(
                f"config.json sets quantization_config.{key}={value!r}; block-scaled FP8 "
                f"loads only with {key} in {list(allowed)}. {_UNQUANTIZED_FIX}"
            )
    return int(block[0]), int(block[1])


def _from_hf_config(d: dict[str, Any]) -> ModelConfig:
    model_type = d.get("model_type")
    if model_type not in FAMILY_OF_MODEL_TYPE:
        raise HfConfigError(
            f"config.json model_type={model_type!r} is not supported; supported: "
            f"{sorted(FAMILY_OF_MODEL_TYPE)}"
        )
    family = FAMILY_OF_MODEL_TYPE[model_type]
    facts = FAMILY_FACTS[family]
    act_name = _get(d, "activation_function", "hidden_act", "hidden_activation", default="silu")
    if facts.hf_gelu_means_tanh:
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
        eos_token_id=_ids(d.get("eos_token_id")),
    )
    if facts.hf_layout == "gpt2":
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
            norm_eps=float(d.get("layer_norm_epsilon", facts.default_norm_eps)),
            tie_embeddings=bool(d.get("tie_word_embeddings", facts.default_tie_embeddings)),
        )
    for flag in ("attention_bias", "mlp_bias"):
        if d.get(flag) and facts.bias != "qkv":  # Qwen2's q/k/v biases are built in
            qkv = ", ".join(families_with(bias="qkv"))
            raise HfConfigError(
                f"config.json ({model_type}) sets {flag}={d.get(flag)!r}; biases are not "
                f"supported for {model_type} ({qkv} has q/k/v biases). Fix: {flag}=false"
            )
    sliding = _sliding_from_hf(d, facts)
    hidden = int(_get(d, "hidden_size"))
    heads = int(_get(d, "num_attention_heads"))
    moe = None
    intermediate = int(_get(d, "intermediate_size", "moe_intermediate_size"))
    if facts.moe == "mixtral":
        moe = MoeConfig(
            num_experts=int(_get(d, "num_local_experts", "num_experts")),
            top_k=int(_get(d, "num_experts_per_tok")),
            expert_dim=intermediate,
            norm_topk_prob=True,
            load_balancing_coef=float(d.get("router_aux_loss_coef", 0.01)),
        )
    if facts.moe == "qwen3_moe":
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
    head_dim = int(d.get("head_dim") or hidden // heads)
    max_seq_len = int(_get(d, "max_position_embeddings", default=4096))
    window = _window_families_from_hf(d, facts, max_seq_len)
    rope = window.pop("rope") if "rope" in window else _rope_from_hf(d, max_seq_len)
    if rope.partial_rotary_factor != 1.0:
        raise HfConfigError(
            f"config.json ({model_type}) sets partial_rotary_factor="
            f"{rope.partial_rotary_factor}; transformers' {model_type} rotates whole heads (its "
            "rotary code cannot apply a partial rotation), so no working checkpoint has it. "
            "Fix: remove the key (or 1.0)"
        )
    if rope.scaling == "dynamic":
        # Its base grows past max_position_embeddings (the original context): the model is
        # meant for factor x that, which bounds our KV cache.
        max_seq_len = int(max_seq_len * rope.factor)
    return ModelConfig(
        **common,
        hidden_dim=hidden,
        intermediate_dim=intermediate,
        num_layers=int(_get(d, "num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=int(d.get("num_key_value_heads") or heads),
        # `None` when it is the default, so that configs round-trip exactly.
        head_dim=None if head_dim == hidden // heads else head_dim,
        max_seq_len=max_seq_len,
        norm_eps=float(_get(d, "rms_norm_eps", default=facts.default_norm_eps)),
        rope=rope,
        tie_embeddings=bool(d.get("tie_word_embeddings", facts.default_tie_embeddings)),
        qk_norm=facts.qk_norm != "none",
        moe=moe,
        **sliding,
        **window,
    )


# -- gemma2 / gemma3_text / mistral: sliding windows, soft caps, Gemma 3's two ropes ----------
def _window_families_to_hf(config: ModelConfig, out: dict[str, Any]) -> None:
    """Adds the options of Gemma 2, Gemma 3 and Mistral to `out` (transformers 5 layout)."""
    facts = config.facts
    if not facts.sliding_window or facts.hf_window_keys not in ("sliding_window", "gemma"):
        return
    out["sliding_window"] = config.sliding_window
    if facts.hf_window_keys != "gemma":
        return
    # Gemma 2/3 name the activation `hidden_activation` and have no top-level rope_theta.
    out["hidden_activation"] = out.pop("hidden_act")
    out.pop("rope_theta", None)
    out.update(
        query_pre_attn_scalar=_whole(config.query_pre_attn_scalar or config.head_size),
        layer_types=["sliding_attention" if s else "full_attention" for s in config.sliding_layers],
        final_logit_softcapping=config.final_logit_softcap,
        attn_logit_softcapping=config.attn_logit_softcap,
        use_bidirectional_attention=False if facts.hf_bidirectional_key else None,
    )
    if facts.local_rope:
        local = {"rope_type": "default", "rope_theta": config.rope_local_theta or config.rope.theta}
        out["rope_parameters"] = {
            "full_attention": out["rope_parameters"],
            "sliding_attention": local,
        }
        out.pop("rope_scaling", None)


def _whole(x: float) -> float | int:
    """`x` as an int when it is one (transformers types `query_pre_attn_scalar` as int)."""
    return int(x) if float(x).is_integer() else x


def _window_families_from_hf(
    d: dict[str, Any], facts: FamilyFacts, max_seq_len: int
) -> dict[str, Any]:
    """`ModelConfig` fields of Gemma 2, Gemma 3 and Mistral configs (plus `rope` for Gemma 3,
    whose `rope_parameters` has one entry per layer type)."""
    if not facts.sliding_window or facts.hf_window_keys not in ("sliding_window", "gemma"):
        return {}
    model_type = d.get("model_type")
    window = d.get("sliding_window")
    out: dict[str, Any] = {"sliding_window": None if window is None else int(window)}
    if facts.hf_window_keys != "gemma":
        return out
    if d.get("use_bidirectional_attention"):
        raise HfConfigError(
            f"config.json ({model_type}) sets use_bidirectional_attention="
            f"{d.get('use_bidirectional_attention')!r}; meltemi's {model_type} is a causal LM. "
            "Fix: use_bidirectional_attention=false"
        )
    types = d.get("layer_types")
    # transformers saves Gemma 3's pattern as `_sliding_window_pattern`; older configs without
    # `layer_types` have `sliding_window_pattern`. Either only shapes the default layer_types.
    patterns = (d.get("sliding_window_pattern"), d.get("_sliding_window_pattern"))
    saved_pattern = patterns[0] or patterns[1]
    if not types:
        pattern = int(saved_pattern or facts.sliding_pattern)
        types = sliding_layer_types(int(_get(d, "num_hidden_layers")), pattern)
    scalar = d.get("query_pre_attn_scalar")
    hidden, heads = int(_get(d, "hidden_size")), int(_get(d, "num_attention_heads"))
    head_dim = int(d.get("head_dim") or hidden // heads)
    attn_cap = d.get("attn_logit_softcapping")
    if not facts.attn_softcap and attn_cap is not None:
        raise HfConfigError(
            f"config.json ({model_type}) sets attn_logit_softcapping={attn_cap!r}, which "
            "transformers' Gemma 3 ignores (its attention passes no soft cap), so the intended "
            "math is unclear. Fix: attn_logit_softcapping=null"
        )
    final_cap = d.get("final_logit_softcapping")
    out.update(
        layer_types=tuple(types),
        query_pre_attn_scalar=None if scalar is None or scalar == head_dim else float(scalar),
        attn_logit_softcap=None if attn_cap is None else float(attn_cap),
        final_logit_softcap=None if final_cap is None else float(final_cap),
    )
    if facts.local_rope:
        out.update(_gemma3_rope_from_hf(d, max_seq_len))
    return out


def _gemma3_rope_from_hf(d: dict[str, Any], max_seq_len: int) -> dict[str, Any]:
    """Gemma 3's global rope (`full_attention`, possibly scaled) and local base
    (`sliding_attention`; `rope_local_base_freq` in older configs)."""
    params = d.get("rope_parameters") or {}
    if params and not all(isinstance(v, dict) for v in params.values()):
        params = {"full_attention": params}  # one rope given: it is the global layers'
    full = dict(params.get("full_attention") or {})
    local = dict(params.get("sliding_attention") or {})
    legacy = d.get("rope_scaling")
    if legacy:
        full.update(legacy)
    full.setdefault("rope_theta", d.get("rope_theta") or 1_000_000.0)
    local.setdefault("rope_theta", d.get("rope_local_base_freq") or 10_000.0)
    local_kind = local.pop("rope_type", None) or local.pop("type", None) or "default"
    extra = sorted(set(local) - {"rope_theta"})
    if local_kind != "default" or extra:
        raise HfConfigError(
            f"config.json (gemma3_text) rope_parameters.sliding_attention is {local_kind!r} "
            f"with keys {extra}; the local layers support plain RoPE only. Fix: "
            '{"rope_type": "default", "rope_theta": 10000.0}'
        )
    view = {"model_type": "gemma3_text", "rope_parameters": full}
    return {
        "rope": _rope_from_hf(view, max_seq_len),
        "rope_local_theta": float(local["rope_theta"]),
    }
