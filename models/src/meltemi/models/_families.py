"""The model families: every fact that depends on the family, in one frozen record each.

Code elsewhere never compares `family` to a name: it reads the record
(`ModelConfig.facts`, or `FAMILY_FACTS[family]`) and branches on what the fact says, so adding
a family is one entry here (plus its tensor names, if they are new). `test_families.py` scans
the package for `family == "..."`-style checks and fails on any outside this module.

| family | norm | positions | MLP | biases | QK-norm | sliding windows |
|---|---|---|---|---|---|---|
| llama | RMS | RoPE | SwiGLU | - | - | - |
| qwen3 | RMS | RoPE | SwiGLU | - | per head | refused |
| mixtral | RMS | RoPE | MoE (mixtral) | - | - | refused |
| qwen3_moe | RMS | RoPE | MoE (qwen3_moe) | - | per head | refused |
| gpt2 | LayerNorm | learned | GELU | all | - | - |
| gemma | (1 + w) RMS | RoPE, scaled embed | GeGLU | - | - | - |
| gemma2 | (1 + w) RMS, + post | RoPE, scaled embed | GeGLU | - | - | 1 in 2 global |
| gemma3_text | (1 + w) RMS, + post | 2 RoPEs, scaled embed | GeGLU | - | per head | 1 in 6 global |
| mistral | RMS | RoPE | SwiGLU | - | - | every layer |
| qwen2 | RMS | RoPE | SwiGLU | q/k/v | - | every layer (HF: from max_window_layers) |
| olmo2 | RMS, post only | RoPE | SwiGLU | - | whole q/k | - |

"refused": `config.json` has the keys, and a window set in them is an error.

>>> FAMILY_FACTS["qwen2"].bias, FAMILY_FACTS["qwen2"].sliding_window
('qkv', True)
>>> [f for f, facts in FAMILY_FACTS.items() if facts.sliding_pattern]
['gemma2', 'gemma3_text']
"""

from __future__ import annotations

import dataclasses
from typing import Literal


@dataclasses.dataclass(frozen=True)
class FamilyFacts:
    """What a family fixes about the architecture and its Hugging Face form.

    Attributes:
        hf_model_type: `config.json`'s `model_type`.
        hf_architecture: `config.json`'s `architectures[0]` (the transformers class).
        hf_layout: tensor names and size keys: `"llama"` (`model.layers.{i}.self_attn...`,
            `hidden_size`) or `"gpt2"` (`transformer.h.{i}.attn.c_attn`, fused q/k/v Conv1D,
            `n_embd`).
        norm: `"rms"`, `"rms_one_plus"` (Gemma's `(1 + w)` scale) or `"layer"` (LayerNorm with
            bias).
        pre_norms: norms on the attention and MLP inputs (all but OLMo 2).
        post_norms: norms on the attention and MLP outputs, before the residual add.
        rope: rotary positions (else a learned position table, GPT-2).
        gated_mlp: gated (SwiGLU / GeGLU) MLP, else `down(act(up(x)))`.
        bias: `"none"`, `"all"` (every linear layer and norm, GPT-2) or `"qkv"` (the q/k/v
            projections only, Qwen2).
        scale_embeddings: embeddings are multiplied by `sqrt(hidden_dim)` (Gemma).
        qk_norm: `"none"`, `"per_head"` (an RMS norm over each head's q and k) or `"whole"`
            (over the whole q/k projection, OLMo 2). Fixed by the family: transformers could not
            load a checkpoint that differs.
        moe: `None` (dense), or the mixture-of-experts layout in HF (`"mixtral"`:
            `block_sparse_moe.experts.{j}.w1/w3/w2`, `num_local_experts`; `"qwen3_moe"`:
            `mlp.experts.{j}.gate_proj/...`, `num_experts`, `moe_intermediate_size`).
        sliding_window: the family has sliding-window attention (`ModelConfig.sliding_window`).
        sliding_pattern: every n-th layer is global, the others slide, unless `layer_types`
            says otherwise (Gemma 2: 2, Gemma 3: 6); `None`: every layer slides.
        hf_window_keys: how `config.json` spells windows: `None` (not at all),
            `"sliding_window"` (one key), `"qwen"` (`use_sliding_window`, `sliding_window`,
            `max_window_layers`, `layer_types`) or `"gemma"` (`sliding_window`, `layer_types`,
            soft caps, `query_pre_attn_scalar`, `hidden_activation`). A family with keys but no
            `sliding_window` refuses a window it is given.
        attn_softcap: transformers applies `attn_logit_softcapping` (Gemma 2; Gemma 3 keeps
            the key but ignores it, so a set value is refused).
        local_rope: the sliding layers have their own RoPE base (Gemma 3's
            `rope_parameters.sliding_attention`).
        hf_bidirectional_key: `config.json` has `use_bidirectional_attention` (Gemma 3).
        hf_attention_bias_key: `config.json` has `attention_bias` (written `false`).
        hf_mlp_bias_key: `config.json` has `mlp_bias` (written `false`).
        hf_gelu_tanh: the HF name of the tanh-approximated GELU.
        hf_gelu_means_tanh: a `hidden_act="gelu"` means the tanh approximation (old Gemma
            configs, as transformers reads them).
        default_norm_eps: the norm epsilon when `config.json` omits it.
        default_tie_embeddings: `tie_word_embeddings` when `config.json` omits it.
    """

    hf_model_type: str
    hf_architecture: str
    hf_layout: Literal["llama", "gpt2"] = "llama"
    norm: Literal["rms", "rms_one_plus", "layer"] = "rms"
    pre_norms: bool = True
    post_norms: bool = False
    rope: bool = True
    gated_mlp: bool = True
    bias: Literal["none", "all", "qkv"] = "none"
    scale_embeddings: bool = False
    qk_norm: Literal["none", "per_head", "whole"] = "none"
    moe: Literal["mixtral", "qwen3_moe"] | None = None
    sliding_window: bool = False
    sliding_pattern: int | None = None
    hf_window_keys: Literal["sliding_window", "qwen", "gemma"] | None = None
    attn_softcap: bool = False
    local_rope: bool = False
    hf_bidirectional_key: bool = False
    hf_attention_bias_key: bool = False
    hf_mlp_bias_key: bool = False
    hf_gelu_tanh: str = "gelu_pytorch_tanh"
    hf_gelu_means_tanh: bool = False
    default_norm_eps: float = 1e-6
    default_tie_embeddings: bool = False


