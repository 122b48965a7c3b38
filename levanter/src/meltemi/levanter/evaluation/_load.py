"""What `//levanter:eval` and the harness evaluate: a run checkpoint or a Hugging Face directory.

A run checkpoint (`runs/<name>/checkpoints/step_N`, or the run directory itself for its newest
complete step) is read with the run's config (its `config.json`, or `--config`); a Hugging
Face directory (`config.json` + `*.safetensors`) with `meltemi.models.hf.load`.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import ml_collections

import meltemi.models as mm
from meltemi import data as md
from meltemi.levanter.checkpoint import (
    CheckpointError,
    flatten_state,
    read_manifest,
    restore_arrays,
    unflatten_state,
    verify_checkpoint,
)
from meltemi.levanter.config import ConfigError, ResolvedConfig, RunSpec, base_config, resolve
from meltemi.levanter.evaluation._errors import EvalError
from meltemi.levanter.mesh import PARAMETER_RULES, make_mesh
from meltemi.levanter.runtime import (
    DTYPES,
    cast_floating,
    compute_context,
    mesh_of,
    tree_shardings,
    with_shardings,
)


@dataclasses.dataclass(kw_only=True)
class LoadedModel:
    """A model ready to evaluate (built with keywords: nine fields are too many to order).

    Attributes:
        path: the checkpoint directory.
        kind: "run" (a trainer checkpoint) or "hf" (a Hugging Face directory).
        params: the model's arrays, on `mesh`.
        static: the model's non-array half (`eqx.combine(params, static)` is the model).
        tokenizer: the tokenizer the model reads.
        mesh: the device mesh the parameters live on.
        compute_dtype: the dtype of the forward pass.
        spec: the run's checked config (a run checkpoint, or `--config`), else None.
        step: the trained step of a run checkpoint, else None.
    """

    path: pathlib.Path
    kind: str
    params: Any
    static: Any
    tokenizer: md.Tokenizer
    mesh: jax.sharding.Mesh
    compute_dtype: Any
    spec: RunSpec | None = None
    step: int | None = None

    @property
    def model(self) -> mm.Transformer:
        """The model (parameters cast to the compute dtype)."""
        return eqx.combine(cast_floating(self.params, self.compute_dtype), self.static)

    @property
    def config(self) -> mm.ModelConfig:
        return self.static.config


def _newest_step(run_dir: pathlib.Path) -> pathlib.Path | None:
    steps = []
    for p in (run_dir / "checkpoints").glob("step_*"):
        if p.name[5:].isdigit() and read_manifest(p) is not None:
            steps.append((int(p.name[5:]), p))
    return max(steps)[1] if steps else None


def find_checkpoint(checkpoint: str) -> tuple[str, pathlib.Path]:
    """`("run" | "hf", directory)` of `--checkpoint`.

    Raises:
        EvalError: the path does not exist or is neither kind, naming what was looked for.
    """
    path = pathlib.Path(checkpoint).expanduser().absolute()
    if not path.exists():
        raise EvalError(
            f"--checkpoint={checkpoint!r}: no such directory; pass a run checkpoint "
            f"(runs/<name>/checkpoints/step_N) or a Hugging Face directory (config.json + "
            f"*.safetensors)."
        )
    if (path / "config.json").is_file() and any(path.glob("*.safetensors")):
        return "hf", path
    if (path / "checkpoints").is_dir():  # a run directory: its newest complete step
        newest = _newest_step(path)
        if newest is None:
            raise EvalError(
                f"--checkpoint={checkpoint!r}: a run directory without a complete checkpoint "
                f"under checkpoints/; train it first or pass a checkpoint directory."
            )
        return "run", newest
    if (path / "state").exists() or path.name.startswith("step_"):
        problem = verify_checkpoint(path)
        if problem is not None:
            raise EvalError(f"--checkpoint={checkpoint!r}: not a usable checkpoint: {problem}.")
        return "run", path
    raise EvalError(
        f"--checkpoint={checkpoint!r}: neither a run checkpoint (a step_N directory with a "
        f"manifest) nor a Hugging Face directory (config.json + *.safetensors)."
    )


def run_config(checkpoint_dir: pathlib.Path) -> ResolvedConfig:
    """The config of the run a checkpoint belongs to (`<run_dir>/config.json`).

    Raises:
        EvalError: no config.json two levels up; pass --config.
    """
    path = checkpoint_dir.parent.parent / "config.json"
    if not path.is_file():
        raise EvalError(
            f"--checkpoint={str(checkpoint_dir)!r}: no run config at {path} (the checkpoint is "
            f"not inside runs/<name>/checkpoints/); pass the run's config with --config=..."
        )
    try:
        saved = ResolvedConfig.from_json(path.read_text())
    except (OSError, ValueError, KeyError) as e:
        raise EvalError(f"{path}: unreadable run config ({e}); pass --config=...") from None
    return with_defaults(saved)


def with_defaults(saved: ResolvedConfig) -> ResolvedConfig:
    """A saved config with the keys added to `base_config()` since it was written (at their
    defaults), so that a run of an older version still resolves."""
    config = base_config()

    def merge(dst: ml_collections.ConfigDict, src: dict) -> None:
        for key, value in src.items():
            if isinstance(value, dict) and isinstance(dst.get(key), ml_collections.ConfigDict):
                merge(dst[key], value)
            else:
                dst[key] = value

    merge(config, saved.config.to_dict())
    config.lock()
    return dataclasses.replace(saved, config=config)


def eval_mesh(spec: RunSpec | None) -> jax.sharding.Mesh:
    """The run's mesh when it fits these devices, else data parallel over all of them."""
    if spec is not None:
        try:
            return mesh_of(spec)
        except ConfigError:
            pass
    return make_mesh({"data": -1})


