"""Reference Hugging Face configs for every preset, written out literally as `transformers`
config objects.

These are deliberately *not* derived from `meltemi.models.to_hf_config`: the parity tests
compare our export with them key by key, so an option our export drops or mistranslates shows
up as a difference instead of being dropped on both sides. The real-size ones follow the
published `config.json` of the model each preset is named after (Llama 3.1 8B layout for
Marin, Mixtral-8x7B-v0.1, Qwen3-30B-A3B, GPT-2 small, Gemma 2B).
"""

from __future__ import annotations

import transformers as tf

_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500_000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def _tiny(**overrides):
    # The tiny presets' shared sizes: vocab 67, hidden 30, 6 query / 2 KV heads of 8, MLP 44.
    return (
        dict(
            vocab_size=67,
            hidden_size=30,
            intermediate_size=44,
            num_hidden_layers=3,
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=8,
            max_position_embeddings=64,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
            bos_token_id=1,
            eos_token_id=2,
            tie_word_embeddings=False,
            hidden_act="silu",
        )
        | overrides
    )


def _marin(**overrides):
    return (
        dict(
            vocab_size=128_256,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=4096,
            rms_norm_eps=1e-5,
            rope_parameters=dict(_LLAMA3_ROPE),
            bos_token_id=128_000,
            eos_token_id=128_001,
            tie_word_embeddings=False,
            hidden_act="silu",
        )
        | overrides
    )


_MARIN_32B = dict(
    hidden_size=5120,
    intermediate_size=27648,
    num_hidden_layers=64,
    num_attention_heads=40,
    num_key_value_heads=8,
)


