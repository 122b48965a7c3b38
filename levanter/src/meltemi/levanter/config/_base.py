"""The trainer's defaults: every key the trainer reads, with its default value."""

from __future__ import annotations

import dataclasses

import ml_collections
from ml_collections.config_dict import FieldReference, placeholder

from meltemi.levanter.mesh import MESH_AXES
from meltemi.levanter.optim import OptimizerConfig
from meltemi.models import ModelConfig

_SIMPLE = {"int": int, "float": float, "str": str, "bool": bool}
# ModelConfig fields the trainer does not expose: the tokenizer decides them, or they nest.
_MODEL_SKIP = ("vocab_size", "rope", "moe", "bos_token_id", "eos_token_id")


def _model_section() -> ml_collections.ConfigDict:
    section = ml_collections.ConfigDict()
    section.preset = ""
    for field in dataclasses.fields(ModelConfig):
        if field.name in _MODEL_SKIP:
            continue
        kind = str(field.type).replace(" | None", "")
        section[field.name] = placeholder(_SIMPLE.get(kind, object))
    section.rope_theta = placeholder(float)
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


def _optimizer_section() -> ml_collections.ConfigDict:
    section = ml_collections.ConfigDict()
    for field in dataclasses.fields(OptimizerConfig):
        if field.name == "total_steps":
            continue
        if str(field.type) in _SIMPLE:
            section[field.name] = field.default
        else:  # unions (steps or fraction, value or schedule, or None): any Python literal
            section[field.name] = FieldReference(field.default, field_type=object)
    return section