_GEMMA2 = FamilyFacts(
    "gemma2",
    "Gemma2ForCausalLM",
    norm="rms_one_plus",
    post_norms=True,
    scale_embeddings=True,
    sliding_window=True,
    sliding_pattern=2,
    hf_window_keys="gemma",
    attn_softcap=True,
    hf_attention_bias_key=True,
    default_tie_embeddings=True,
)

FAMILY_FACTS: dict[str, FamilyFacts] = {
    "llama": FamilyFacts(
        "llama", "LlamaForCausalLM", hf_attention_bias_key=True, hf_mlp_bias_key=True
    ),
    "qwen3": FamilyFacts(
        "qwen3",
        "Qwen3ForCausalLM",
        qk_norm="per_head",
        hf_window_keys="qwen",
        hf_attention_bias_key=True,
    ),
    "mixtral": FamilyFacts(
        "mixtral",
        "MixtralForCausalLM",
        moe="mixtral",
        hf_window_keys="sliding_window",
        default_norm_eps=1e-5,
    ),
    "qwen3_moe": FamilyFacts(
        "qwen3_moe",
        "Qwen3MoeForCausalLM",
        qk_norm="per_head",
        moe="qwen3_moe",
        hf_window_keys="qwen",
        hf_attention_bias_key=True,
    ),
    "gpt2": FamilyFacts(
        "gpt2",
        "GPT2LMHeadModel",
        hf_layout="gpt2",
        norm="layer",
        rope=False,
        gated_mlp=False,
        bias="all",
        hf_gelu_tanh="gelu_new",
        default_norm_eps=1e-5,
        default_tie_embeddings=True,
    ),
    "gemma": FamilyFacts(
        "gemma",
        "GemmaForCausalLM",
        norm="rms_one_plus",
        scale_embeddings=True,
        hf_attention_bias_key=True,
        hf_gelu_means_tanh=True,
        default_tie_embeddings=True,
    ),
    "gemma2": _GEMMA2,
    "gemma3_text": dataclasses.replace(
        _GEMMA2,
        hf_model_type="gemma3_text",
        hf_architecture="Gemma3ForCausalLM",
        qk_norm="per_head",
        sliding_pattern=6,
        attn_softcap=False,
        local_rope=True,
        hf_bidirectional_key=True,
    ),
    "mistral": FamilyFacts(
        "mistral", "MistralForCausalLM", sliding_window=True, hf_window_keys="sliding_window"
    ),
    "qwen2": FamilyFacts(
        "qwen2", "Qwen2ForCausalLM", bias="qkv", sliding_window=True, hf_window_keys="qwen"
    ),
    "olmo2": FamilyFacts(
        "olmo2",
        "Olmo2ForCausalLM",
        pre_norms=False,
        post_norms=True,
        qk_norm="whole",
        hf_attention_bias_key=True,
        default_norm_eps=1e-5,
    ),
}

FAMILIES = tuple(FAMILY_FACTS)
Family = Literal[
    "llama",
    "qwen3",
    "mixtral",
    "qwen3_moe",
    "gpt2",
    "gemma",
    "gemma2",
    "gemma3_text",
    "mistral",
    "qwen2",
    "olmo2",
]
FAMILY_OF_MODEL_TYPE = {facts.hf_model_type: family for family, facts in FAMILY_FACTS.items()}


def families_with(**facts: object) -> tuple[str, ...]:
    """The families whose facts have the given values, in table order (for messages).

    >>> families_with(sliding_window=True)
    ('gemma2', 'gemma3_text', 'mistral', 'qwen2')
    """
    return tuple(
        family
        for family, record in FAMILY_FACTS.items()
        if all(getattr(record, name) == value for name, value in facts.items())
    )
