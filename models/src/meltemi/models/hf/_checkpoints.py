"""`load`, `save`, `warm_start` and `state_dict` of `meltemi.models.hf` (see its docstring)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import shutil
from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import meltemi.haliax as hax
from meltemi.models import lora
from meltemi.models._config import ConfigError, ModelConfig
from meltemi.models._transformer import Transformer, _jit_init
from meltemi.models.hf import _keys, _storage, _stream
from meltemi.models.hf._config import fp8_block_size, from_hf_config, to_hf_config
from meltemi.models.hf._safetensors import DEFAULT_SHARD_BYTES, Checkpoint, write_sharded

__all__ = [
    "CheckpointError",
    "LoadReport",
    "load",
    "load_config",
    "save",
    "warm_start",
    "state_dict",
    "eos_token_id_of",
]

logger = logging.getLogger(__name__)

MELTEMI_CONFIG = "meltemi_config.json"
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",  # transformers >= 4.47 keeps the chat template here
)


class CheckpointError(ValueError):
    """A checkpoint's tensors do not match the model (missing or unexpected keys, shapes)."""


CheckpointError.__module__ = "meltemi.models.hf"


@dataclasses.dataclass(frozen=True)
class LoadReport:
    """What loading a checkpoint into a model did, key by key (HF names).

    Attributes:
        loaded: keys copied into the model.
        initialized: keys the checkpoint lacks that were set to their identity value
            (e.g. the q/k norm weights of a Qwen3 model warm-started from Llama) -> the value.
        missing: keys the checkpoint lacks that kept the template's (random) initial values.
        unexpected: checkpoint keys the model has no place for (not loaded).
        ignored: known non-parameter buffers (e.g. GPT-2's `attn.bias` masks), skipped.
    """

    loaded: tuple[str, ...]
    initialized: Mapping[str, str]
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    ignored: tuple[str, ...]

    @property
    def exact(self) -> bool:
        """Every model tensor came from the checkpoint and every checkpoint tensor was used."""
        return not (self.initialized or self.missing or self.unexpected)

    def __str__(self) -> str:
        lines = [f"loaded {len(self.loaded)} tensors"]
        if self.initialized:
            lines.append(f"initialized (absent from the checkpoint): {dict(self.initialized)}")
        if self.missing:
            lines.append(f"missing (kept at their initial values): {list(self.missing)}")
        if self.unexpected:
            lines.append(f"unexpected (not loaded): {list(self.unexpected)}")
        if self.ignored:
            lines.append(f"ignored buffers: {list(self.ignored)}")
        return "\n".join(lines)


