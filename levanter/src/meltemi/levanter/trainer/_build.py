"""From config to run parts: tokenizer, token stores, model, loss and optimizer."""

from __future__ import annotations

import hashlib
import json
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
from meltemi.levanter.trainer._mixture import (
    MixtureConfigError,
    MixturePlan,
    file_source,
    fraction_metrics,
    make_mixture,
    mixture_plan,
)
from meltemi.levanter.trainer._parts import BuildError, EvalSet, RunParts
from meltemi.levanter.trainer._schedule import BatchSizes

logger = logging.getLogger(__name__)

SOURCES = ("stdlib", "files", "mixture")


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


def _sources(config) -> tuple[md.Source, dict[str, md.Source]]:
    """The train source and the validation sources by name."""
    data = config.data
    if data.source == "stdlib":
        return md.stdlib_corpus("train"), {"stdlib": md.stdlib_corpus("validation")}
    if data.source == "files":
        if not data.train_files:
            raise BuildError(
                "data.source='files' needs data.train_files: a tuple of paths or globs, e.g. "
                "--config.data.train_files=\"('corpus/*.jsonl',)\"."
            )
        return file_source("train", tuple(data.train_files)), _validation_files(data)
    raise BuildError(f"data.source={data.source!r}: known sources are {SOURCES}.")


def _validation_files(data) -> dict[str, md.Source]:
    """One evaluation source per `data.validation_files` entry, tagged by its file name."""
    validation = {}
    for entry in data.validation_files:
        name = pathlib.Path(entry).name.split(".")[0].replace("*", "all") or "validation"
        validation[name] = file_source(name, (entry,))
    return validation


def _store(path: pathlib.Path, source: md.Source, tokenizer: md.Tokenizer) -> md.TokenStore:
    if jax.process_index() == 0:
        md.build_store([source], tokenizer, path)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(f"meltemi store {path}")
    return md.TokenStore.open(path, tokenizer)


def build_stores(config, tokenizer: md.Tokenizer) -> tuple[md.TokenStore, dict[str, md.TokenStore]]:
    """The train store and one store per validation set (built once, then reopened)."""
    train, validation = _sources(config)
    key = hashlib.sha256(
        json.dumps(
            [train.fingerprint(), {k: v.fingerprint() for k, v in validation.items()}]
        ).encode()
    ).hexdigest()[:12]
    root = cache_dir(config) / f"{config.data.source}-{tokenizer.fingerprint()[:12]}-{key}"
    stores = {name: _store(root / f"validation-{name}", src, tokenizer)
              for name, src in validation.items()}  # fmt: skip
    return _store(root / "train", train, tokenizer), stores


def _source_store(config, key: str, source: md.Source, tokenizer: md.Tokenizer) -> md.TokenStore:
    """A store of one source, cached by the tokenizer and the source's fingerprint."""
    try:
        digest = hashlib.sha256(source.fingerprint().encode()).hexdigest()[:12]
    except md.SourceError as e:
        raise MixtureConfigError(f"{key}: {e}") from None
    path = cache_dir(config) / f"source-{source.name}-{tokenizer.fingerprint()[:12]}-{digest}"
    return _store(path, source, tokenizer)


def build_mixture(
    config, plan: MixturePlan, tokenizer: md.Tokenizer
) -> tuple[md.MixtureDataset, dict[str, md.TokenStore]]:
    """The train mixture (rows by global index, any batch-size schedule) and eval stores.

    Each component with a `validation` source is an evaluation set tagged by its name, and
    so is each `data.validation_files` entry (by its file name).
    """
    datasets, val_stores = {}, {}
    for c in plan.components:
        store = _source_store(config, f"data.components.{c.name}.source", c.source, tokenizer)
        datasets[c.name] = md.PackedDataset(
            store,
            seq_len=config.data.seq_len,
            batch_size=config.trainer.train_batch_size,
            seed=config.data.shuffle_seed,
        )
        if c.validation is not None:
            key = f"data.components.{c.name}.validation"
            val_stores[c.name] = _source_store(config, key, c.validation, tokenizer)
    for name, source in _validation_files(config.data).items():
        if name in val_stores:
            raise MixtureConfigError(
                f"data.validation_files: the evaluation set {name!r} (from its file name) has "
                f"the name of a component's validation set; rename the file or the component."
            )
        val_stores[name] = _source_store(config, "data.validation_files", source, tokenizer)
    sizes = BatchSizes.parse(config.trainer.batch_schedule, config.trainer.train_batch_size)
    try:
        mixture = make_mixture(plan, datasets, sizes.segments, config.data.shuffle_seed)
    except ValueError as e:
        raise MixtureConfigError(f"data.components: {e}") from None
    return mixture, val_stores