def reference_config(preset: str) -> tf.PretrainedConfig:
    """The `transformers` config that preset `preset` should export to (a fresh object)."""
    builders = {
        "marin-8b": lambda: tf.LlamaConfig(**_marin(), architectures=["LlamaForCausalLM"]),
        "marin-32b": lambda: tf.LlamaConfig(
            **_marin(**_MARIN_32B), architectures=["LlamaForCausalLM"]
        ),
        "marin-32b-qk": lambda: tf.Qwen3Config(
            **_marin(**_MARIN_32B),
            use_sliding_window=False,
            sliding_window=None,
            architectures=["Qwen3ForCausalLM"],
        ),
        "mixtral-8x7b": lambda: tf.MixtralConfig(
            **_marin(
                vocab_size=32_000,
                max_position_embeddings=32_768,
                rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
                bos_token_id=1,
                eos_token_id=2,
            ),
            num_local_experts=8,
            num_experts_per_tok=2,
            router_aux_loss_coef=0.02,
            architectures=["MixtralForCausalLM"],
        ),
        "qwen3-30b-a3b": lambda: tf.Qwen3MoeConfig(
            vocab_size=151_936,
            hidden_size=2048,
            intermediate_size=6144,
            moe_intermediate_size=768,
            num_hidden_layers=48,
            num_attention_heads=32,
            num_key_value_heads=4,
            head_dim=128,
            max_position_embeddings=40_960,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
            num_experts=128,
            num_experts_per_tok=8,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            router_aux_loss_coef=0.001,
            use_sliding_window=False,
            sliding_window=None,
            bos_token_id=151_643,
            eos_token_id=151_645,
            tie_word_embeddings=False,
            hidden_act="silu",
            architectures=["Qwen3MoeForCausalLM"],
        ),
        "gpt2-small": lambda: tf.GPT2Config(
            vocab_size=50_257,
            n_positions=1024,
            n_embd=768,
            n_layer=12,
            n_head=12,
            n_inner=3072,
            activation_function="gelu_new",
            layer_norm_epsilon=1e-5,
            bos_token_id=50_256,
            eos_token_id=50_256,
            tie_word_embeddings=True,
            architectures=["GPT2LMHeadModel"],
        ),
        "gemma-2b": lambda: tf.GemmaConfig(
            vocab_size=256_000,
            hidden_size=2048,
            intermediate_size=16384,
            num_hidden_layers=18,
            num_attention_heads=8,
            num_key_value_heads=1,
            head_dim=256,
            max_position_embeddings=8192,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
            hidden_act="gelu_pytorch_tanh",
            bos_token_id=2,
            eos_token_id=1,
            tie_word_embeddings=True,
            architectures=["GemmaForCausalLM"],
        ),
        "tiny-llama": lambda: tf.LlamaConfig(**_tiny(), architectures=["LlamaForCausalLM"]),
        "tiny-llama3": lambda: tf.LlamaConfig(
            **_tiny(
                rope_parameters=_LLAMA3_ROPE | {"original_max_position_embeddings": 16},
                tie_word_embeddings=True,
            ),
            architectures=["LlamaForCausalLM"],
        ),
        "tiny-qwen3": lambda: tf.Qwen3Config(
            **_tiny(rms_norm_eps=1e-6),
            use_sliding_window=False,
            sliding_window=None,
            architectures=["Qwen3ForCausalLM"],
        ),
        "tiny-mixtral": lambda: tf.MixtralConfig(
            **_tiny(intermediate_size=12),
            num_local_experts=5,
            num_experts_per_tok=2,
            router_aux_loss_coef=0.01,
            architectures=["MixtralForCausalLM"],
        ),
        "tiny-qwen3-moe": lambda: tf.Qwen3MoeConfig(
            **_tiny(),
            moe_intermediate_size=12,
            num_experts=5,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            router_aux_loss_coef=0.01,
            use_sliding_window=False,
            sliding_window=None,
            architectures=["Qwen3MoeForCausalLM"],
        ),
        "tiny-gpt2": lambda: tf.GPT2Config(
            vocab_size=67,
            n_positions=64,
            n_embd=30,
            n_layer=3,
            n_head=5,
            n_inner=44,
            activation_function="gelu_new",
            layer_norm_epsilon=1e-5,
            bos_token_id=1,
            eos_token_id=2,
            tie_word_embeddings=True,
            architectures=["GPT2LMHeadModel"],
        ),
        "tiny-gemma": lambda: tf.GemmaConfig(
            **_tiny(rms_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh", tie_word_embeddings=True),
            architectures=["GemmaForCausalLM"],
        ),
        # -- qwen2 / olmo2 (helper "families") ----------------------------------------------
        "tiny-qwen2": lambda: tf.Qwen2Config(
            **_tiny(rms_norm_eps=1e-6, num_key_value_heads=1),
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=3,
            architectures=["Qwen2ForCausalLM"],
        ),
        "tiny-olmo2": lambda: tf.Olmo2Config(
            **_tiny(num_key_value_heads=1),
            attention_bias=False,
            architectures=["Olmo2ForCausalLM"],
        ),
        # -- mistral / gemma2 / gemma3_text (helper "attn") --------------------------------
        "tiny-mistral": lambda: tf.MistralConfig(
            **_tiny(rms_norm_eps=1e-6, num_key_value_heads=1),
            sliding_window=5,
            architectures=["MistralForCausalLM"],
        ),
        "tiny-gemma2": lambda: tf.Gemma2Config(
            **_gemma_tiny(),
            sliding_window=5,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            attn_logit_softcapping=3.0,
            final_logit_softcapping=4.0,
            query_pre_attn_scalar=7,
            architectures=["Gemma2ForCausalLM"],
        ),
        "tiny-gemma3": lambda: tf.Gemma3TextConfig(
            **_gemma_tiny(
                num_hidden_layers=6,
                num_key_value_heads=1,
                rope_parameters={
                    "full_attention": {
                        "rope_type": "linear",
                        "rope_theta": 1_000_000.0,
                        "factor": 2.0,
                    },
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                },
            ),
            sliding_window=5,
            query_pre_attn_scalar=12,
            final_logit_softcapping=None,
            attn_logit_softcapping=None,
            architectures=["Gemma3ForCausalLM"],
        ),
    }
    return builders[preset]()


def _gemma_tiny(**overrides):
    # Gemma 2/3 name the activation `hidden_activation` (a `hidden_act` key would be extra).
    d = _tiny(rms_norm_eps=1e-6, tie_word_embeddings=True, **overrides)
    del d["hidden_act"]
    return d | {"hidden_activation": "gelu_pytorch_tanh"}