def base_config() -> ml_collections.ConfigDict:
    """Returns the trainer's defaults, unlocked, for a config file to start from.

    Every key the trainer reads exists here, so a typo in a config file or on the command line
    is an error rather than a silently ignored field. Config files change values, never add keys.

    Example:
        >>> from meltemi.levanter.config import base_config
        >>> config = base_config()
        >>> config.trainer.num_train_steps, config.mesh.ici.data, config.model.preset
        (1000, -1, 'tiny-llama')
    """
    c = ml_collections.ConfigDict()
    c.name = "run"
    # Empty: `runs/<name>` under the directory the command was started from.
    c.run_dir = ""

    c.trainer = ml_collections.ConfigDict()
    c.trainer.num_train_steps = 1000
    c.trainer.seed = 0
    c.trainer.train_batch_size = 8
    # Batch-size schedule "STEP:SIZE,STEP:SIZE" (e.g. "0:8,100:16"); empty: train_batch_size.
    c.trainer.batch_schedule = ""
    # Gradient accumulation: each step's batch is split into this many microbatches.
    c.trainer.microbatches = 1
    # Parameters, gradients and optimizer state are float32; the forward and backward pass
    # run in this dtype (float32 or bfloat16).
    c.trainer.compute_dtype = "float32"
    c.trainer.z_loss = 1e-4
    c.trainer.progress_bar = True
    # Peak FLOP/s per device for MFU; 0 measures a matmul at start-up.
    c.trainer.peak_flops_per_device = 0.0
    # (FIRST, LAST): a jax.profiler trace of steps FIRST..LAST into <run_dir>/profile
    # (TensorBoard's profile plugin or Perfetto read it); (): no trace.
    c.trainer.profile = FieldReference((), field_type=object)

    c.eval = ml_collections.ConfigDict()
    # 0: evaluate only at the end of training.
    c.eval.every_steps = 0
    c.eval.num_batches = 4
    c.eval.batch_size = 8
    # lm-evaluation-harness tasks (lm-eval names, or YAML tasks in levanter/harness_tasks and
    # eval.harness_include_path) run every eval.harness_every_steps steps and logged as
    # harness/<task>/<metric>; needs the `harness` extra (lm-eval). (): none.
    c.eval.harness_tasks = FieldReference((), field_type=object)
    c.eval.harness_every_steps = 0
    # Documents per harness task (0: all of them).
    c.eval.harness_limit = 0
    c.eval.harness_include_path = FieldReference((), field_type=object)

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.enabled = True
    # Rolling temporary checkpoints: every N steps and/or every M minutes (0 turns one off);
    # only the latest temporary checkpoint is kept.
    c.checkpoint.save_every_steps = 100
    c.checkpoint.save_every_minutes = 0.0
    # Permanent checkpoints every K steps (0: none); the final checkpoint is always kept.
    c.checkpoint.keep_every_steps = 0
    c.checkpoint.async_save = True
    # "sizes" or "checksums": what the completion manifest of each checkpoint records and checks
    # (checksums: every array's, computed on its devices while saving, checked after restore).
    c.checkpoint.verify = "checksums"
    # Warm start: a checkpoint directory whose parameters initialise a fresh run.
    c.checkpoint.init_from = ""
    # With every checkpoint, also a Hugging Face checkpoint in <run_dir>/hf/step_XXXXXXXX/
    # (config.json + safetensors; transformers loads it). --export_hf=DIR: the final one only.
    c.checkpoint.export_hf = False

    c.mesh = ml_collections.ConfigDict()
    c.mesh.num_slices = 1
    # Elastic multislice: the fewest slices the job keeps training on when slices are lost
    # (it grows back to num_slices as replacements join). 0: num_slices (a lost slice is
    # waited for).
    c.mesh.min_slices = 0
    c.mesh.ici = ml_collections.ConfigDict({a: (-1 if a == "data" else 1) for a in MESH_AXES})
    c.mesh.dcn = ml_collections.ConfigDict({a: (-1 if a == "data" else 1) for a in MESH_AXES})

    # A preset of meltemi.models (e.g. "tiny-llama", "marin-32b"); every other model key is
    # None ("the preset's value") unless set. vocab_size comes from the tokenizer.
    c.model = _model_section()
    c.model.preset = "tiny-llama"

    # The fields of meltemi.levanter.optim.OptimizerConfig (total_steps is
    # trainer.num_train_steps).
    c.optimizer = _optimizer_section()

    c.data = ml_collections.ConfigDict()
    # "stdlib": the Python standard library source shipped with the interpreter (validation:
    # its held-out modules); "files": data.train_files, and one validation set per entry of
    # data.validation_files (text, .jsonl[.gz|.zst] with a "text" field, or .parquet);
    # "mixture": data.components, weighted, with data.weight_stages.
    c.data.source = "stdlib"
    # data.source="mixture": name -> mixture_component(source, weight, validation=...), set in
    # a config file; weights (summing to 1) apply from step 0.
    c.data.components = ml_collections.ConfigDict()
    # ((step, {name: weight, ...}), ...): from each step on, these weights (steps increasing).
    c.data.weight_stages = FieldReference((), field_type=object)
    c.data.train_files = FieldReference((), field_type=object)
    c.data.validation_files = FieldReference((), field_type=object)
    c.data.tokenizer = "byte"
    # A tokenizer.json's bos / eos token strings ("" for none); None: its usual names are tried.
    c.data.bos_token = placeholder(str)
    c.data.eos_token = placeholder(str)
    c.data.seq_len = 128
    # Empty: ~/.cache/meltemi/data (or $MELTEMI_CACHE/data).
    c.data.cache_dir = ""
    c.data.shuffle_seed = 0
    # How documents become rows (meltemi.data.PACKINGS): "stream" concatenates and cuts every
    # seq_len tokens; "whole_documents" never splits a document shorter than seq_len (rows are
    # padded; padding is loss-masked and its share logged as data/padding_fraction).
    c.data.packing = "stream"

    c.logging = ml_collections.ConfigDict()
    c.logging.tensorboard = False
    c.logging.wandb = False
    c.logging.wandb_project = "meltemi"
    c.logging.wandb_mode = "offline"
    return c


def mixture_component(
    source: str, weight: float, *, validation: str = ""
) -> ml_collections.ConfigDict:
    """One entry of `data.components`, for `data.source = "mixture"`.

    Args:
        source: the training text: `stdlib:train`, `KIND:PATHS` or `KIND:NAME=PATHS` with KIND
            in text, jsonl, parquet (PATHS: comma-separated files, directories or globs), or
            plain paths (the kind follows the extension).
        weight: the component's share of the rows from step 0 (the weights sum to 1);
            `data.weight_stages` changes it from a later step on.
        validation: evaluation text in the same forms (empty: none); its metrics are tagged
            by the component's name (`eval/<name>/loss`, `eval/<name>/bpb`).

    Example:
        >>> from meltemi.levanter.config import base_config, mixture_component
        >>> config = base_config()
        >>> config.data.source = "mixture"
        >>> config.data.components.code = mixture_component("stdlib:train", 1.0)
        >>> config.data.components.code.weight
        1.0
    """
    return ml_collections.ConfigDict(
        {"source": str(source), "weight": float(weight), "validation": str(validation)}
    )
