"""The data of a run: token stores (built once, cached), the train rows and the eval sets."""

from __future__ import annotations

import hashlib
import json
import pathlib
from collections.abc import Callable, Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils

from meltemi import data as md
from meltemi.levanter.config import ConfigError, MixtureConfigError, MixturePlan, RunSpec
from meltemi.levanter.trainer._parts import EvalSet


def _store(path: pathlib.Path, source: md.Source, tokenizer: md.Tokenizer) -> md.TokenStore:
    if jax.process_index() == 0:
        md.build_store([source], tokenizer, path)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"meltemi store {path}")
    return md.TokenStore.open(path, tokenizer)


def source_store(
    spec: RunSpec, key: str, source: md.Source, tokenizer: md.Tokenizer
) -> md.TokenStore:
    """A store of one source, cached by the tokenizer and the source's fingerprint."""
    try:
        digest = hashlib.sha256(source.fingerprint().encode()).hexdigest()[:12]
    except md.SourceError as e:
        raise MixtureConfigError(f"{key}: {e}") from None
    path = spec.data.cache_dir / f"source-{source.name}-{tokenizer.fingerprint()[:12]}-{digest}"
    return _store(path, source, tokenizer)


def build_stores(spec: RunSpec) -> tuple[md.TokenStore, dict[str, md.TokenStore]]:
    """The train store and one store per validation set (built once, then reopened)."""
    data, tokenizer = spec.data, spec.tokenizer
    validation = dict(data.validation)
    try:
        train_print = data.train.fingerprint()
    except md.SourceError as e:
        raise ConfigError(f"data.train_files: {e}") from None
    prints = {}
    for name, source in validation.items():
        try:
            prints[name] = source.fingerprint()
        except md.SourceError as e:
            raise ConfigError(f"data.validation_files ({name!r}): {e}") from None
    key = hashlib.sha256(json.dumps([train_print, prints]).encode()).hexdigest()[:12]
    root = data.cache_dir / f"{data.source}-{tokenizer.fingerprint()[:12]}-{key}"
    stores = {name: _store(root / f"validation-{name}", src, tokenizer)
              for name, src in validation.items()}  # fmt: skip
    return _store(root / "train", data.train, tokenizer), stores


def make_mixture(
    plan: MixturePlan,
    datasets: Mapping[str, md.PackedDataset],
    batch_segments: tuple[tuple[int, int], ...],
    seed: int,
) -> md.MixtureDataset:
    """The mixture over `datasets` (one per component) for a batch-size schedule."""
    return md.MixtureDataset(
        {n: datasets[n] for n in plan.names},
        [(step, dict(w)) for step, w in plan.stages],
        batch_size=batch_segments,
        seed=seed,
    )


def build_mixture(spec: RunSpec) -> tuple[md.MixtureDataset, dict[str, md.TokenStore]]:
    """The train mixture (rows by global index, any batch-size schedule) and eval stores.

    Each component with a `validation` source is an evaluation set tagged by its name, and
    so is each `data.validation_files` entry (by its file name).
    """
    data, tokenizer, plan = spec.data, spec.tokenizer, spec.data.mixture
    datasets, val_stores = {}, {}
    for c in plan.components:
        store = source_store(spec, f"data.components.{c.name}.source", c.source, tokenizer)
        datasets[c.name] = md.PackedDataset(
            store,
            seq_len=data.seq_len,
            batch_size=spec.trainer.train_batch_size,
            seed=data.shuffle_seed,
        )
        if c.validation is not None:
            key = f"data.components.{c.name}.validation"
            val_stores[c.name] = source_store(spec, key, c.validation, tokenizer)
    for name, source in data.validation:
        val_stores[name] = source_store(spec, "data.validation_files", source, tokenizer)
    segments = spec.trainer.batch_sizes.segments
    try:
        mixture = make_mixture(plan, datasets, segments, data.shuffle_seed)
    except ValueError as e:
        raise MixtureConfigError(f"data.components: {e}") from None
    return mixture, val_stores


def fraction_metrics(mixture: md.MixtureDataset) -> Callable[[np.ndarray], dict[str, float]]:
    """`rows -> {"data/<component>/fraction": share of the rows}` (no tokens are read)."""
    names = list(mixture.names)

    def metrics(rows: np.ndarray) -> dict[str, float]:
        counts = np.bincount(mixture.components_of(rows), minlength=len(names))
        total = max(int(counts.sum()), 1)
        return {f"data/{n}/fraction": int(c) / total for n, c in zip(names, counts, strict=True)}

    return metrics


def utf8_bytes(batch: Mapping[str, np.ndarray], tokenizer: md.Tokenizer) -> int:
    """UTF-8 bytes the loss tokens (the masked-in targets) of a host batch decode to."""
    total = 0
    for targets, mask in zip(batch["targets"], batch["loss_mask"], strict=True):
        total += len(tokenizer.decode(targets[mask > 0]).encode("utf-8"))
    return total


def eval_sets(spec: RunSpec, stores: Mapping[str, md.TokenStore]) -> list[EvalSet]:
    """`eval.num_batches` fixed batches of each validation set, with their byte counts."""
    if spec.eval.num_batches <= 0:
        return []
    out = []
    n = spec.eval.batch_size
    for name, store in stores.items():
        ds = md.PackedDataset(store, seq_len=spec.data.seq_len, batch_size=n, seed=0)
        count = min(spec.eval.num_batches, max(1, ds.num_sequences // n))
        batches = [ds.sequences(np.arange(i * n, (i + 1) * n)) for i in range(count)]
        out.append(EvalSet(name, batches, sum(utf8_bytes(b, spec.tokenizer) for b in batches)))
    return out
