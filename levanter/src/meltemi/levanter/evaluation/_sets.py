"""Evaluation sets: fixed batches of a token store with their byte counts, and the sets of
`//levanter:eval` (the config's validation sets and `--eval_files`)."""

from __future__ import annotations

import dataclasses
import pathlib
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from meltemi import data as md
from meltemi.levanter.config import RunSpec, default_cache_dir
from meltemi.levanter.evaluation._bytes import batch_bytes
from meltemi.levanter.evaluation._errors import EvalError
from meltemi.levanter.evaluation._stores import config_stores, file_store

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclasses.dataclass
class EvalSet:
    """A validation set: fixed batches, and how many UTF-8 bytes their loss tokens encode.

    Attributes:
        name: the tag in metric names (`eval/<name>/loss`, `eval/<name>/bpb`).
        batches: host batches (global rows), evaluated in order.
        num_bytes: UTF-8 bytes of the target tokens, for bits per byte.
    """

    name: str
    batches: list[Mapping[str, np.ndarray]]
    num_bytes: int


def fixed_eval_set(
    name: str, store: Any, tokenizer: Any, seq_len: int, batch_size: int, num_batches: int
) -> EvalSet:
    """The first `num_batches` batches of `batch_size` rows of a token store, unshuffled
    (fewer when the set is shorter; at least one), with their byte count. A chat store's rows
    are whole conversations (longer ones dropped) with the loss on its trained tokens only.

    Args:
        name: the set's name in metric names.
        store: a `meltemi.data.TokenStore`.
        tokenizer: the store's tokenizer (decodes the loss tokens for the byte count).
        seq_len: tokens per row.
        batch_size: rows per batch.
        num_batches: the most batches to take.
    """
    # A chat set is packed whole conversations, its loss only on the trained tokens (the
    # assistant's): eval/<set>/loss is the mean over those, bpb counts their bytes.
    chat = {"mode": "document", "packing": "ffd"} if store.has_loss_mask else {}
    ds = md.PackedDataset(store, seq_len=seq_len, batch_size=batch_size, seed=0, **chat)
    count = min(num_batches, max(1, ds.num_sequences // batch_size))
    batches = [ds.sequences(np.arange(i * batch_size, (i + 1) * batch_size)) for i in range(count)]
    return EvalSet(name, batches, sum(batch_bytes(b, tokenizer) for b in batches))


@dataclasses.dataclass(frozen=True)
class SetShape:
    """How each set is cut: `num_batches` batches of `batch_size` rows of `seq_len` tokens."""

    seq_len: int
    batch_size: int
    num_batches: int


def parse_eval_files(text: str) -> dict[str, str]:
    """`--eval_files=name=PATH,name2=PATH2` as `{name: path}` (paths may be globs).

    Raises:
        EvalError: an entry without `=`, an empty or repeated name, or a path matching no file.

    Example:
        >>> parse_eval_files("")
        {}
    """
    out: dict[str, str] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, sep, path = entry.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not name or not path:
            raise EvalError(
                f"--eval_files: {entry!r} is not NAME=PATH; e.g. "
                f"--eval_files=wiki=data/wiki_val.jsonl,code=data/code_val.jsonl"
            )
        if not _NAME.match(name):
            raise EvalError(
                f"--eval_files: the set name {name!r} (in {entry!r}) may use only letters, "
                f"digits, '_', '-' and '.'; it names the set in eval.json and the metrics."
            )
        if name in out:
            raise EvalError(f"--eval_files: the set name {name!r} is given twice; rename one.")
        found = list(pathlib.Path().glob(path)) if any(c in path for c in "*?[") else []
        if not found and not pathlib.Path(path).expanduser().exists():
            raise EvalError(f"--eval_files: {name}={path!r}: no such file; check the path.")
        out[name] = str(pathlib.Path(path).expanduser())
    return out


def set_shape(spec: RunSpec | None, max_seq_len: int) -> SetShape:
    """The config's `data.seq_len` and `eval.*`, or (no config) 1024-token rows (at most the
    model's `max_seq_len`), 8 per batch, 4 batches."""
    if spec is not None:
        return SetShape(spec.data.seq_len, spec.eval.batch_size, spec.eval.num_batches)
    return SetShape(min(1024, max_seq_len), 8, 4)


def eval_sets(
    spec: RunSpec | None,
    tokenizer: md.Tokenizer,
    files: dict[str, str],
    shape: SetShape,
    *,
    use_config_sets: bool = True,
) -> list[EvalSet]:
    """The config's evaluation sets (if any) then one set per `--eval_files` entry.

    Args:
        spec: the run's config (its validation sets and cache directory), or None.
        tokenizer: the model's tokenizer.
        files: `{name: path}` from `parse_eval_files`.
        shape: rows, batch size and batch count of each set.
        use_config_sets: include the config's validation sets.
    """
    stores = config_stores(spec) if spec is not None and use_config_sets else {}
    cache = spec.data.cache_dir if spec is not None else default_cache_dir("")
    for name, path in files.items():
        if name in stores:
            raise EvalError(
                f"--eval_files: the set name {name!r} is already an evaluation set of the "
                f"config; rename it (e.g. {name}_extra=...)."
            )
        stores[name] = file_store(name, path, tokenizer, cache)
    if not stores:
        raise EvalError(
            "nothing to evaluate: the config has no evaluation sets; pass "
            "--eval_files=NAME=PATH (text, JSON lines or Parquet)."
        )
    if shape.num_batches <= 0:
        raise EvalError(
            f"eval.num_batches={shape.num_batches}: nothing would be evaluated; pass "
            f"--num_batches=4 (or --config.eval.num_batches)."
        )
    return [
        fixed_eval_set(n, s, tokenizer, shape.seq_len, shape.batch_size, shape.num_batches)
        for n, s in stores.items()
    ]