def model_config(config, tokenizer: md.Tokenizer) -> mm.ModelConfig:
    """The preset `model.preset` with every non-None `model.*` key applied."""
    try:
        base = mm.get_preset(config.model.preset)
    except (KeyError, ValueError, mm.ConfigError) as e:
        raise BuildError(f"model.preset={config.model.preset!r}: {e}") from None
    changes: dict[str, Any] = {}
    special = ("preset", "rope_theta", "num_experts", "num_experts_per_token")
    for key, value in config.model.items():
        if key in special or value is None:
            continue
        changes[key] = value
    if config.model.rope_theta is not None:
        changes["rope"] = base.rope.replace(theta=float(config.model.rope_theta))
    moe = {}
    if config.model.num_experts is not None:
        moe["num_experts"] = config.model.num_experts
    if config.model.num_experts_per_token is not None:
        moe["top_k"] = config.model.num_experts_per_token
    if moe:
        if base.moe is None:
            raise BuildError(
                f"model.num_experts / model.num_experts_per_token: preset "
                f"{config.model.preset!r} has no experts; use an MoE preset (e.g. tiny-mixtral)."
            )
        try:
            changes["moe"] = base.moe.replace(**moe)
        except mm.ConfigError as e:
            raise BuildError(f"model.num_experts*: {e}") from None
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


def eval_sets(config, stores: dict[str, md.TokenStore], tokenizer: md.Tokenizer) -> list[EvalSet]:
    """`eval.num_batches` fixed batches of each validation set, with their byte counts."""
    if config.eval.num_batches <= 0:
        return []
    out = []
    n = config.eval.batch_size
    for name, store in stores.items():
        ds = md.PackedDataset(store, seq_len=config.data.seq_len, batch_size=n, seed=0)
        count = min(config.eval.num_batches, max(1, ds.num_sequences // n))
        batches = [ds.sequences(np.arange(i * n, (i + 1) * n)) for i in range(count)]
        out.append(EvalSet(name, batches, sum(utf8_bytes(b, tokenizer) for b in batches)))
    return out


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
    plan = mixture_plan(config)  # checks data.components / weight_stages before any build
    tokenizer = make_tokenizer(config.data.tokenizer)
    mcfg = model_config(config, tokenizer)
    seq_len = config.data.seq_len
    data_metrics = None
    if plan is not None:
        train, val_stores = build_mixture(config, plan, tokenizer)
        data_metrics = fraction_metrics(train)
    else:
        train_store, val_stores = build_stores(config, tokenizer)
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
        eval_sets=eval_sets(config, val_stores, tokenizer),
        describe=f"{config.model.preset} ({mcfg.family}, {params / 1e6:.2f}M params)",
        flops_per_token=mm.flops_per_token(mcfg, seq_len),
        warm_start=make_warm_start(),
        data_metrics=data_metrics,
    )


def abstract_parts(config) -> tuple[mm.ModelConfig, Any]:
    """Model config and abstract model for planning (no data, no arrays): the dry run."""
    tokenizer = make_tokenizer(config.data.tokenizer)
    mcfg = model_config(config, tokenizer)
    model = eqx.filter_eval_shape(lambda k: mm.Transformer.init(mcfg, key=k), jax.random.key(0))
    return mcfg, model
