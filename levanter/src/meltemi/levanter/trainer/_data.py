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
    """The training rows of `store`, packed as `data.packing` says.

    A chat store (conversations with a loss mask) is packed whole conversation by
    conversation (first-fit decreasing), with `data.overlong` and `data.loss_average`.
    """
    preference = spec.trainer.objective != "lm"
    if preference and not store.is_preference:
        raise ConfigError(
            f"trainer.objective={spec.trainer.objective!r}: the store at {store.path} holds no "
            f"preference pairs; point {key.replace('data.packing', 'data.train_files')} at "
            f'{{"prompt", "chosen", "rejected"}} rows, or train it with trainer.objective=lm.'
        )
    if store.is_preference and preference:  # pairs whole, chosen and rejected in one row
        options = {"mode": "document", "packing": "ffd", "overlong": "drop"}
        what = "data.train_files (preference pairs)"
    elif store.is_preference:  # the replies of a pair would both be trained on as chat
        raise ConfigError(
            f"data: the store at {store.path} holds preference pairs (chosen/rejected), which "
            "supervised training cannot use; point data.train_files at chat rows with "
            "`messages`, or train the pairs with --config.trainer.objective=dpo."
        )
    elif store.has_loss_mask:
        options = {"mode": "document", "packing": "ffd", "overlong": spec.data.overlong,
                   "loss_average": spec.data.loss_average}  # fmt: skip
        what = f"data.overlong={spec.data.overlong!r}"
    else:
        options = md.packing_options(spec.data.packing)
        what = f"{key} ({spec.data.packing!r})"
    try:
        return md.PackedDataset(
            store,
            seq_len=spec.data.seq_len,
            batch_size=spec.trainer.train_batch_size,
            seed=spec.data.shuffle_seed,
            **options,
        )
    except ValueError as e:  # e.g. a corpus shorter than one row in stream mode
        raise ConfigError(f"{what}: {e}") from None


def chat_line(name: str, dataset: md.PackedDataset) -> str:
    """One line on a chat set's packing: conversations (or preference pairs) longer than a
    row and the padding."""
    counts = dataset.overlong
    what = "preference pairs" if dataset.store.is_preference else "conversations"
    return (
        f"data: {name}: {dataset.store.num_documents:,} {what} in "
        f"{dataset.num_sequences:,} rows per epoch; longer than data.seq_len="
        f"{dataset.seq_len}: {counts['dropped']:,} dropped, {counts['truncated']:,} truncated "
        f"at a turn end (data.overlong={dataset.overlong_policy!r}); "
        f"{dataset.padding_fraction:.1%} of row tokens are padding (loss-masked)"
    )


def packing_line(name: str, dataset: md.PackedDataset) -> str | None:
    """The start-up line of a packed set (None for stream packing of text: nothing to say)."""
    if dataset.store.has_loss_mask:
        return chat_line(name, dataset)
    return padding_line(name, dataset) if dataset.mode != "stream" else None


def overlong_metrics(dataset: md.PackedDataset, prefix: str = "data") -> dict[str, float]:
    """`data/overlong_dropped`, `data/overlong_truncated` of a chat set (per epoch)."""
    if not dataset.store.has_loss_mask:
        return {}
    return {f"{prefix}/overlong_{k}": float(v) for k, v in dataset.overlong.items()}


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
        line = packing_line(c.name, datasets[c.name])
        if line is not None:
            print(line, flush=True)
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
    overlong = {}
    for n in names:
        overlong.update(overlong_metrics(mixture.components[n], f"data/{n}"))

    def metrics(rows: np.ndarray) -> dict[str, float]:
        counts = np.bincount(mixture.components_of(rows), minlength=len(names))
        total = max(int(counts.sum()), 1)
        out = {f"data/{n}/fraction": int(c) / total for n, c in zip(names, counts, strict=True)}
        if padding.any():
            out["data/padding_fraction"] = float(counts @ padding) / total
        return {**out, **overlong}

    return metrics


def padding_metrics(dataset: md.PackedDataset) -> Callable[[np.ndarray], dict[str, float]]:
    """`rows -> {"data/padding_fraction": the share of row tokens that are padding}` (per
    epoch: whole-document packing fixes it when the rows are planned)."""
    fixed = {"data/padding_fraction": float(dataset.padding_fraction)}
    fixed.update(overlong_metrics(dataset))
    return lambda rows: fixed


def eval_sets(spec: RunSpec, stores: Mapping[str, md.TokenStore]) -> list[EvalSet]:
    """`eval.num_batches` fixed batches of each validation set, with their byte counts."""
    if spec.eval.num_batches <= 0:
        return []
    e = spec.eval  # the same sets `//levanter:eval` builds (meltemi.levanter.evaluation)
    return [
        fixed_eval_set(name, store, spec.tokenizer, spec.data.seq_len, e.batch_size, e.num_batches)
        for name, store in stores.items()
    ]
