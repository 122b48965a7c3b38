"""Hugging Face checkpoints in the trainer: `model.init_from_hf` and `--export_hf`."""

from __future__ import annotations

import pathlib
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

import meltemi.models as mm
from meltemi.levanter.config import ConfigError, RunSpec
from meltemi.levanter.runtime import compute_context
from meltemi.levanter.trainer._lora import lora_model, merged
from meltemi.levanter.trainer._plan import Plan
from meltemi.levanter.trainer._step import TrainState


def hf_params(spec: RunSpec, plan: Plan) -> Any:
    """The parameters of `model.init_from_hf` (float32 master weights), sharded on the mesh.

    Raises:
        ConfigError: the checkpoint's tensors do not fit the model (`model.*` keys changed
            its shapes), naming the key.
    """
    try:
        model, _ = mm.hf.load(spec.init_from_hf, config=spec.model, dtype=jnp.float32)
    except (mm.hf.CheckpointError, mm.SafetensorsError, FileNotFoundError) as e:
        raise ConfigError(f"model.init_from_hf={spec.init_from_hf!r}: {e}") from None
    model = lora_model(spec, model, jax.random.key(spec.trainer.seed))
    params = eqx.filter(model, eqx.is_array)
    with compute_context(plan.mesh):
        return jax.device_put(params, plan.state_sharding.params)


def init_from_hf(spec: RunSpec, plan: Plan, state: TrainState) -> TrainState:
    """A fresh train state whose parameters are the checkpoint's (optimizer state new)."""
    params = hf_params(spec, plan)
    with compute_context(plan.mesh):
        opt_state = jax.jit(plan.parts.optimizer.init, out_shardings=plan.state_sharding.opt_state)(
            params
        )
    return TrainState(state.step, params, opt_state)


def export_hf(spec: RunSpec, plan: Plan, state: TrainState, directory: pathlib.Path) -> list[str]:
    """Writes the parameters of `state` as a Hugging Face checkpoint `transformers` loads.

    The tokenizer's files are copied too when the run uses a `tokenizer.json`.
    """
    if jax.process_count() > 1:
        raise ConfigError(
            "--export_hf: exporting from a multi-process run is not supported; export from "
            "its final checkpoint in one process (the same command on one host)."
        )
    model = merged(eqx.combine(jax.device_get(state.params), plan.static))
    tokenizer = None
    if spec.data.tokenizer != "byte":
        path = pathlib.Path(spec.data.tokenizer).expanduser()
        tokenizer = str(path if path.is_dir() else path.parent)
    return mm.hf.save(model, spec.model, directory, tokenizer=tokenizer)
