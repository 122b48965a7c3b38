"""LoRA in the trainer (`model.lora.rank > 0`): adapters on the model, only they are trained.

Three wrappers around the parts a run is made of, each the identity when LoRA is off:
`lora_init` puts adapters on the initial (or `model.init_from_hf`) model, `lora_loss` stops
gradients through the frozen weights and draws the adapters' dropout mask, and
`lora_optimizer` keeps optimizer state for the adapters alone and zeroes every other update,
so the base weights stay bit-identical. Checkpoints hold the whole state (base and adapters),
so resuming needs nothing special; `--export_hf` merges, `--export_peft` writes the adapter.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import meltemi.models as mm
from meltemi.levanter.config import ConfigError, RunSpec

# Folded into the run's seed for the adapters' A init, so the base model's init is the same
# as without LoRA.
_ADAPTER_STREAM = 0x10A


def lora_model(spec: RunSpec, model: Any, key: jax.Array) -> Any:
    """`model` with the adapters of `spec.lora` (unchanged when LoRA is off)."""
    if not spec.lora.enabled:
        return model
    return mm.lora.apply(model, spec.lora, key=jax.random.fold_in(key, _ADAPTER_STREAM))


def lora_init(spec: RunSpec, init_model: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`init_model` followed by `lora_model` (the same base weights as a run without LoRA)."""
    if not spec.lora.enabled:
        return init_model
    return lambda key: lora_model(spec, init_model(key), key)


def _batch_key(seed: int, batch: Mapping[str, Any]) -> jax.Array:
    # The dropout mask is a function of the seed and the batch's tokens: a resumed run draws
    # the same masks for the same steps, with no key in the train state.
    tokens = jnp.asarray(batch["tokens"]).astype(jnp.uint32)
    weights = jnp.arange(1, tokens.size + 1, dtype=jnp.uint32).reshape(tokens.shape)
    return jax.random.fold_in(jax.random.key(seed), jnp.sum(tokens * weights))


def lora_loss(spec: RunSpec, loss_fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """`loss_fn` with gradients only for the adapters, and the adapters' dropout."""
    if not spec.lora.enabled:
        return loss_fn
    dropout, seed = spec.lora.dropout, spec.trainer.seed

    def loss(model, batch):
        model = mm.lora.freeze(model)
        if dropout > 0:
            model = mm.lora.with_dropout_key(model, _batch_key(seed, batch))
        return loss_fn(model, batch)

    return loss


def lora_optimizer(spec: RunSpec, tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """`tx` on the adapters only (state for them alone; every other update is zero)."""
    return mm.lora.optimizer(tx) if spec.lora.enabled else tx


def merged(model: Any) -> Any:
    """The plain model `--export_hf` writes (adapters folded into the weights)."""
    return mm.lora.merge(model) if mm.lora.is_lora(model) else model


def export_peft(spec: RunSpec, params: Any, static: Any, directory: pathlib.Path) -> list[str]:
    """Writes the adapters of the model `params` + `static` as a PEFT adapter directory
    (`--export_peft`)."""
    model = eqx.combine(params, static)
    if not mm.lora.is_lora(model):
        raise ConfigError(
            "--export_peft: model.lora.rank=0, so the run has no adapters; set "
            "--config.model.lora.rank=8 (or use --export_hf for the whole model)."
        )
    try:
        return mm.lora.save_peft(
            model, directory, base_model_name_or_path=spec.init_from_hf or None
        )
    except mm.ConfigError as e:
        raise ConfigError(f"--export_peft: {e}") from None
