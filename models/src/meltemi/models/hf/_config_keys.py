"""Nothing in a Hugging Face `config.json` is silently ignored.

`from_hf_config` reads the config through a `TrackedConfig`, which records every key it looks
at; each key it reads is either turned into a `ModelConfig` field or validated (an option we
cannot represent raises an error naming it). `check_all_used` then rejects every remaining key
that is not listed in `IRRELEVANT_KEYS`, the one place where keys that cannot change the
model's math are listed, each with the reason. A key whose value is `null` or empty means
"unset" (transformers then applies its default), so it is accepted too.

>>> d = TrackedConfig({"model_type": "llama", "use_cache": True, "rope_foo": 2.0})
>>> d["model_type"]
'llama'
>>> check_all_used(d)
Traceback (most recent call last):
...
meltemi.models.HfConfigError: config.json (model_type 'llama') sets rope_foo=2.0, ...
"""

from __future__ import annotations

from typing import Any

from meltemi.models._config import ConfigError


class HfConfigError(ConfigError):
    """A Hugging Face `config.json` uses a model type or option this library cannot represent."""


HfConfigError.__module__ = "meltemi.models"

_PROVENANCE = "provenance metadata, no effect on the model"
_OUTPUT = "a transformers output-format / runtime switch, no effect on the weights' math"
_GENERATION = (
    "a generation default (old configs carried them); meltemi.models.generate takes these as "
    "arguments and reads eos from generation_config.json"
)
_DROPOUT = "dropout: training-time noise, the identity at inference; meltemi trains without dropout"
_HEADS = "a task head (classification, summary) other than the causal LM head loaded here"
_ENCDEC = "encoder-decoder plumbing; model_type already fixes a decoder-only causal LM"

# Keys that cannot change the math of the causal LM `hf.load` builds, with the reason for each.
IRRELEVANT_KEYS: dict[str, str] = {
    "architectures": "names the transformers class; model_type picks the family",
    "transformers_version": _PROVENANCE,
    "_name_or_path": _PROVENANCE,
    "_commit_hash": _PROVENANCE,
    "model_name": _PROVENANCE,
    "dtype": "storage dtype: each tensor loads in its own dtype (or hf.load's dtype=)",
    "torch_dtype": "storage dtype (transformers < 5 name): each tensor loads in its own dtype",
    "use_cache": _OUTPUT,
    "output_attentions": _OUTPUT,
    "output_hidden_states": _OUTPUT,
    "return_dict": _OUTPUT,
    "use_return_dict": _OUTPUT,
    "torchscript": _OUTPUT,
    "output_router_logits": _OUTPUT + " (the router losses are computed in meltemi's loss)",
    "attn_implementation": "transformers' attention kernel choice (same math)",
    "_attn_implementation_autoset": "transformers' attention kernel choice (same math)",
    "pretraining_tp": "tensor-parallel degree of the original training; the same math",
    "chunk_size_feed_forward": "transformers' memory chunking of the MLP; the same math",
    "pad_token_id": "a tokenizer matter: padding is masked, the model's math never reads it",
    "sep_token_id": "a tokenizer matter",
    "tokenizer_class": "a tokenizer matter",
    "prefix": "a tokenizer / task matter",
    "task_specific_params": "generation presets per task",
    "finetuning_task": _HEADS,
    "id2label": _HEADS,
    "label2id": _HEADS,
    "num_labels": _HEADS,
    "problem_type": _HEADS,
    "summary_type": _HEADS,
    "summary_use_proj": _HEADS,
    "summary_activation": _HEADS,
    "summary_proj_to_labels": _HEADS,
    "summary_first_dropout": _HEADS,
    "is_encoder_decoder": _ENCDEC,
    "is_decoder": _ENCDEC,
    "add_cross_attention": _ENCDEC,
    "tie_encoder_decoder": _ENCDEC,
    "cross_attention_hidden_size": _ENCDEC,
    "decoder_start_token_id": _ENCDEC,
    "attention_dropout": _DROPOUT,
    "attn_pdrop": _DROPOUT,
    "embd_pdrop": _DROPOUT,
    "resid_pdrop": _DROPOUT,
    "hidden_dropout": _DROPOUT,
    "router_jitter_noise": _DROPOUT + " (Mixtral's router jitter is training-only noise)",
    "n_ctx": "GPT-2's old alias of n_positions (the position table size is n_positions)",
    "max_length": _GENERATION,
    "min_length": _GENERATION,
    "do_sample": _GENERATION,
    "early_stopping": _GENERATION,
    "num_beams": _GENERATION,
    "num_beam_groups": _GENERATION,
    "num_return_sequences": _GENERATION,
    "temperature": _GENERATION,
    "top_k": _GENERATION,
    "top_p": _GENERATION,
    "typical_p": _GENERATION,
    "repetition_penalty": _GENERATION,
    "length_penalty": _GENERATION,
    "no_repeat_ngram_size": _GENERATION,
    "encoder_no_repeat_ngram_size": _GENERATION,
    "bad_words_ids": _GENERATION,
    "diversity_penalty": _GENERATION,
    "forced_bos_token_id": _GENERATION,
    "forced_eos_token_id": _GENERATION,
    "remove_invalid_values": _GENERATION,
    "exponential_decay_length_penalty": _GENERATION,
    "suppress_tokens": _GENERATION,
    "begin_suppress_tokens": _GENERATION,
    "return_dict_in_generate": _GENERATION,
    "output_scores": _GENERATION,
    # -- gemma2 / gemma3_text / mistral (read by the attention helper's code in
    # from_hf_config; only their inert keys are listed here) ---------------------------------
    "cache_implementation": "gemma2/gemma3_text: transformers' KV-cache class ('hybrid'); "
    "meltemi's cache covers every layer type",
}


class TrackedConfig(dict):
    """A `config.json` dict that records which keys were read (`[]`, `get`, `in`)."""

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__(data)
        self.used: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.used.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.used.add(key)
        return super().__contains__(key)


def _unset(value: Any) -> bool:
    return value is None or (isinstance(value, (list, dict, tuple, str)) and len(value) == 0)


def unused_keys(d: TrackedConfig) -> list[str]:
    """Keys of `d` that were not read, are set, and are not known to be irrelevant."""
    raw = dict.items(d)
    return sorted(
        k for k, v in raw if k not in d.used and k not in IRRELEVANT_KEYS and not _unset(v)
    )


def check_all_used(d: TrackedConfig) -> None:
    """Raises `HfConfigError` naming the first key of `d` that nothing accounts for."""
    unused = unused_keys(d)
    if unused:
        key = unused[0]
        value = dict.__getitem__(d, key)
        model_type = dict.get(d, "model_type")
        read = sorted(k for k in d.used if dict.__contains__(d, k))
        more = f" (also unsupported: {unused[1:]})" if len(unused) > 1 else ""
        raise HfConfigError(
            f"config.json (model_type {model_type!r}) sets {key}={value!r}, an option "
            f"meltemi.models does not implement and would otherwise ignore{more}. It may change "
            f"the model's math, so it is refused. Keys this config used: {read}; keys known to "
            "be irrelevant: meltemi.models.hf._config_keys.IRRELEVANT_KEYS. Fix: remove the "
            "key if it is inert, or add support for it"
        )
