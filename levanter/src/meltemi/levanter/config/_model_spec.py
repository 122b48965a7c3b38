"""`model.*` and `optimizer.*`: the sections derived from `ModelConfig` and `OptimizerConfig`.

Their keys are the fields of those types (`base_config` lists them), and their checks are the
types' own (`ModelConfig.__post_init__`, `OptimizerConfig.__post_init__`), re-raised naming
the `model.<field>` / `optimizer.<field>` key; the tokenizer (`data.tokenizer`) is built here
because the model's vocabulary comes from it.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from typing import Any

import ml_collections
from ml_collections.config_dict import FieldReference, placeholder

import meltemi.models as mm
from meltemi import data as md
from meltemi.levanter import optim
from meltemi.levanter.config._errors import ConfigError, InertKeyError

# model.* keys that are not ModelConfig fields of the same name.
_MODEL_SPECIAL = (
    "preset",
    "rope_theta",
    "rope_scaling",
    "num_experts",
    "num_experts_per_token",
    "init_from_hf",
    "lora",
)
_SIMPLE = {"int": int, "float": float, "str": str, "bool": bool}
# ModelConfig fields the trainer does not expose: the tokenizer decides them, or they nest.
_MODEL_SKIP = ("vocab_size", "rope", "moe", "bos_token_id", "eos_token_id")


def model_section() -> ml_collections.ConfigDict:
    """The `model.*` keys: `preset`, the `ModelConfig` fields (None: the preset's value), and
    `rope_theta`, the MoE sizes, `init_from_hf` and `lora.*`."""
    section = ml_collections.ConfigDict()
    # A preset of meltemi.models (e.g. "tiny-llama", "marin-32b"); every other model key is
    # None ("the preset's value") unless set. vocab_size comes from the tokenizer.
    section.preset = "tiny-llama"
    for field in dataclasses.fields(mm.ModelConfig):
        if field.name in _MODEL_SKIP:
            continue
        kind = str(field.type).replace(" | None", "")
        section[field.name] = placeholder(_SIMPLE.get(kind, object))
    section.rope_theta = placeholder(float)
    # Rope scaling as Hugging Face's `rope_scaling` dict (e.g. {"rope_type": "yarn",
    # "factor": 16.0, "original_max_position_embeddings": 4096}); None: the preset's rope.
    section.rope_scaling = placeholder(object)
    # Mixture-of-experts presets only (MoeConfig.num_experts / top_k).
    section.num_experts = placeholder(int)
    section.num_experts_per_token = placeholder(int)
    # A Hugging Face checkpoint directory: the model's config and initial weights (instead
    # of model.preset and a random initialisation); other model.* keys still apply.
    section.init_from_hf = ""
    # LoRA (meltemi.models.lora): rank 0 is off; rank > 0 trains only adapters on
    # model.lora.targets (module names such as "q_proj", groups "attn"/"mlp", or "all-linear"),
    # scaled by alpha / rank, with dropout on their input.
    section.lora = ml_collections.ConfigDict()
    section.lora.rank = 0
    section.lora.alpha = 16.0
    section.lora.dropout = 0.0
    section.lora.targets = FieldReference(("q_proj", "v_proj"), field_type=object)
    return section


def optimizer_section() -> ml_collections.ConfigDict:
    """The `optimizer.*` keys: the fields of `OptimizerConfig` (`total_steps` is
    `trainer.num_train_steps`)."""
    section = ml_collections.ConfigDict()
    for field in dataclasses.fields(optim.OptimizerConfig):
        if field.name == "total_steps":
            continue
        if str(field.type) in _SIMPLE:
            section[field.name] = field.default
        else:  # unions (steps or fraction, value or schedule, or None): any Python literal
            section[field.name] = FieldReference(field.default, field_type=object)
    return section


def make_tokenizer(name: str, bos: str | None = None, eos: str | None = None) -> md.Tokenizer:
    """`data.tokenizer`: "byte", or the path of a Hugging Face `tokenizer.json`."""
    if name == "byte":
        for key, value in (("data.bos_token", bos), ("data.eos_token", eos)):
            if value is not None:
                raise InertKeyError(
                    f"{key}={value!r} has no effect with data.tokenizer='byte' (its bos and eos "
                    f"are fixed); drop {key} or use a tokenizer.json."
                )
        return md.ByteTokenizer()
    path = pathlib.Path(name).expanduser()
    if not path.exists():
        raise ConfigError(
            f"data.tokenizer={name!r}: neither 'byte' nor an existing tokenizer.json path; "
            "use --config.data.tokenizer=byte or a path to a tokenizer.json file."
        )
    names = {k: v for k, v in (("bos", bos), ("eos", eos)) if v is not None}
    try:
        return md.HfTokenizer(str(path), **names)
    except md.TokenizerError as e:
        which = "bos" if "bos" in str(e) else "eos"
        raise ConfigError(
            f'data.tokenizer={name!r}: {e} (config key: data.{which}_token; "" for none)'
        ) from None


def _model_error(e: Exception) -> str:
    # models' messages read "ModelConfig.<field>=...": in the trainer the key is model.<field>.
    return re.sub(r"^(ModelConfig|MoeConfig|RopeConfig)\.", "model.", str(e))


def model_config(
    c: ml_collections.ConfigDict, tokenizer: md.Tokenizer, seq_len: int
) -> mm.ModelConfig:
    """The preset `model.preset` (or the config of `model.init_from_hf`) with every non-None
    `model.*` key and the tokenizer applied."""
    if c.init_from_hf:
        base = _hf_base(c.init_from_hf, tokenizer)
    else:
        try:
            base = mm.get_preset(c.preset)
        except (KeyError, ValueError, mm.ConfigError) as e:
            raise ConfigError(f"model.preset={c.preset!r}: {str(e).strip(chr(34))}") from None
    changes: dict[str, Any] = {
        key: value for key, value in c.items() if key not in _MODEL_SPECIAL and value is not None
    }
    if c.rope_theta is not None:
        changes["rope"] = base.rope.replace(theta=float(c.rope_theta))
    if c.rope_scaling is not None:
        try:
            changes["rope"] = changes.get("rope", base.rope).scaled(dict(c.rope_scaling))
        except (mm.ConfigError, TypeError, ValueError) as e:
            raise ConfigError(f"model.rope_scaling: {e}") from None
    moe = {}
    if c.num_experts is not None:
        moe["num_experts"] = c.num_experts
    if c.num_experts_per_token is not None:
        moe["top_k"] = c.num_experts_per_token
    if moe:
        if base.moe is None:
            raise InertKeyError(
                f"model.num_experts / model.num_experts_per_token: preset {c.preset!r} has no "
                f"experts; use an MoE preset (e.g. --config.model.preset=tiny-mixtral)."
            )
        try:
            changes["moe"] = base.moe.replace(**moe)
        except mm.ConfigError as e:
            raise ConfigError(_model_error(e)) from None
    if not c.init_from_hf:  # a checkpoint keeps its (possibly padded) vocabulary
        changes["vocab_size"] = tokenizer.vocab_size
    changes["bos_token_id"] = tokenizer.bos_id
    changes["eos_token_id"] = tokenizer.eos_id
    if seq_len > base.max_seq_len and c.max_seq_len is None:
        changes["max_seq_len"] = seq_len
    try:
        result = base.replace(**changes)
    except mm.ConfigError as e:
        raise ConfigError(_model_error(e)) from None
    if seq_len > result.max_seq_len:
        raise ConfigError(
            f"data.seq_len={seq_len} exceeds model.max_seq_len={result.max_seq_len}; raise "
            f"--config.model.max_seq_len or lower data.seq_len."
        )
    return result


def _hf_base(path: str, tokenizer: md.Tokenizer) -> mm.ModelConfig:
    """The model config of a Hugging Face checkpoint directory (`model.init_from_hf`)."""
    key = "model.init_from_hf"
    directory = pathlib.Path(path).expanduser()
    if not (directory / "config.json").is_file():
        raise ConfigError(
            f"{key}={path!r}: not a Hugging Face checkpoint directory (no config.json); pass "
            f"the directory holding config.json and *.safetensors."
        )
    try:
        base = mm.hf.load_config(directory)
    except (mm.ConfigError, mm.HfConfigError, mm.hf.CheckpointError) as e:
        raise ConfigError(f"{key}={path!r}: {e}") from None
    if tokenizer.vocab_size > base.vocab_size:
        raise ConfigError(
            f"{key}={path!r}: the checkpoint's vocabulary has {base.vocab_size} ids but the "
            f"tokenizer (data.tokenizer) has {tokenizer.vocab_size}; set data.tokenizer to the "
            f"checkpoint's tokenizer.json."
        )
    return base


def lora_config(c: ml_collections.ConfigDict, model: mm.ModelConfig) -> mm.lora.LoraConfig:
    """`model.lora.*` as a `LoraConfig`, its targets checked against the model's layers."""
    targets = c.targets
    if isinstance(targets, list):
        targets = tuple(targets)
    try:
        config = mm.lora.LoraConfig(rank=c.rank, alpha=c.alpha, dropout=c.dropout, targets=targets)
        if config.enabled:
            mm.lora.resolve_targets(model, config)
    except mm.ConfigError as e:
        text = re.sub(r"^LoraConfig\.", "model.lora.", str(e))
        raise ConfigError(text.replace("LoraConfig.", "model.lora.")) from None
    return config


def optimizer_config(c: ml_collections.ConfigDict, total_steps: int) -> optim.OptimizerConfig:
    """`optimizer.*` as an `OptimizerConfig` (checked by building it); errors name the key."""
    fields = {f.name: f for f in dataclasses.fields(optim.OptimizerConfig)}
    values = {}
    for key, value in c.items():
        kind = str(fields[key].type)
        if isinstance(value, str) and not kind.startswith("str"):
            example = f"({value!r},)" if "tuple[str" in kind else "(1000, 2000)"
            raise ConfigError(
                f"optimizer.{key}={value!r} is a string, but the key takes {kind}; write the "
                f'value as a Python literal, e.g. --config.optimizer.{key}="{example}".'
            )
        values[key] = value
    values["total_steps"] = total_steps
    try:
        config = optim.OptimizerConfig(**values)
        # The whole chain, built as a check (and thrown away): building creates no JAX array,
        # so the backend does not start before the dry run sets its device count.
        optim.build_optimizer(config, total_steps=total_steps)
    except optim.OptimizerConfigError as e:
        raise optimizer_error(e) from None
    return config


def optimizer_error(e: optim.OptimizerConfigError) -> ConfigError:
    """An optimizer's error as a `ConfigError` naming the `optimizer.<field>` key."""
    text = str(e)
    head = re.match(r"\w+", text)
    fields = {f.name for f in dataclasses.fields(optim.OptimizerConfig)}
    prefix = "optimizer." if head and head.group(0) in fields else "optimizer: "
    return ConfigError(prefix + text)
