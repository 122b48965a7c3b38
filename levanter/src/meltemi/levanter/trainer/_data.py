"""The data of a run: token stores (built once, cached), the train rows and the eval sets."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from collections.abc import Callable, Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils

from meltemi import data as md
from meltemi.levanter.config import ConfigError, MixtureConfigError, MixturePlan, RunSpec
from meltemi.levanter.trainer._eval import fixed_eval_set
from meltemi.levanter.trainer._parts import EvalSet
from meltemi.levanter.trainer._summary import display_path


def skipped_line(store: md.TokenStore, cwd: str | None = None) -> str | None:
    """`TokenStore.skipped_summary()` with its paths shown relative to the working directory.

    Example: `data: cache/train skipped 3 inputs (empty_document 3); 120 documents kept;
    details in cache/train/meta.json`. None when the build skipped and altered nothing.
    """
    line = store.skipped_summary()
    if line is None:
        return None
    line = line.replace(str(store.path), display_path(pathlib.Path(store.path), cwd))
    # The example input file too (`e.g. /abs/corpus.jsonl:31: ...`).
    cwd = cwd or os.environ.get("BUILD_WORKING_DIRECTORY") or os.getcwd()
    return line.replace(os.path.join(cwd, ""), "")


def _store(path: pathlib.Path, source: md.Source, tokenizer: md.Tokenizer) -> md.TokenStore:
    built = False
    if jax.process_index() == 0:
        built = not (path / "meta.json").exists()  # else the cached store is reopened
        md.build_store([source], tokenizer, path)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"meltemi store {path}")
    store = md.TokenStore.open(path, tokenizer)
    line = skipped_line(store) if built else None
    if line is not None:  # only when this run built it: a reused store was reported then
        print(line, flush=True)
    return store


def packed(spec: RunSpec, store: md.TokenStore, key: str = "data.packing") -> md.PackedDataset:
    """The training rows of `store`, packed as `data.packing` says."""
    try:
        return md.PackedDataset(
            store,
            seq_len=spec.data.seq_len,
            batch_size=spec.trainer.train_batch_size,
            seed=spec.data.shuffle_seed,
            **md.packing_options(spec.data.packing),
        )
    except ValueError as e:  # e.g. a corpus shorter than one row in stream mode
        raise ConfigError(f"{key} ({spec.data.packing!r}): {e}") from None


def padding_line(name: str, dataset: md.PackedDataset) -> str:
    """One line on the padding `data.packing="whole_documents"` costs (shown at start-up)."""
    return (
        f"data: {name}: whole-document packing, {dataset.num_sequences:,} rows per epoch, "
        f"{dataset.padding_fraction:.1%} of row tokens are padding (loss-masked)"
    )


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
        datasets[c.name] = packed(spec, store, f"data.components.{c.name}")
        if data.packing != "stream":
            print(padding_line(c.name, datasets[c.name]), flush=True)
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
    """`rows -> {"data/<component>/fraction": share of the rows}` (no tokens are read).

    With whole-document packing, also `data/padding_fraction`: the components' padding
    shares (per epoch) weighted by their share of these rows.
    """
    names = list(mixture.names)
    padding = np.array([mixture.components[n].padding_fraction for n in names])

    def metrics(rows: np.ndarray) -> dict[str, float]:
        counts = np.bincount(mixture.components_of(rows), minlength=len(names))
        total = max(int(counts.sum()), 1)
        out = {f"data/{n}/fraction": int(c) / total for n, c in zip(names, counts, strict=True)}
        if padding.any():
            out["data/padding_fraction"] = float(counts @ padding) / total
        return out

    return metrics


def padding_metrics(dataset: md.PackedDataset) -> Callable[[np.ndarray], dict[str, float]]:
    """`rows -> {"data/padding_fraction": the share of row tokens that are padding}` (per
    epoch: whole-document packing fixes it when the rows are planned)."""
    fraction = float(dataset.padding_fraction)
    return lambda rows: {"data/padding_fraction": fraction}


def eval_sets(spec: RunSpec, stores: Mapping[str, md.TokenStore]) -> list[EvalSet]:
    """`eval.num_batches` fixed batches of each validation set, with their byte counts."""
    if spec.eval.num_batches <= 0:
        return []
    e = spec.eval  # the same sets `//levanter:eval` builds (meltemi.levanter.evaluation)
    return [
        fixed_eval_set(name, store, spec.tokenizer, spec.data.seq_len, e.batch_size, e.num_batches)
        for name, store in stores.items()
    ]
