"""`resolve(config) -> RunSpec`: the whole config checked once, into frozen typed sections.

Everything the trainer reads comes from a `RunSpec`; nothing downstream reads the
`ConfigDict`. Every check lives here, cross-field ones included (a key with no effect under
the other settings is an error naming both), so a mistake stops before any data, model or
mesh work, as one `ConfigError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import pathlib
import re
from typing import Any

import fsspec
import ml_collections
from etils import epath

import meltemi.models as mm
from meltemi import data as md
from meltemi.levanter import optim
from meltemi.levanter.checkpoint import VERIFY_MODES
from meltemi.levanter.config._errors import ConfigError, InertKeyError
from meltemi.levanter.config._mixture import MixturePlan, file_source, mixture_plan
from meltemi.levanter.config._resolve import ResolvedConfig
from meltemi.levanter.config._schedule import BatchSizes
from meltemi.levanter.mesh import MESH_AXES, MeshConfigError, check_sizes

#: `trainer.compute_dtype` values. float16 needs loss scaling, which the trainer does not do.
COMPUTE_DTYPES = ("float32", "bfloat16")
_DTYPE_ALIASES = {"bf16": "bfloat16", "fp32": "float32", "f32": "float32", "float": "float32"}
_FLOAT16 = ("float16", "fp16", "f16", "half")
SOURCES = ("stdlib", "files", "mixture")
WANDB_MODES = ("online", "offline", "disabled")
# model.* keys that are not ModelConfig fields of the same name.
_MODEL_SPECIAL = (
    "preset",
    "rope_theta",
    "num_experts",
    "num_experts_per_token",
    "init_from_hf",
    "lora",
)


class BuildError(ConfigError):
    """A model, data or optimizer setting that cannot be built (names the key and the fix)."""


@dataclasses.dataclass(frozen=True)
class TrainerSpec:
    """`trainer.*`: steps, seed, batch sizes, precision and loss.

    Attributes:
        batch_sizes: the batch size of every step (`train_batch_size` or `batch_schedule`).
        compute_dtype: "float32" or "bfloat16" (the forward and backward pass).
        peak_flops_per_device: the MFU denominator; 0 measures a matmul at start-up.
        profile: `(first, last)`: trace steps first..last (counted from 1) with
            `jax.profiler` into `<run_dir>/profile`; None: no trace.
    """

    num_train_steps: int
    seed: int
    batch_sizes: BatchSizes
    microbatches: int
    compute_dtype: str
    z_loss: float
    progress_bar: bool
    peak_flops_per_device: float
    profile: tuple[int, int] | None = None

    @property
    def train_batch_size(self) -> int:
        """The batch size of step 0."""
        return self.batch_sizes.size_at(0)


@dataclasses.dataclass(frozen=True)
class EvalSpec:
    """`eval.*`: every `every_steps` steps (0: at the end), `num_batches` of `batch_size`."""

    every_steps: int
    num_batches: int
    batch_size: int
    #: lm-evaluation-harness tasks run every `harness_every_steps` steps (() and 0: none).
    harness_tasks: tuple[str, ...] = ()
    harness_every_steps: int = 0
    #: Documents per harness task (0: all).
    harness_limit: int = 0
    #: More directories of YAML task definitions.
    harness_include_path: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class CheckpointSpec:
    """`checkpoint.*`: when to save, what to keep, how to verify, where to warm start from.

    Attributes:
        export_hf: with every checkpoint, also write the parameters as a Hugging Face
            checkpoint in `<run_dir>/hf/step_XXXXXXXX/` (`meltemi.models.hf.save`).
    """

    enabled: bool
    save_every_steps: int
    save_every_minutes: float
    keep_every_steps: int
    async_save: bool
    verify: str
    init_from: str
    export_hf: bool = False


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """`mesh.*`: axis sizes within a slice (ici) and across slices (dcn); -1 fills the rest."""

    ici: tuple[tuple[str, int], ...]
    dcn: tuple[tuple[str, int], ...]
    num_slices: int
    #: Elastic multislice: the fewest slices the job trains on (== num_slices: not elastic).
    min_slices: int = 0

    @property
    def ici_sizes(self) -> dict[str, int]:
        return dict(self.ici)

    @property
    def dcn_sizes(self) -> dict[str, int]:
        return dict(self.dcn)

    @property
    def fixed_devices(self) -> int | None:
        """Devices the mesh needs when no ici axis is -1 (else None: every device)."""
        if any(s == -1 for _, s in self.ici):
            return None
        n = 1
        for _, s in self.ici:
            n *= s
        return n * self.num_slices


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """`data.*`: where the text comes from, how it is tokenized and packed.

    Attributes:
        source: "stdlib", "files" or "mixture".
        train: the training source (None for a mixture: `mixture` has the components).
        validation: evaluation sources by the name their metrics carry.
        mixture: the checked mixture (`data.source == "mixture"`), else None.
        cache_dir: where token stores are cached.
        packing: how documents become rows, one of `meltemi.data.PACKINGS`: "stream"
            (concatenate and cut every `seq_len` tokens; no padding) or "whole_documents"
            (a document shorter than `seq_len` never straddles two rows; pad, loss-masked).
    """

    source: str
    train: md.Source | None
    validation: tuple[tuple[str, md.Source], ...]
    mixture: MixturePlan | None
    tokenizer: str
    bos_token: str | None
    eos_token: str | None
    seq_len: int
    cache_dir: pathlib.Path
    shuffle_seed: int
    packing: str = "stream"


@dataclasses.dataclass(frozen=True)
class LoggingSpec:
    """`logging.*`: TensorBoard event files and Weights & Biases."""

    tensorboard: bool
    wandb: bool
    wandb_project: str
    wandb_mode: str


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


def resolve_run_dir(name: str, run_dir: str) -> pathlib.Path | epath.Path:
    """`run_dir`, or `runs/<name>`, relative to the directory the user started from.

    Under `bazel run` the working directory is the runfiles tree, so relative paths are
    taken against `$BUILD_WORKING_DIRECTORY` instead. A `gs://bucket/dir` URL is an
    `etils.epath.Path` (what orbax writes through).

    Raises:
        ConfigError: another scheme (`s3://`: orbax writes checkpoint arrays to local paths
            and `gs://` only), or `gs://` without `gcsfs` installed.
    """
    text = run_dir or os.path.join("runs", name)
    scheme = re.match(r"^([a-z][a-z0-9+.-]*)://", text)
    if scheme:
        return _object_store_dir(text, scheme.group(1))
    path = pathlib.Path(text).expanduser()
    if not path.is_absolute():
        path = pathlib.Path(os.environ.get("BUILD_WORKING_DIRECTORY") or os.getcwd()) / path
    return path


def _object_store_dir(text: str, scheme: str) -> epath.Path:
    """A `gs://bucket/dir` run directory, checked (pathlib would make it `gs:/bucket/dir`)."""
    if scheme != "gs":
        raise ConfigError(
            f"run_dir={text!r}: only gs:// object storage is supported (orbax writes "
            f"checkpoint arrays to gs:// through tensorstore, not to {scheme}://); use "
            f"--config.run_dir=gs://BUCKET/DIR, or a local path or a mount of the bucket."
        )
    bucket = text[len("gs://") :].split("/", 1)[0]
    if not bucket or not text[len("gs://") + len(bucket) :].strip("/"):
        raise ConfigError(
            f"run_dir={text!r}: name a directory inside the bucket, e.g. "
            f"--config.run_dir=gs://{bucket or 'BUCKET'}/runs/NAME."
        )
    try:
        fsspec.get_filesystem_class("gs")
    except (ImportError, ValueError) as e:
        raise ConfigError(
            f"run_dir={text!r}: gs:// needs the gcsfs package (orbax's metadata and the run's "
            f"metrics go through fsspec): {e}"
        ) from None
    return epath.Path(text.rstrip("/"))


def default_cache_dir(cache_dir: str) -> pathlib.Path:
    """`data.cache_dir`, else `$MELTEMI_CACHE/data`, else `~/.cache/meltemi/data`."""
    if cache_dir:
        return pathlib.Path(cache_dir).expanduser()
    root = os.environ.get("MELTEMI_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "meltemi"
    )
    return pathlib.Path(root) / "data"


def _int(key: str, value: Any, *, minimum: int, example: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(
            f"{key}={value!r}: must be an int >= {minimum}; e.g. --config.{key}={example}."
        )
    return value


def _number(key: str, value: Any, *, example: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ConfigError(f"{key}={value!r}: must be a number >= 0; e.g. --config.{key}={example}.")
    return float(value)


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f" Did you mean --config.{key}={close[0]}?" if close else ""
        raise ConfigError(f"{key}={value!r}: must be one of {choices}.{hint}")
    return value


def _paths(key: str, value: Any) -> tuple[str, ...]:
    """A tuple of paths; a bare string (a path, not a tuple of one) is refused with the fix."""
    if isinstance(value, str):
        raise ConfigError(
            f"{key}={value!r} is a string; it takes a tuple of paths or globs: "
            f'--config.{key}="({value!r},)".'
        )
    if not isinstance(value, tuple | list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(
            f"{key}={value!r}: a tuple of paths or globs, e.g. --config.{key}=\"('a/*.txt',)\"."
        )
    return tuple(value)


def compute_dtype(value: Any) -> str:
    """Checks `trainer.compute_dtype`: an alias names the spelling, float16 is refused.

    Example:
        >>> compute_dtype("bfloat16")
        'bfloat16'
    """
    key = "trainer.compute_dtype"
    if value in _DTYPE_ALIASES:
        right = _DTYPE_ALIASES[value]
        raise ConfigError(
            f"{key}={value!r}: write the dtype's name, --config.{key}={right} "
            f"(one of {COMPUTE_DTYPES})."
        )
    if value in _FLOAT16:
        raise ConfigError(
            f"{key}={value!r}: float16 needs loss scaling, which this trainer does not do "
            f"(gradients would underflow); use --config.{key}=bfloat16 (same memory, float32's "
            f"exponent range)."
        )
    return _choice(key, value, COMPUTE_DTYPES)


def _profile(value: Any, num_steps: int) -> tuple[int, int] | None:
    key = "trainer.profile"
    if value in ((), None):
        return None
    ok = (
        isinstance(value, tuple | list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )
    if not ok or not 1 <= value[0] <= value[1] <= num_steps:
        raise ConfigError(
            f"{key}={value!r}: (FIRST, LAST), the steps to trace, 1 <= FIRST <= LAST <= "
            f'trainer.num_train_steps={num_steps}; e.g. --config.{key}="(5, 7)" (a few '
            f"steps after the compile)."
        )
    return int(value[0]), int(value[1])


def _trainer(c: ml_collections.ConfigDict) -> TrainerSpec:
    steps = _int("trainer.num_train_steps", c.num_train_steps, minimum=1, example=1000)
    batch = _int("trainer.train_batch_size", c.train_batch_size, minimum=1, example=8)
    sizes = BatchSizes.parse(c.batch_schedule, batch)
    micro = _int("trainer.microbatches", c.microbatches, minimum=1, example=1)
    for start, size in sizes.segments:
        if size % micro:
            raise ConfigError(
                f"trainer.microbatches={micro} does not divide the batch size {size} (from "
                f"step {start}); pick a divisor, e.g. --config.trainer.microbatches=1."
            )
    return TrainerSpec(
        num_train_steps=steps,
        seed=c.seed,
        batch_sizes=sizes,
        microbatches=micro,
        compute_dtype=compute_dtype(c.compute_dtype),
        z_loss=_number("trainer.z_loss", c.z_loss, example=1e-4),
        progress_bar=c.progress_bar,
        peak_flops_per_device=_number(
            "trainer.peak_flops_per_device", c.peak_flops_per_device, example=0.0
        ),
        profile=_profile(c.profile, steps),
    )


def _harness_tasks(value: Any) -> tuple[str, ...]:
    key = "eval.harness_tasks"
    if isinstance(value, str):
        names = tuple(t.strip() for t in value.split(",") if t.strip())
    elif isinstance(value, tuple | list) and all(isinstance(t, str) and t for t in value):
        names = tuple(value)
    else:
        raise ConfigError(
            f"{key}={value!r}: a tuple of lm-eval task names, e.g. "
            f'--config.{key}="(\'meltemi_tiny_mc\',)" (or "task_a,task_b").'
        )
    if len(set(names)) != len(names):
        raise ConfigError(f"{key}={value!r}: a task is named twice; name each once.")
    return names


def _eval(c: ml_collections.ConfigDict) -> EvalSpec:
    tasks = _harness_tasks(c.harness_tasks)
    every = _int("eval.harness_every_steps", c.harness_every_steps, minimum=0, example=500)
    limit = _int("eval.harness_limit", c.harness_limit, minimum=0, example=100)
    include = _paths("eval.harness_include_path", c.harness_include_path)
    if tasks and not every:
        raise ConfigError(
            f"eval.harness_tasks={tasks!r} needs eval.harness_every_steps (how often to run "
            f"them), e.g. --config.eval.harness_every_steps=500."
        )
    for key, value, default in (
        ("eval.harness_every_steps", every, 0),
        ("eval.harness_limit", limit, 0),
        ("eval.harness_include_path", include, ()),
    ):
        if value != default and not tasks:
            raise InertKeyError(
                f"{key}={value!r} has no effect without eval.harness_tasks; name the tasks, "
                f"e.g. --config.eval.harness_tasks=\"('meltemi_tiny_mc',)\", or drop {key}."
            )
    for path in include:
        if not pathlib.Path(path).expanduser().is_dir():
            raise ConfigError(
                f"eval.harness_include_path: {path!r} is not a directory (of lm-eval task YAML "
                f"files); fix the path."
            )
    return EvalSpec(
        every_steps=_int("eval.every_steps", c.every_steps, minimum=0, example=100),
        num_batches=_int("eval.num_batches", c.num_batches, minimum=0, example=4),
        batch_size=_int("eval.batch_size", c.batch_size, minimum=1, example=8),
        harness_tasks=tasks,
        harness_every_steps=every,
        harness_limit=limit,
        harness_include_path=include,
    )


def _checkpoint(c: ml_collections.ConfigDict) -> CheckpointSpec:
    return CheckpointSpec(
        enabled=c.enabled,
        save_every_steps=_int(
            "checkpoint.save_every_steps", c.save_every_steps, minimum=0, example=100
        ),  # fmt: skip
        save_every_minutes=_number(
            "checkpoint.save_every_minutes", c.save_every_minutes, example=30.0
        ),
        keep_every_steps=_int(
            "checkpoint.keep_every_steps", c.keep_every_steps, minimum=0, example=1000
        ),  # fmt: skip
        async_save=c.async_save,
        verify=_choice(
            "checkpoint.verify", {"sha256": "checksums"}.get(c.verify, c.verify), VERIFY_MODES
        ),  # "sha256" is the former name of "checksums"
        init_from=c.init_from,
        export_hf=_export_hf(c),
    )


def _export_hf(c: ml_collections.ConfigDict) -> bool:
    if not isinstance(c.export_hf, bool):
        raise ConfigError(
            f"checkpoint.export_hf={c.export_hf!r}: true or false, e.g. "
            f"--config.checkpoint.export_hf=true."
        )
    if c.export_hf and not c.enabled:
        raise InertKeyError(
            "checkpoint.export_hf=True has no effect while checkpoint.enabled=False (it exports "
            "with every checkpoint); enable checkpoints, or export the final parameters with "
            "--export_hf=DIR."
        )
    return c.export_hf


def _mesh(c: ml_collections.ConfigDict) -> MeshSpec:
    num_slices = _int("mesh.num_slices", c.num_slices, minimum=1, example=2)
    try:
        ici = check_sizes(c.ici.to_dict(), "ici")
        dcn = check_sizes(c.dcn.to_dict(), "dcn")
    except MeshConfigError as e:
        raise ConfigError(str(e)) from None
    fixed_dcn = [s for s in dcn.values() if s != -1]
    product = 1
    for s in fixed_dcn:
        product *= s
    if -1 not in dcn.values() and product != num_slices:
        raise ConfigError(
            f"mesh.dcn: sizes {dcn} multiply to {product}, but mesh.num_slices={num_slices}; "
            f"set one dcn axis to -1 (e.g. --config.mesh.dcn.data=-1)."
        )
    if -1 in dcn.values() and num_slices % product:
        raise ConfigError(
            f"mesh.dcn: the fixed sizes multiply to {product}, which does not divide "
            f"mesh.num_slices={num_slices}."
        )
    min_slices = _min_slices(c.min_slices, num_slices, product if -1 in dcn.values() else None)
    return MeshSpec(
        tuple((a, ici[a]) for a in MESH_AXES),
        tuple((a, dcn[a]) for a in MESH_AXES),
        num_slices,
        min_slices,
    )


def _min_slices(value: Any, num_slices: int, fixed_dcn: int | None) -> int:
    """`mesh.min_slices` checked against `mesh.num_slices` (0: num_slices, not elastic)."""
    value = _int("mesh.min_slices", value, minimum=0, example=max(1, num_slices - 1))
    if value == 0:
        return num_slices
    if value > num_slices:
        raise ConfigError(
            f"mesh.min_slices={value}: more than mesh.num_slices={num_slices}; the floor must "
            f"be at most the target, e.g. --config.mesh.min_slices={max(1, num_slices - 1)}."
        )
    if value < num_slices and fixed_dcn is None:
        raise ConfigError(
            f"mesh.min_slices={value} < mesh.num_slices={num_slices}, but every mesh.dcn axis "
            "has a fixed size, so the mesh cannot shrink; set one dcn axis to -1 "
            "(e.g. --config.mesh.dcn.data=-1)."
        )
    bad = [n for n in range(value, num_slices + 1) if fixed_dcn and n % fixed_dcn]
    if bad:
        raise ConfigError(
            f"mesh.min_slices={value}: the job may run on {bad[0]} slices, which the fixed "
            f"mesh.dcn sizes (product {fixed_dcn}) do not divide; raise mesh.min_slices to "
            f"a multiple of {fixed_dcn}."
        )
    return value


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


def _validation_files(files: tuple[str, ...]) -> dict[str, md.Source]:
    """One evaluation source per `data.validation_files` entry, tagged by its file name."""
    validation = {}
    for entry in files:
        name = pathlib.Path(entry).name.split(".")[0].replace("*", "all") or "validation"
        validation[name] = file_source(name, (entry,))
    return validation


def _data(config: ml_collections.ConfigDict) -> DataSpec:
    c = config.data
    source = _choice("data.source", c.source, SOURCES)
    plan = mixture_plan(config)  # None unless a mixture; refuses components without one
    train_files = _paths("data.train_files", c.train_files)
    validation_files = _paths("data.validation_files", c.validation_files)
    validation = _validation_files(validation_files)
    train = None
    if source == "stdlib":
        if train_files:
            raise InertKeyError(
                f"data.train_files={train_files!r} has no effect with data.source='stdlib'; "
                "train on them with --config.data.source=files."
            )
        train = md.stdlib_corpus("train")
        validation = {"stdlib": md.stdlib_corpus("validation"), **validation}
    elif source == "files":
        if not train_files:
            raise ConfigError(
                "data.source='files' needs data.train_files: a tuple of paths or globs, e.g. "
                "--config.data.train_files=\"('corpus/*.jsonl',)\"."
            )
        train = file_source("train", train_files)
    else:
        for c_ in plan.components:
            if c_.validation is not None and c_.name in validation:
                raise ConfigError(
                    f"data.validation_files: the evaluation set {c_.name!r} (from its file name)"
                    f" has the name of a component's validation set; rename the file or the "
                    f"component."
                )
    return DataSpec(
        source=source,
        train=train,
        validation=tuple(validation.items()),
        mixture=plan,
        tokenizer=c.tokenizer,
        bos_token=c.bos_token,
        eos_token=c.eos_token,
        seq_len=_int("data.seq_len", c.seq_len, minimum=2, example=128),
        cache_dir=default_cache_dir(c.cache_dir),
        shuffle_seed=c.shuffle_seed,
        packing=_choice("data.packing", c.packing, md.PACKINGS),
    )


def _logging(c: ml_collections.ConfigDict) -> LoggingSpec:
    return LoggingSpec(
        tensorboard=c.tensorboard,
        wandb=c.wandb,
        wandb_project=c.wandb_project,
        wandb_mode=_choice("logging.wandb_mode", c.wandb_mode, WANDB_MODES),
    )


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
    if c.model.init_from_hf and resolved.provenance.get("model.preset", "default") != "default":
        raise InertKeyError(
            f"model.preset={c.model.preset!r} has no effect with model.init_from_hf="
            f"{c.model.init_from_hf!r} (the checkpoint's config.json is the model); drop one."
        )
    if c.model.init_from_hf and c.checkpoint.init_from:
        raise ConfigError(
            f"model.init_from_hf={c.model.init_from_hf!r} and checkpoint.init_from="
            f"{c.checkpoint.init_from!r} both set the initial weights; keep one."
        )
    trainer = _trainer(c.trainer)
    data = _data(c)
    tokenizer = make_tokenizer(data.tokenizer, data.bos_token, data.eos_token)
    model = model_config(c.model, tokenizer, data.seq_len)
    spec = RunSpec(
        name=c.name,
        run_dir=resolve_run_dir(c.name, c.run_dir),
        trainer=trainer,
        eval=_eval(c.eval),
        checkpoint=_checkpoint(c.checkpoint),
        mesh=_mesh(c.mesh),
        model=model,
        preset=c.model.preset,
        init_from_hf=c.model.init_from_hf,
        lora=lora_config(c.model.lora, model),
        optimizer=optimizer_config(c.optimizer, trainer.num_train_steps),
        data=data,
        logging=_logging(c.logging),
        tokenizer=tokenizer,
        resolved=resolved,
    )
    _check_elastic_batches(spec.trainer, spec.mesh)
    return spec


def as_spec(config: RunSpec | ResolvedConfig | ml_collections.ConfigDict) -> RunSpec:
    """A `RunSpec` from any of the forms a caller may hold (resolving it if needed)."""
    return config if isinstance(config, RunSpec) else resolve(config)
