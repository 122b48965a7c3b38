"""The reference model of DPO/IPO: a frozen copy in the state, or log-probs computed once.

`trainer.reference="live"` keeps the reference's arrays in `TrainState.reference` (sharded
like the parameters, no optimizer state, gradients stopped in the step); with LoRA there is no
copy: the reference is the model without its adapters (`runtime.without_adapters`).
`trainer.reference="precomputed"` runs the reference once over every training row before the
first step and stores its per-token log-probs under `data.cache_dir/reference/<key>/`, keyed
by the rows' tokens and a fingerprint of the reference's arrays, so a changed store, packing,
schedule or reference computes them anew; `PrecomputedReference` adds them to each batch as
`reference_logps`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import pathlib
from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from meltemi.levanter.config import ConfigError, RunSpec
from meltemi.levanter.mesh import data_parallel_size
from meltemi.levanter.runtime import (
    cast_floating,
    compute_context,
    global_batch,
    pad_rows,
    token_logps,
    without_adapters,
)

logger = logging.getLogger(__name__)

FIELD = "reference_logps"


def params_fingerprint(params: Any) -> str:
    """A short hash of a model's arrays (their shapes, sums and sums of squares, on device)."""
    leaves = jax.tree.leaves(eqx.filter(params, eqx.is_inexact_array))
    sums = jax.jit(lambda xs: [jnp.stack([jnp.sum(x), jnp.sum(x * x)]) for x in xs])(
        [x.astype(jnp.float32) for x in leaves]
    )
    values = [(tuple(x.shape), np.asarray(s).tolist()) for x, s in zip(leaves, sums, strict=True)]
    return hashlib.sha256(json.dumps(values).encode()).hexdigest()[:16]


def rows_fingerprint(tokens: np.ndarray) -> np.ndarray:
    """One uint64 hash per row of a token array (detects a row that changed)."""
    tokens = np.ascontiguousarray(tokens, dtype=np.int64)
    return np.array(
        [int.from_bytes(hashlib.blake2b(r.tobytes(), digest_size=8).digest(), "little")
         for r in tokens], dtype=np.uint64,
    )  # fmt: skip


class PrecomputedReference:
    """A batch source that adds the reference's precomputed `reference_logps` to each row.

    Until `attach` is called the field is NaN (only the trainer's shape check reads a row
    then), so a step can never train on a missing reference silently. `computed_rows` counts
    the rows whose log-probs this process computed (0 when they were reopened from the cache,
    as on a resume).

    Args:
        data: the training rows (a `BatchSource`).
        seq_len: tokens per row.
    """

    def __init__(self, data: Any, seq_len: int):
        self.data, self.seq_len = data, seq_len
        self.values: np.ndarray | None = None
        self.hashes: np.ndarray | None = None
        self.where: pathlib.Path | None = None
        self.computed_rows = 0

    def attach(self, values: np.ndarray, hashes: np.ndarray, where: pathlib.Path) -> None:
        """The reference's log-probs of rows `0..len(values)-1` and their token hashes."""
        self.values, self.hashes, self.where = values, hashes, where

    def sequences(self, indices: np.ndarray) -> Mapping[str, np.ndarray]:
        rows = dict(self.data.sequences(indices))
        indices = np.asarray(indices)
        if self.values is None:
            rows[FIELD] = np.full((len(indices), self.seq_len), np.nan, np.float32)
            return rows
        if len(indices) and int(indices.max()) >= len(self.values):
            raise RuntimeError(
                f"row {int(indices.max())} has no precomputed reference log-probs ({self.where}"
                f" holds {len(self.values)} rows)"
            )
        if not np.array_equal(rows_fingerprint(rows["tokens"]), self.hashes[indices]):
            raise ConfigError(
                f"trainer.reference='precomputed': the rows read now differ from the rows the "
                f"reference log-probs in {self.where} were computed on (the data store changed "
                f"under the same key); delete that directory to compute them again."
            )
        rows[FIELD] = np.asarray(self.values[indices], np.float32)
        return rows


def _logps_fn(plan: Any) -> Any:
    static, dtype = plan.static, plan.compute_dtype

    def fn(params, batch):
        model = without_adapters(eqx.combine(cast_floating(params, dtype), static))
        return token_logps(model, batch)

    with compute_context(plan.mesh):
        return jax.jit(fn)