def _read_json(path: pathlib.Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(
            f"{path} does not exist; is {path.parent} a Hugging Face checkpoint directory?"
        ) from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from e


def _generation_eos(directory: pathlib.Path) -> tuple[bool, int | tuple[int, ...] | None]:
    """`(present, ids)`: the eos id(s) of `generation_config.json`, where generation reads
    them (it may list several where config.json has one)."""
    path = directory / "generation_config.json"
    if not path.exists():
        return False, None
    gen = _read_json(path)
    if gen.get("eos_token_id") is None:
        return False, None
    eos = gen["eos_token_id"]
    ids = [eos] if isinstance(eos, int) else eos
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise CheckpointError(f"{path}: eos_token_id={eos!r} is not an id or a list of ids")
    return True, (tuple(ids) if len(ids) > 1 else ids[0] if ids else None)


def load_config(directory: str | os.PathLike) -> ModelConfig:
    """The `ModelConfig` of a checkpoint directory (`meltemi_config.json` if it agrees with
    `config.json`, else `config.json`), with the eos id(s) of `generation_config.json` when
    it has them (transformers' `generate` stops on those)."""
    directory = _storage.as_path(directory)
    config = from_hf_config(_read_json(directory / "config.json"))
    ours = directory / MELTEMI_CONFIG
    if ours.exists():
        full = ModelConfig.from_dict(_read_json(ours))
        if from_hf_config(to_hf_config(full)) == config:
            config = full
        else:
            logger.warning(
                "%s disagrees with config.json (edited by hand?); using config.json", ours
            )
    present, eos = _generation_eos(directory)
    if present and eos != config.eos_token_id:
        config = config.replace(eos_token_id=eos)
    return config


def _key_map(keys: list[str], config: ModelConfig) -> dict[str, str]:
    """Checkpoint key -> the name the model expects (identity except for old GPT-2 files)."""
    # GPT-2 checkpoints from the original release lack the `transformer.` prefix.
    old_gpt2 = "transformer.wte.weight" not in keys and "wte.weight" in keys
    if config.facts.hf_layout == "gpt2" and old_gpt2:
        return {k: (k if k.startswith("lm_head.") else "transformer." + k) for k in keys}
    return {k: k for k in keys}


def _is_tied_copy(ckpt: Checkpoint, present: dict[str, str], key: str, config: ModelConfig) -> bool:
    """Whether `key` is the `lm_head.weight` a tied checkpoint also stores (some exporters
    write both), from the header alone. It must equal the embedding: the sharded read compares
    the two row by row as it reads the embedding (`_stream.load(same=...)`), so each is
    read once; a different head is an error there."""
    embed = _keys.embedding_key(config)
    if not (config.tie_embeddings and key == "lm_head.weight" and embed in present):
        return False
    head_info, embed_info = ckpt.tensors[present[key]], ckpt.tensors[present[embed]]
    if head_info.shape != embed_info.shape:
        raise CheckpointError(
            f"{ckpt.directory}: the config ties the embeddings, but the checkpoint's "
            f"{key} has shape {head_info.shape} and {embed} {embed_info.shape}; set "
            "tie_word_embeddings=false in config.json if the head is separate"
        )
    return True


def _tied_copy_differs(directory: Any, error: _stream.RowsDiffer) -> CheckpointError:
    return CheckpointError(
        f"{directory}: the config ties the embeddings, but the checkpoint's {error.other} "
        f"differs from {error.key} (first at row {error.row}); loading would drop a trained "
        "head. Set tie_word_embeddings=false in config.json to load it as a separate head"
    )


_SCALE_SUFFIX = "_scale_inv"


def _fp8_block(directory: pathlib.Path) -> tuple[int, int] | None:
    """`weight_block_size` of a block-scaled FP8 checkpoint (its config.json), else `None`."""
    path = directory / "config.json"
    return fp8_block_size(_read_json(path)) if path.exists() else None


def _fp8_scales(
    ckpt: Checkpoint, present: dict[str, str], block: tuple[int, int] | None
) -> dict[str, str]:
    """Takes the block scales (`<name>.weight_scale_inv`) out of `present` (model name ->
    checkpoint key) and returns checkpoint key of each scaled weight -> its scale's, after
    checking that every float8 weight has a scale of the shape its block size gives."""
    scale_names = [k for k in present if k.endswith(".weight" + _SCALE_SUFFIX)]
    if scale_names and block is None:
        raise CheckpointError(
            f"{ckpt.directory} holds block scales ({scale_names[0]}, ...) but its config.json "
            "has no quantization_config to say how they apply. Fix: add "
            '"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]} '
            "(with the block size the checkpoint was quantized with)"
        )
    scales = {}
    for scale_name in scale_names:
        weight = scale_name.removesuffix(_SCALE_SUFFIX)
        if weight not in present:
            continue  # a scale of nothing: reported as unexpected
        key, scale_key = present[weight], present.pop(scale_name)
        shape, scale_shape = ckpt.tensors[key].shape, ckpt.tensors[scale_key].shape
        want = tuple(-(-n // b) for n, b in zip(shape, block, strict=False))
        if len(shape) != 2 or scale_shape != want:
            raise CheckpointError(
                f"{ckpt.directory}: {scale_key} has shape {scale_shape}, but {key} {shape} in "
                f"blocks of {list(block)} (quantization_config.weight_block_size) needs "
                f"{want if len(shape) == 2 else 'a 2-D weight'}; does the block size match "
                "the checkpoint?"
            )
        scales[key] = scale_key
    if block is not None:
        for name, key in present.items():
            if ckpt.tensors[key].dtype.name.startswith("float8") and key not in scales:
                raise CheckpointError(
                    f"{ckpt.directory}: {key} is {ckpt.tensors[key].dtype.name} but the "
                    f"checkpoint has no {name}{_SCALE_SUFFIX}, so its real values are "
                    "unknown. Fix: the checkpoint is incomplete; download it again (or list "
                    "the module in quantization_config.modules_to_not_convert and store it "
                    "unquantized)"
                )
    return scales


def _sharding_of(mesh: Any, mapping: Any) -> _stream.ShardingOf:
    mesh = mesh if mesh is not None else hax.partitioning.current_mesh()
    if mesh is None:
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return lambda t: device
    if isinstance(mesh, jax.sharding.AbstractMesh):
        raise ConfigError(
            "hf.load inside jax.jit: the mesh is abstract there; call load outside jit "
            "(with jax.set_mesh(mesh) or mesh=...)"
        )
    mapping = mapping if mapping is not None else hax.partitioning.current_thread_local_mapping()
    mapping = mapping or {}
    return lambda t: jax.sharding.NamedSharding(
        mesh, hax.partitioning.pspec_for_axis(t.axes, mapping, mesh)
    )


def _template(config: ModelConfig, key: jax.Array | None) -> Transformer:
    if key is None:
        return eqx.filter_eval_shape(Transformer.init, config, key=jax.random.key(0))
    return _jit_init(config, key=key)


def _load_into(
    config: ModelConfig,
    directory: pathlib.Path,
    *,
    dtype: Any,
    init_missing_norms: bool,
    key: jax.Array | None,
    strict: bool,
    mesh: Any = None,
    axis_mapping: Any = None,
) -> tuple[Transformer, LoadReport]:
    ckpt = Checkpoint(directory)
    renamed = _key_map(list(ckpt), config)
    present = {name: k for k, name in renamed.items()}  # model's name -> checkpoint key
    block = _fp8_block(directory)
    scales = _fp8_scales(ckpt, present, block)
    if block is not None and dtype is None:
        dtype = jnp.bfloat16  # float8 values are meaningless without their scales
    expected = set(_keys.expected_keys(config))
    ignored = sorted(
        k
        for k in present
        if k not in expected
        and (_keys.is_ignorable(k, config) or _is_tied_copy(ckpt, present, k, config))
    )
    unexpected = sorted(k for k in present if k not in expected and k not in ignored)
    if strict:
        missing = [k for k in _keys.expected_keys(config) if k not in present]
        if missing or unexpected:
            report = LoadReport((), {}, tuple(missing), tuple(unexpected), tuple(ignored))
            raise CheckpointError(
                f"{directory} does not match a {config.family} model of this config:\n{report}\n"
                "To load weights across architectures (e.g. Llama -> Qwen3), use "
                "meltemi.models.hf.warm_start(directory, config)"
            )
    needs_init = [
        k
        for spec in _keys.specs_for(config)
        if not (init_missing_norms and spec.identity is not None)
        for k, _ in _keys._expand(spec, config)
        if k not in present
    ]
    if needs_init and key is None:
        key = jax.random.key(0)
    template = _template(config, key if needs_init else None)
    sharding_of = _sharding_of(mesh, axis_mapping)
    same = {}  # the tied head's copy, compared with the embedding as the embedding is read
    if "lm_head.weight" in ignored:  # only ever ignored as a tied copy
        same[present[_keys.embedding_key(config)]] = present["lm_head.weight"]
    try:
        model, loaded, initialized, missing = _stream.load(
            template,
            ckpt,
            {k: present[k] for k in present if k in expected},
            dtype=dtype,
            init_missing_norms=init_missing_norms,
            sharding_of=sharding_of,
            fp8=None if block is None else _stream.BlockScales(scales, block),
            same=same,
        )
    except _stream.RowsDiffer as e:
        raise _tied_copy_differs(directory, e) from None
    if missing and (mesh or hax.partitioning.current_mesh()) is not None:
        # Tensors kept from the (unsharded) random template: shard them like the rest.
        mapping = axis_mapping or hax.partitioning.current_thread_local_mapping() or {}
        model = hax.shard(model, mapping, mesh)
    report = LoadReport(
        tuple(loaded), initialized, tuple(missing), tuple(unexpected), tuple(ignored)
    )
    return model, report


def load(
    directory: str | os.PathLike,
    *,
    config: ModelConfig | None = None,
    dtype: Any = None,
    mesh: jax.sharding.Mesh | None = None,
    axis_mapping: hax.partitioning.ResourceMapping | None = None,
) -> tuple[Transformer, ModelConfig]:
    """Loads a Hugging Face (or `save`d) checkpoint exactly, sharded as it is read.

    Every parameter is created directly with its sharding: with a mesh (`mesh=` or the one of
    `jax.set_mesh`), a `NamedSharding` by its axis names under `axis_mapping` (default: the
    active `hax.axis_mapping`); without one, on the first device. Each device's piece is read
    from the safetensors files on its own (one layer of one expert at a time), so the host
    never holds a whole stacked parameter.

    A block-scaled FP8 checkpoint (config.json `quantization_config` with `quant_method`
    "fp8" and `weight_block_size`, a `<name>.weight_scale_inv` next to each float8 weight, as
    `Qwen/Qwen3-8B-FP8` or DeepSeek-V3) is dequantized as it is read, piece by piece:
    `W[i, j] * scale_inv[i // b0, j // b1]` multiplied in float32 and cast to `dtype`
    (default **bfloat16** for such a checkpoint); `save` then writes a plain checkpoint.
    Other quantizations (gptq, awq, bitsandbytes, per-tensor fp8) raise `HfConfigError`.

    Args:
        directory: the checkpoint directory.
        config: the model to build (default: the checkpoint's own config).
        dtype: parameter dtype (default: the checkpoint's; bfloat16 for a block-scaled FP8
            one).
        mesh: the device mesh to shard over (default: the active one, if any).
        axis_mapping: logical axis -> mesh axes (default: the active `hax.axis_mapping`),
            e.g. FSDP's `{"embed": "data"}`.

    Returns:
        `(model, config)`.

    Raises:
        CheckpointError: a tensor is missing or unexpected (use `warm_start` to load across
            architectures), naming every such key; a float8 weight has no (or a misshapen)
            block scale.
        HfConfigError: config.json uses an option or a quantization that cannot be loaded.
    """
    directory = _storage.as_path(directory)
    config = config or load_config(directory)
    model, _ = _load_into(
        config,
        directory,
        dtype=dtype,
        init_missing_norms=False,
        key=None,
        strict=True,
        mesh=mesh,
        axis_mapping=axis_mapping,
    )
    return model, config


def warm_start(
    directory: str | os.PathLike,
    config: ModelConfig,
    *,
    dtype: Any = None,
    key: jax.Array | None = None,
    allow_missing: bool = False,
) -> tuple[Transformer, LoadReport]:
    """Loads a checkpoint of a related architecture into a model of `config`.

    Tensors the checkpoint lacks but that have an identity value (norm weights, such as the
    q/k norms Qwen3 adds to Llama) are set to it; the report lists them under `initialized`.
    Checkpoint tensors the model has no place for are listed under `unexpected`. Other missing
    tensors are an error unless `allow_missing` (then they keep a random initialisation from
    `key` and are listed under `missing`). Nothing is dropped silently: the report is also
    logged.

    Returns:
        `(model, report)`.
    """
    directory = _storage.as_path(directory)
    model, report = _load_into(
        config, directory, dtype=dtype, init_missing_norms=True, key=key, strict=False
    )
    if report.missing and not allow_missing:
        raise CheckpointError(
            f"warm start from {directory}: the checkpoint lacks tensors with no identity "
            f"value:\n{report}\nPass allow_missing=True to initialise them randomly"
        )
    logger.warning("warm start from %s into a %s model:\n%s", directory, config.family, report)
    return model, report


def state_dict(model: Transformer, dtype: Any = None) -> dict[str, np.ndarray]:
    """The model's tensors under their Hugging Face names and layouts (numpy)."""
    return _keys.to_state_dict(model, dtype)


def _token_id(directory: pathlib.Path, token: str) -> int | None:
    path = directory / "tokenizer.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    for added in data.get("added_tokens", []):
        if added.get("content") == token:
            return int(added["id"])
    vocab = (data.get("model") or {}).get("vocab")
    if isinstance(vocab, dict) and token in vocab:
        return int(vocab[token])
    if isinstance(vocab, list):
        for i, entry in enumerate(vocab):
            if entry and entry[0] == token:
                return i
    return None


def eos_token_id_of(tokenizer: Any) -> int | None:
    """The eos id of a tokenizer: a transformers tokenizer (`.eos_token_id`) or a directory
    holding `tokenizer_config.json` (its `eos_token`) and `tokenizer.json`."""
    if hasattr(tokenizer, "eos_token_id"):
        eos = tokenizer.eos_token_id
        return None if eos is None else int(eos)
    directory = pathlib.Path(tokenizer)
    cfg_path = directory / "tokenizer_config.json"
    if not cfg_path.exists():
        raise ConfigError(
            f"tokenizer={str(tokenizer)!r}: expected a transformers tokenizer or a directory "
            "with tokenizer_config.json and tokenizer.json"
        )
    eos = json.loads(cfg_path.read_text()).get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    if eos is None:
        return None
    eos_id = _token_id(directory, eos)
    if eos_id is None:
        raise ConfigError(f"{cfg_path}: eos_token {eos!r} is not in {directory / 'tokenizer.json'}")
    return eos_id


def _save_tokenizer(tokenizer: Any, directory: pathlib.Path) -> list[str]:
    if hasattr(tokenizer, "save_pretrained"):
        return [pathlib.Path(p).name for p in tokenizer.save_pretrained(str(directory))]
    src = pathlib.Path(tokenizer)
    written = []
    for name in _TOKENIZER_FILES:
        if _storage.is_url(directory):  # object storage: no copy2, no resolve
            if (src / name).exists():
                (directory / name).write_bytes((src / name).read_bytes())
                written.append(name)
            continue
        if (src / name).exists() and src.resolve() != directory.resolve():
            shutil.copy2(src / name, directory / name)
            written.append(name)
    return written


def _architecture(config: ModelConfig) -> dict[str, Any]:
    hf_config = to_hf_config(config)
    hf_config.pop("bos_token_id")
    hf_config.pop("eos_token_id")
    return hf_config


def save(
    model: Transformer,
    config: ModelConfig | None,
    directory: str | os.PathLike,
    tokenizer: Any = None,
    *,
    dtype: Any = None,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> list[str]:
    """Writes a Hugging Face checkpoint that `transformers` loads with `from_pretrained`.

    Writes `config.json`, `meltemi_config.json`, safetensors shards with
    `model.safetensors.index.json`, `generation_config.json` and, if given, the tokenizer.
    The shards are streamed: one Hugging Face tensor (one layer of one expert) is copied to
    the host, written and dropped at a time. The model may be sharded over a mesh; in a
    multi-process run every process must call `save` (each contributes its pieces of every
    tensor) and only process 0 writes the shards. The
    eos id in `generation_config.json` and `config.json` is the **tokenizer's** when a tokenizer
    is given (a mismatch with `config.eos_token_id` is logged), else the config's.

    Args:
        model: the model.
        config: its config (`None`: `model.config`); must describe the same architecture.
        directory: output directory (created).
        tokenizer: a transformers tokenizer or a directory holding HF tokenizer files.
        dtype: cast the tensors (e.g. `jnp.bfloat16`); default: as stored.
        max_shard_bytes: shard size bound.

    Returns:
        The names of the files written.
    """
    directory = _storage.as_path(directory)
    config = config or model.config
    if lora.is_lora(model):
        raise CheckpointError(
            "hf.save: the model has LoRA adapters, which a Hugging Face checkpoint has no place "
            "for; save hf.save(lora.merge(model), ...) (merged) or lora.save_peft(model, dir) "
            "(the adapter alone, for peft)"
        )
    if _architecture(config) != _architecture(model.config):
        raise ConfigError(
            "save(model, config, ...): config describes a different architecture than "
            f"model.config ({config.family} vs {model.config.family}, or different sizes); "
            "pass config=None to use model.config"
        )
    # Multi-process: every process produces every tensor (each contributes its pieces to the
    # gathers), only process 0 writes files.
    writer = jax.process_index() == 0
    if writer:
        directory.mkdir(parents=True, exist_ok=True)
    eos = config.eos_token_id
    written: list[str] = []
    if tokenizer is not None:
        tok_eos = eos_token_id_of(tokenizer)
        if tok_eos is not None and tok_eos in config.eos_ids:
            tok_eos = eos  # the config's list already stops on the tokenizer's eos
        if tok_eos is not None and tok_eos != eos:
            logger.warning(
                "eos_token_id: the tokenizer says %s, the model config says %s; writing the "
                "tokenizer's",
                tok_eos,
                eos,
            )
        eos = tok_eos if tok_eos is not None else eos
        written += _save_tokenizer(tokenizer, directory) if writer else []
    saved_config = config.replace(eos_token_id=eos)
    for eos_id in saved_config.eos_ids:
        if not 0 <= eos_id < config.vocab_size:
            raise ConfigError(
                f"eos_token_id={eos_id} is outside the vocabulary (size {config.vocab_size}); "
                "generation would never stop. Pass the tokenizer the model was trained with"
            )
    eos = saved_config.eos_token_id
    hf_config = to_hf_config(saved_config)
    # The dtype the tensors are stored in: `dtype`, else the model's own.
    hf_config["dtype"] = np.dtype(dtype or model.embed.weight.dtype).name
    hf_config["torch_dtype"] = hf_config["dtype"]  # the key transformers < 5 reads
    if writer:
        (directory / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
        (directory / MELTEMI_CONFIG).write_text(json.dumps(saved_config.to_dict(), indent=2) + "\n")
    generation = {"_from_model_config": False, "bos_token_id": config.bos_token_id}
    if eos is not None:  # one id, or the list generation stops on
        generation["eos_token_id"] = list(eos) if isinstance(eos, tuple) else eos
    if writer:
        (directory / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    written += ["config.json", MELTEMI_CONFIG, "generation_config.json"]
    shards = write_sharded(
        directory,
        _stream.pending_tensors(model, dtype),
        max_shard_bytes=max_shard_bytes,
        write=writer,
    )
    written += [*shards, "model.safetensors.index.json"]
    return written
