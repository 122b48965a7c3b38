"""Hugging Face checkpoints in the trainer: `model.init_from_hf` and `--export_hf`."""

from __future__ import annotations

import pathlib
import tempfile
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

import meltemi.data as md
import meltemi.models as mm
from meltemi.levanter.config import ConfigError, RunSpec, special_token_ids
from meltemi.levanter.evaluation import chat_eos_ids
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

    The tokenizer's files are copied too when the run uses a `tokenizer.json`; a run on the
    byte tokenizer gets one written (`ByteTokenizer.save_pretrained`). A run on chat data also
    writes its chat template into `tokenizer_config.json` (`chat_template`, with the
    special token strings) and the eos list of `meltemi.levanter.evaluation.chat_eos_ids`
    (the tokenizer's eos and the template's end of turn) into `generation_config.json`
    and `config.json`, so `apply_chat_template` and `generate` work on the export as they do
    in Meltemi.
    """
    if jax.process_count() > 1:
        raise ConfigError(
            "--export_hf: exporting from a multi-process run is not supported; export from "
            "its final checkpoint in one process (the same command on one host)."
        )
    model = merged(eqx.combine(jax.device_get(state.params), plan.static))
    with tempfile.TemporaryDirectory() as scratch:
        if spec.data.tokenizer == "byte":  # written as a byte-level tokenizer.json
            md.ByteTokenizer().save_pretrained(scratch)
            tokenizer = scratch
        else:
            path = pathlib.Path(spec.data.tokenizer).expanduser()
            tokenizer = str(path if path.is_dir() else path.parent)
        return _export(spec, model, tokenizer, directory)


def _export(spec: RunSpec, model, tokenizer: str, directory: pathlib.Path) -> list[str]:
    """`export_hf` with the tokenizer's files in the directory `tokenizer`."""
    config = spec.model
    template = spec.data.template
    if template is not None:
        specials = special_token_ids(spec.data.tokenizer, spec.tokenizer)
        eos = chat_eos_ids(spec.tokenizer, template, specials)
        config = config.replace(eos_token_id=eos[0] if len(eos) == 1 else eos)
    written = mm.hf.save(model, config, directory, tokenizer=tokenizer)
    if template is not None:
        template.save_pretrained(directory)
        written.append("tokenizer_config.json")
    return sorted(set(written))