def _run(fn: Any, plan: Any, params: Any, rows: Mapping[str, np.ndarray]) -> np.ndarray:
    """`fn` over host rows (every process passes the same global rows), as numpy."""
    mesh, per, index = plan.mesh, jax.process_count(), jax.process_index()
    n = len(next(iter(rows.values())))
    batch = pad_rows(rows, math.lcm(data_parallel_size(mesh), per))
    share = len(next(iter(batch.values()))) // per
    local = {k: v[index * share : (index + 1) * share] for k, v in batch.items() if k != FIELD}
    with compute_context(mesh):
        out = fn(params, global_batch(local, mesh))
    if per > 1:
        out = multihost_utils.process_allgather(out, tiled=True)
    return np.asarray(jax.device_get(out), np.float32)[:n]


def precompute(
    spec: RunSpec, plan: Any, source: PrecomputedReference, params: Any, eval_sets: list
) -> pathlib.Path:
    """Computes (or reopens) the reference's log-probs of every training row and attaches them
    to `source`; the eval sets' batches get theirs too (not cached: they are small).

    Args:
        spec: the run's config.
        plan: the run's plan (mesh, static model half, compute dtype).
        source: the training rows to attach the log-probs to.
        params: the reference's arrays.
        eval_sets: the run's `EvalSet`s (their batches gain `reference_logps`).

    Returns:
        The directory holding `logps.npy`, `hashes.npy` and `key.json`.
    """
    sizes = plan.batch_sizes
    total = sizes.rows_before(spec.trainer.num_train_steps)
    chunk = sizes.size_at(0)
    hashes = np.concatenate(
        [rows_fingerprint(source.data.sequences(np.arange(s, min(s + chunk, total)))["tokens"])
         for s in range(0, total, chunk)]
    )  # fmt: skip
    key = {
        "rows": total,
        "seq_len": spec.data.seq_len,
        "tokens": hashlib.sha256(hashes.tobytes()).hexdigest()[:16],
        "reference": params_fingerprint(params),
        "compute_dtype": spec.trainer.compute_dtype,
    }
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    where = spec.data.cache_dir / "reference" / name
    fn = _logps_fn(plan)
    if not (where / "key.json").exists():
        values = np.zeros((total, spec.data.seq_len), np.float32)
        for s in range(0, total, chunk):
            rows = source.data.sequences(np.arange(s, min(s + chunk, total)))
            values[s : s + len(rows["tokens"])] = _run(fn, plan, params, rows)
        if jax.process_index() == 0:
            tmp = where.with_name(where.name + ".tmp")
            tmp.mkdir(parents=True, exist_ok=True)
            np.save(tmp / "logps.npy", values)
            np.save(tmp / "hashes.npy", hashes)
            (tmp / "key.json").write_text(json.dumps(key, indent=1) + "\n")
            tmp.replace(where)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"meltemi reference {where}")
        source.computed_rows += total
        logger.info("reference log-probs of %d rows written to %s", total, where)
    else:
        logger.info("reference log-probs of %d rows reopened from %s", total, where)
    stored = json.loads((where / "key.json").read_text())
    if stored != key:  # a hash collision of the name, or a hand-edited directory
        raise ConfigError(f"trainer.reference: {where}/key.json is {stored}, expected {key}")
    source.attach(np.load(where / "logps.npy", mmap_mode="r"), np.load(where / "hashes.npy"),
                  where)  # fmt: skip
    for eval_set in eval_sets:
        eval_set.batches = [{**b, FIELD: _run(fn, plan, params, b)} for b in eval_set.batches]
    return where


def load_reference(spec: RunSpec, params: Any, warm_start: Any) -> Any:
    """The reference's arrays: `trainer.reference_from`'s checkpoint loaded into `params`'
    structure, or `params` themselves (the policy's start) when it is empty.

    Raises:
        ConfigError: the checkpoint lacks arrays the model has.
    """
    path = spec.trainer.reference_from
    if not path:
        return params
    loaded, report = warm_start(params, path)
    missing = [line for line in report if line.startswith("initialised")]
    if missing:
        raise ConfigError(
            f"trainer.reference_from={path!r}: the checkpoint lacks arrays of this model "
            f"({missing[0]}, {len(missing)} in all); give a checkpoint of the same model."
        )
    return loaded
