"""From config to run parts: tokenizer, token stores, model, loss and optimizer."""

from __future__ import annotations

import logging
import os
import pathlib
from typing import Any

import equinox as eqx
import jax
import numpy as np

import meltemi.models as mm
from meltemi import data as md
from meltemi.levanter import optim
from meltemi.levanter.checkpoint import array_names, flatten_state, restore_arrays, unflatten_state
from meltemi.levanter.trainer._parts import EvalSet, RunParts

logger = logging.getLogger(__name__)

SOURCES = ("stdlib",)


class BuildError(ValueError):
    """A model, data or optimizer setting that cannot be built (names the key and the fix)."""


def cache_dir(config) -> pathlib.Path:
    """Where token stores are cached: `data.cache_dir`, `$MELTEMI_CACHE/data` or ~/.cache."""
    if config.data.cache_dir:
        return pathlib.Path(config.data.cache_dir).expanduser()
    root = os.environ.get("MELTEMI_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "meltemi"
    )
    return pathlib.Path(root) / "data"


def make_tokenizer(name: str) -> md.Tokenizer:
    """`data.tokenizer`: "byte", or the path of a Hugging Face `tokenizer.json`."""
    if name == "byte":
        return md.ByteTokenizer()
    path = pathlib.Path(name).expanduser()
    if not path.exists():
        raise BuildError(
            f"data.tokenizer={name!r}: neither 'byte' nor an existing tokenizer.json path; "
            "use --config.data.tokenizer=byte or a path to a tokenizer.json file."
        )
    return md.HfTokenizer(str(path))


def build_stores(config, tokenizer: md.Tokenizer) -> tuple[md.TokenStore, md.TokenStore]:
    """The train and validation token stores (built once, then reopened from the cache)."""
    source = config.data.source
    if source not in SOURCES:
        raise BuildError(f"data.source={source!r}: known sources are {SOURCES}.")
    root = cache_dir(config) / f"{source}-{tokenizer.fingerprint()[:12]}"
    stores = []
    for split in ("train", "validation"):
        path = root / split
        if jax.process_index() == 0:
            store = md.build_store([md.stdlib_corpus(split)], tokenizer, path)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"meltemi store {split}")
        store = md.TokenStore.open(path, tokenizer)
        stores.append(store)
    return stores[0], stores[1]


def model_config(config, tokenizer: md.Tokenizer) -> mm.ModelConfig:
    """The preset `model.preset` with every non-None `model.*` key applied."""
    try:
        base = mm.get_preset(config.model.preset)
    except (KeyError, ValueError, mm.ConfigError) as e:
        raise BuildError(f"model.preset={config.model.preset!r}: {e}") from None
    changes: dict[str, Any] = {}
    for key, value in config.model.items():
        if key in ("preset", "rope_theta") or value is None:
            continue
        changes[key] = value
    if config.model.rope_theta is not None:
        changes["rope"] = base.rope.replace(theta=float(config.model.rope_theta))
    changes["vocab_size"] = tokenizer.vocab_size
    changes["bos_token_id"] = tokenizer.bos_id
    changes["eos_token_id"] = tokenizer.eos_id
    if config.data.seq_len > base.max_seq_len and config.model.max_seq_len is None:
        changes["max_seq_len"] = config.data.seq_len
    try:
        result = base.replace(**changes)
    except mm.ConfigError as e:
        raise BuildError(f"model.*: {e}") from None
    if config.data.seq_len > result.max_seq_len:
        raise BuildError(
            f"data.seq_len={config.data.seq_len} exceeds model.max_seq_len="
            f"{result.max_seq_len}; raise --config.model.max_seq_len or lower data.seq_len."
        )
    return result


def _batch_args(batch) -> dict[str, Any]:
    return {
        "loss_mask": batch["loss_mask"],
        "segment_ids": batch.get("segment_ids"),
        "positions": batch.get("positions"),
    }


