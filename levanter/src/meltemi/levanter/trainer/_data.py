"""The data of a run: token stores (built once, cached), the train rows and the eval sets."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping

import numpy as np

from meltemi import data as md
from meltemi.levanter.config import ConfigError, MixtureConfigError, MixturePlan, RunSpec
from meltemi.levanter.evaluation import (
    EvalSet,
    config_stores,
    fixed_eval_set,
    open_store,
    source_store,
)


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


def build_stores(spec: RunSpec) -> tuple[md.TokenStore, dict[str, md.TokenStore]]:
    """The train store and one store per validation set (built once, then reopened).

    The validation stores are `meltemi.levanter.evaluation.config_stores`: keyed by their own
    source, as `//levanter:eval` keys them, so evaluating a checkpoint reuses them.
    """
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
    return open_store(root / "train", data.train, tokenizer), config_stores(spec)


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
    datasets = {}
    for c in plan.components:
        store = source_store(spec, f"data.components.{c.name}.source", c.source, tokenizer)
        datasets[c.name] = packed(spec, store, f"data.components.{c.name}")
        if data.packing != "stream":
            print(padding_line(c.name, datasets[c.name]), flush=True)
    val_stores = config_stores(spec)  # the stores `//levanter:eval` reopens
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