def _load_run(path: pathlib.Path, spec: RunSpec) -> tuple[Any, Any, jax.sharding.Mesh, int]:
    mesh = eval_mesh(spec)
    config = spec.model
    abstract = eqx.filter_eval_shape(
        lambda k: mm.Transformer.init(config, key=k), jax.random.key(spec.trainer.seed)
    )
    is_abstract = lambda x: isinstance(x, jax.ShapeDtypeStruct)  # noqa: E731
    abstract_params, static = eqx.partition(abstract, is_abstract)
    template = with_shardings(
        tree_shardings(abstract_params, mesh, PARAMETER_RULES), abstract_params
    )
    wanted = flatten_state({"params": template})
    try:
        loaded = restore_arrays(path, wanted)
    except CheckpointError as e:
        raise EvalError(f"--checkpoint={str(path)!r}: {e}") from None
    missing = sorted(set(wanted) - set(loaded))
    if missing:
        raise EvalError(
            f"--checkpoint={str(path)!r}: the checkpoint has no {missing[0]} (and "
            f"{len(missing) - 1} more arrays) for the config's model ({spec.preset}); pass the "
            f"config the run trained with (--config=...)."
        )
    params = unflatten_state({"params": template}, loaded)["params"]
    manifest = read_manifest(path) or {}
    return params, static, mesh, int(manifest.get("step", -1))


def _hf_tokenizer(path: pathlib.Path, spec: RunSpec | None) -> md.Tokenizer:
    if (path / "tokenizer.json").is_file():
        try:
            return md.HfTokenizer(str(path / "tokenizer.json"))
        except md.TokenizerError as e:
            raise EvalError(f"{path / 'tokenizer.json'}: {e}") from None
    if spec is not None:
        return spec.tokenizer
    raise EvalError(
        f"--checkpoint={str(path)!r}: no tokenizer.json in the Hugging Face directory; copy the "
        f"model's tokenizer.json there or pass a --config whose data.tokenizer is it."
    )


def _load_hf(path: pathlib.Path, spec: RunSpec | None) -> tuple[Any, Any, jax.sharding.Mesh]:
    mesh = eval_mesh(spec)
    try:
        model, _ = mm.hf.load(path, dtype=jnp.float32)
    except (mm.hf.CheckpointError, mm.SafetensorsError, mm.HfConfigError, mm.ConfigError) as e:
        raise EvalError(f"--checkpoint={str(path)!r}: {e}") from None
    params, static = eqx.partition(model, eqx.is_array)
    with compute_context(mesh):
        params = jax.device_put(params, tree_shardings(params, mesh, PARAMETER_RULES))
    return params, static, mesh


def load_model(checkpoint: str, config: ResolvedConfig | None = None) -> LoadedModel:
    """Loads `--checkpoint` (a run checkpoint, run directory or Hugging Face directory).

    Args:
        checkpoint: the directory.
        config: the run's config (default: the run directory's `config.json`; for a Hugging
            Face directory, optional: its evaluation sets and compute dtype).

    Raises:
        EvalError: naming the path and the fix.
    """
    kind, path = find_checkpoint(checkpoint)
    if kind == "run":
        resolved = config if config is not None else run_config(path)
        spec = resolve(resolved)
        params, static, mesh, step = _load_run(path, spec)
        dtype = DTYPES[spec.trainer.compute_dtype]
        return LoadedModel(
            path=path,
            kind=kind,
            params=params,
            static=static,
            tokenizer=spec.tokenizer,
            mesh=mesh,
            compute_dtype=dtype,
            spec=spec,
            step=step,
        )
    spec = resolve(config) if config is not None else None
    params, static, mesh = _load_hf(path, spec)
    dtype = DTYPES[spec.trainer.compute_dtype] if spec is not None else jnp.float32
    return LoadedModel(
        path=path,
        kind=kind,
        params=params,
        static=static,
        tokenizer=_hf_tokenizer(path, spec),
        mesh=mesh,
        compute_dtype=dtype,
        spec=spec,
    )