def make_loss_fns(z_loss: float):
    """(train loss with z-loss, eval (sum of NLL, loss tokens)) for a `meltemi.models` LM."""

    def loss_fn(model, batch):
        return model.loss(batch["tokens"], batch["targets"], z_loss=z_loss, **_batch_args(batch))

    def eval_loss_fn(model, batch):
        _, metrics = model.loss_and_metrics(batch["tokens"], batch["targets"], **_batch_args(batch))
        count = batch["loss_mask"].sum()
        return metrics["cross_entropy"] * count, count

    return loss_fn, eval_loss_fn


def utf8_bytes(batch, tokenizer: md.Tokenizer) -> int:
    """UTF-8 bytes the loss tokens (the masked-in targets) of a host batch decode to."""
    total = 0
    for targets, mask in zip(batch["targets"], batch["loss_mask"], strict=True):
        total += len(tokenizer.decode(targets[mask > 0]).encode("utf-8"))
    return total


def eval_sets(config, store: md.TokenStore, tokenizer: md.Tokenizer) -> list[EvalSet]:
    """`eval.num_batches` fixed batches of the validation split, with their byte counts."""
    ds = md.PackedDataset(
        store, seq_len=config.data.seq_len, batch_size=config.eval.batch_size, seed=0
    )
    if config.eval.num_batches <= 0:
        return []
    n = config.eval.batch_size
    batches = [ds.sequences(np.arange(i * n, (i + 1) * n)) for i in range(config.eval.num_batches)]
    num_bytes = sum(utf8_bytes(b, tokenizer) for b in batches)
    return [EvalSet(config.data.source, batches, num_bytes)]


def make_warm_start(template_prefix: str = "params"):
    """Loads the arrays a checkpoint has into fresh params; lists what it initialised/ignored."""

    def warm_start(params, init_from: str):
        flat = flatten_state({template_prefix: params})
        loaded = restore_arrays(init_from, flat)
        missing = sorted(set(flat) - set(loaded))
        saved = set(array_names(init_from))
        ignored = sorted(k for k in saved - set(flat) if k.startswith(template_prefix + "."))
        report = [f"loaded {len(loaded)} arrays from {init_from}"]
        report += [f"initialised (not in the checkpoint): {k}" for k in missing]
        report += [f"ignored (not in this model): {k}" for k in ignored]
        return unflatten_state({template_prefix: params}, loaded)[template_prefix], report

    return warm_start


def build_parts(config, mesh: jax.sharding.Mesh | None = None) -> RunParts:
    """Everything a run needs, from the config."""
    del mesh  # the stores and model do not depend on it
    tokenizer = make_tokenizer(config.data.tokenizer)
    train_store, val_store = build_stores(config, tokenizer)
    mcfg = model_config(config, tokenizer)
    seq_len = config.data.seq_len
    train = md.PackedDataset(
        train_store,
        seq_len=seq_len,
        batch_size=config.trainer.train_batch_size,
        seed=config.data.shuffle_seed,
    )
    try:
        tx, _ = optim.build_optimizer(config.optimizer, total_steps=config.trainer.num_train_steps)
    except optim.OptimizerConfigError as e:
        raise BuildError(f"optimizer.*: {e}") from None
    loss_fn, eval_loss_fn = make_loss_fns(config.trainer.z_loss)
    params = mm.param_count(mcfg)
    return RunParts(
        init_model=lambda key: mm.Transformer.init(mcfg, key=key),
        loss_fn=loss_fn,
        eval_loss_fn=eval_loss_fn,
        optimizer=tx,
        metrics_fn=optim.metrics,
        train_data=train,
        seq_len=seq_len,
        eval_sets=eval_sets(config, val_store, tokenizer),
        describe=f"{config.model.preset} ({mcfg.family}, {params / 1e6:.2f}M params)",
        flops_per_token=mm.flops_per_token(mcfg, seq_len),
        warm_start=make_warm_start(),
    )


def abstract_parts(config) -> tuple[mm.ModelConfig, Any]:
    """Model config and abstract model for planning (no data, no arrays): the dry run."""
    tokenizer = make_tokenizer(config.data.tokenizer)
    mcfg = model_config(config, tokenizer)
    model = eqx.filter_eval_shape(lambda k: mm.Transformer.init(mcfg, key=k), jax.random.key(0))
    return mcfg, model
