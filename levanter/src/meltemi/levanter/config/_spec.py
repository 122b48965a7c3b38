"""`resolve(config) -> RunSpec`: the whole config checked once, into frozen typed sections.

Everything the trainer reads comes from a `RunSpec`; nothing downstream reads the
`ConfigDict`. Each section's keys and checks are defined once, in its class (`_sections.py`
lists them); the checks that span sections live here, so a mistake stops before any data,
model or mesh work, as one `ConfigError`.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib

import ml_collections
from etils import epath

import meltemi.models as mm
from meltemi import data as md
from meltemi.levanter import optim
from meltemi.levanter.checkpoint import VERIFY_MODES
from meltemi.levanter.config._checkpoint_spec import CheckpointSpec, checkpoint_spec
from meltemi.levanter.config._data_spec import SOURCES, DataSpec, data_spec
from meltemi.levanter.config._errors import BuildError, ConfigError, InertKeyError
from meltemi.levanter.config._eval_spec import EvalSpec, eval_spec
from meltemi.levanter.config._keys import read
from meltemi.levanter.config._logging_spec import WANDB_MODES, LoggingSpec, logging_spec
from meltemi.levanter.config._mesh_spec import MeshSpec, check_sequence, mesh_spec
from meltemi.levanter.config._model_spec import (
    lora_config,
    make_tokenizer,
    model_config,
    optimizer_config,
    optimizer_error,
)
from meltemi.levanter.config._paths import TopKeys, default_cache_dir, resolve_run_dir
from meltemi.levanter.config._resolve import ResolvedConfig
from meltemi.levanter.config._trainer_spec import (
    COMPUTE_DTYPES,
    TrainerSpec,
    check_objective,
    compute_dtype,
    trainer_spec,
)

# Names other packages and tests import from this module.
__all__ = [
    "COMPUTE_DTYPES",
    "SOURCES",
    "VERIFY_MODES",
    "WANDB_MODES",
    "BuildError",
    "CheckpointSpec",
    "DataSpec",
    "EvalSpec",
    "LoggingSpec",
    "MeshSpec",
    "RunSpec",
    "TrainerSpec",
    "as_spec",
    "compute_dtype",
    "default_cache_dir",
    "lora_config",
    "make_tokenizer",
    "model_config",
    "optimizer_config",
    "optimizer_error",
    "resolve",
    "resolve_run_dir",
]


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """A checked run: every section typed and frozen (see `resolve`).

    Attributes:
        name: the run's name (`runs/<name>` by default).
        run_dir: the absolute run directory: a `pathlib.Path`, or an `etils.epath.Path` for a
            `gs://bucket/dir` run directory (see `resolve_run_dir`).
        model: the model to train (the preset with every `model.*` key and the tokenizer's
            vocabulary applied).
        preset: the `model.preset` it started from.
        init_from_hf: a Hugging Face checkpoint directory whose config and weights the model
            starts from instead of the preset ("" for none).
        optimizer: the optimizer's config (`total_steps` is `trainer.num_train_steps`).
        tokenizer: the tokenizer the data is encoded with.
        resolved: the config it came from, with provenance (saved in run dirs and
            checkpoints).
    """

    name: str
    run_dir: pathlib.Path | epath.Path
    trainer: TrainerSpec
    eval: EvalSpec
    checkpoint: CheckpointSpec
    mesh: MeshSpec
    model: mm.ModelConfig
    preset: str
    optimizer: optim.OptimizerConfig
    data: DataSpec
    logging: LoggingSpec
    init_from_hf: str
    tokenizer: md.Tokenizer = dataclasses.field(compare=False, repr=False)
    resolved: ResolvedConfig = dataclasses.field(compare=False, repr=False)
    lora: mm.lora.LoraConfig = dataclasses.field(default_factory=mm.lora.LoraConfig)

    def to_json(self) -> str:
        """The config and its provenance, as saved in the run dir and every checkpoint."""
        return self.resolved.to_json()


def _check_elastic_batches(trainer: TrainerSpec, mesh: MeshSpec) -> None:
    """Every batch size must split evenly over every slice count the job may run at."""
    if mesh.min_slices == mesh.num_slices:
        return
    sizes = range(mesh.min_slices, mesh.num_slices + 1)
    lcm = math.lcm(*sizes)
    for _, size in trainer.batch_sizes.segments:
        bad = next((n for n in sizes if size % n), None)
        if bad is not None:
            raise ConfigError(
                f"trainer batch size {size} does not split over {bad} slices, and with "
                f"mesh.min_slices={mesh.min_slices} .. mesh.num_slices={mesh.num_slices} the "
                f"job may run on any of {list(sizes)}; use a multiple of {lcm} (e.g. "
                f"--config.trainer.train_batch_size={lcm * max(1, round(size / lcm))}) or "
                "raise mesh.min_slices."
            )


# The vocabulary is not compared: the checkpoint's is checked against the tokenizer.
_ARCHITECTURE = ("family", "hidden_dim", "intermediate_dim", "num_layers", "num_heads",
                 "num_kv_heads")  # fmt: skip


def _describes(preset: str, hf_dir: str) -> bool:
    """Whether `model.preset` describes the `model.init_from_hf` checkpoint (same family and
    sizes): a config that plans with the preset (`--dry_run`) may then train from the
    checkpoint. Unreadable either side: False (the other checks name the problem)."""
    try:
        ours = mm.get_preset(preset)
        theirs = mm.hf.load_config(pathlib.Path(hf_dir).expanduser())
    except Exception:  # a missing directory, an unknown preset: reported by model_config
        return False
    return all(getattr(ours, f) == getattr(theirs, f) for f in _ARCHITECTURE)


def resolve(config: ResolvedConfig | ml_collections.ConfigDict) -> RunSpec:
    """Checks a whole config once and returns its frozen, typed sections.

    Nothing is built: no data is read, no model initialised, no mesh laid out (a
    `tokenizer.json` is loaded, to know the vocabulary). Device counts are checked by
    `meltemi.levanter.trainer.plan`, which knows the devices.

    Raises:
        ConfigError: naming the key, the value and the fix; for a key that has no effect
            under the other settings (`InertKeyError`), also the setting that makes it inert.

    Example:
        >>> from meltemi.levanter.config import base_config, resolve, with_variant
        >>> spec = resolve(with_variant(base_config(), None, {}))
        >>> spec.trainer.compute_dtype, spec.model.vocab_size
        ('float32', 259)
    """
    resolved = config if isinstance(config, ResolvedConfig) else ResolvedConfig(config, {})
    c = resolved.config
    preset_set = resolved.provenance.get("model.preset", "default") != "default"
    if c.model.init_from_hf and preset_set and not _describes(c.model.preset, c.model.init_from_hf):
        raise InertKeyError(
            f"model.preset={c.model.preset!r} has no effect with model.init_from_hf="
            f"{c.model.init_from_hf!r} (the checkpoint's config.json is the model, and its "
            f"family or sizes differ from the preset's); drop one."
        )
    if c.model.init_from_hf and c.checkpoint.init_from:
        raise ConfigError(
            f"model.init_from_hf={c.model.init_from_hf!r} and checkpoint.init_from="
            f"{c.checkpoint.init_from!r} both set the initial weights; keep one."
        )
    top = read(TopKeys, c, "")
    trainer = trainer_spec(c.trainer)
    data = data_spec(c)
    tokenizer = make_tokenizer(data.tokenizer, data.bos_token, data.eos_token)
    model = model_config(c.model, tokenizer, data.seq_len)
    spec = RunSpec(
        name=top["name"],
        run_dir=resolve_run_dir(top["name"], top["run_dir"]),
        trainer=trainer,
        eval=eval_spec(c.eval),
        checkpoint=checkpoint_spec(c.checkpoint),
        mesh=mesh_spec(c.mesh),
        model=model,
        preset=c.model.preset,
        init_from_hf=c.model.init_from_hf,
        lora=lora_config(c.model.lora, model),
        optimizer=optimizer_config(c.optimizer, trainer.num_train_steps),
        data=data,
        logging=logging_spec(c.logging),
        tokenizer=tokenizer,
        resolved=resolved,
    )
    _check_elastic_batches(spec.trainer, spec.mesh)
    check_objective(spec.trainer, init_from=spec.checkpoint.init_from, lora=spec.lora.enabled)
    check_sequence(spec.mesh, spec.data.seq_len, spec.model.sequence_parallel)
    return spec


def as_spec(config: RunSpec | ResolvedConfig | ml_collections.ConfigDict) -> RunSpec:
    """A `RunSpec` from any of the forms a caller may hold (resolving it if needed)."""
    return config if isinstance(config, RunSpec) else resolve(config)
