"""The shard tasks of each stage: do the stage's work on one shard, write this stage's file
(temporary name, then rename), return the counts.

The normalised documents are written once, by `normalize`, to a Parquet file with the columns
`id`, `text`, `meta` (the input's other fields, a JSON string) and `digest` (xxh3-64 of the
normalised text). The dedup stages do not copy it: each writes the rows (of that file) it
drops, a `.npy`; `minhash` and `quality` read the normalised file and skip the rows dropped
before them (`ShardTask.drop`). `quality` writes the survivors to `documents/*.parquet`
(`id`, `text`, `meta`).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time
import uuid

import numpy as np

from meltemi.data._sources import SourceError, file_stat
from meltemi.data.pipeline._minhash import minhash_signatures
from meltemi.data.pipeline._normalize import digests, normalize_texts, note, read_records
from meltemi.data.pipeline._quality import QualityConfig, quality_reasons

__all__ = ["ShardTask", "filter_shard", "minhash_shard", "normalize_shard", "quality_shard"]


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """One shard of one stage.

    Attributes:
        shard: the shard's id (fixed by the plan).
        inputs: input files (normalize) or the shard's normalised file (minhash, quality).
        output: the file this task writes.
        options: the stage's settings (plain values).
        drop: rows of the normalised file to drop, sorted: this stage's (exact and fuzzy
            dedup, which record them), or those dropped before it (minhash, quality, which
            skip them).
        reason: what the rows a dedup stage drops are counted under.
        quality: the quality rules (quality stage).
    """

    shard: int
    inputs: tuple[str, ...]
    output: str
    options: dict = dataclasses.field(default_factory=dict)
    drop: np.ndarray | None = None
    reason: str = ""
    quality: QualityConfig | None = None


def _pq():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ModuleNotFoundError as e:  # pragma: no cover - exercised by the wheel test
        raise SourceError("the pipeline needs pyarrow: pip install 'meltemi-data[parquet]'") from e
    return pa, pq


def _write_atomic(output: str, write) -> None:
    os.makedirs(os.path.dirname(output), exist_ok=True)
    tmp = f"{output}.tmp-{uuid.uuid4().hex[:8]}"
    write(tmp)
    os.replace(tmp, output)


# Between stages, files are written once and read once: lz4 costs 12 ms a 2 MB shard to write
# and read against zstd's 28 ms (1.4 vs 0.9 MB on disk). The kept documents are zstd.
_INTERMEDIATE = "lz4"
_FINAL = "zstd"


def write_table(output: str, columns: dict, with_digest: bool = True) -> None:
    pa, pq = _pq()
    arrays = {
        "id": pa.array(columns["id"], pa.string()),
        "text": pa.array(columns["text"], pa.string()),
        "meta": pa.array(columns["meta"], pa.string()),
    }
    if with_digest:
        arrays["digest"] = pa.array(np.asarray(columns["digest"], np.uint64), pa.uint64())
    table = pa.table(arrays)
    _write_atomic(output, lambda tmp: pq.write_table(table, tmp, compression=_INTERMEDIATE))


def write_arrow(output: str, table, compression: str = _INTERMEDIATE) -> None:
    _, pq = _pq()
    _write_atomic(output, lambda tmp: pq.write_table(table, tmp, compression=compression))


def read_arrow(path: str, columns: list[str] | None = None):
    _, pq = _pq()
    return pq.ParquetFile(path).read(columns=columns)  # (read_table imports pyarrow.dataset)


def read_table(path: str, columns: list[str] | None = None) -> dict:
    _, pq = _pq()
    table = pq.ParquetFile(path).read(columns=columns)  # (read_table imports pyarrow.dataset)
    out = {name: table.column(name).to_pylist() for name in table.column_names if name != "digest"}
    if "digest" in table.column_names:
        out["digest"] = table.column("digest").to_numpy().astype(np.uint64)
    return out


def _entry(n_in: int, kept: int, dropped, start: float, **extra) -> dict:
    return {
        "in": n_in,
        "kept": kept,
        "dropped": dict(dropped),
        "seconds": round(time.perf_counter() - start, 4),
        **extra,
    }


def normalize_shard(task: ShardTask) -> dict:
    """Reads the shard's input files, normalises every record, writes the kept ones.

    Records are read one by one (each bad one is counted), then normalised and hashed as
    one batch (`normalize_texts`, `digests`)."""
    start = time.perf_counter()
    dropped: collections.Counter = collections.Counter()
    altered: collections.Counter = collections.Counter()
    damaged: collections.Counter = collections.Counter()  # files: truncated_file
    examples: dict[str, list[str]] = {}
    ids: list[str] = []
    raw: list = []
    metas: list[str] = []
    seen = 0
    input_bytes = 0
    for path in task.inputs:
        for record in read_records(path, task.options["text_key"], damaged, examples):
            seen += 1
            if record.text is None:
                dropped[record.reason] += 1
                note(examples, record.reason, record.id)
                continue
            ids.append(record.id)
            raw.append(record.text)
            metas.append(record.meta)
        try:
            input_bytes += file_stat(path)[0]
        except OSError:
            pass
    texts, changes = normalize_texts(raw, task.options["max_run"])
    del raw
    max_chars = task.options["max_document_chars"]
    for i, text in enumerate(texts):
        if len(text) > max_chars:
            changes.setdefault(i, collections.Counter())["truncated_long"] += 1
            texts[i] = text[:max_chars]
    for i, counts in sorted(changes.items()):
        for reason in counts:
            note(examples, reason, ids[i])
        altered.update(counts)
    keep = [i for i, text in enumerate(texts) if text]
    for i in range(len(texts)):
        if not texts[i]:
            dropped["empty"] += 1
            note(examples, "empty", ids[i])
    if len(keep) < len(texts):
        ids, texts, metas = ([x[i] for i in keep] for x in (ids, texts, metas))
    cols = {"id": ids, "text": texts, "meta": metas, "digest": digests(texts)}
    write_table(task.output, cols)
    return _entry(
        seen,
        len(ids),
        dropped,
        start,
        altered=dict(altered),
        truncated_files=damaged["truncated_file"],
        examples=examples,
        input_bytes=input_bytes,
    )


def filter_shard(task: ShardTask) -> dict:
    """Records the rows `task.drop` (exact or fuzzy duplicates, rows of the normalised file)
    as this stage's `.npy`; `task.options["in"]` rows reached the stage."""
    start = time.perf_counter()
    drop = np.asarray(task.drop if task.drop is not None else [], np.int64)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.save(fh, drop)

    _write_atomic(task.output, write)
    n = task.options["in"]
    dropped = {task.reason: len(drop)} if len(drop) else {}
    return _entry(n, n - len(drop), dropped, start)


def _surviving(table, drop: np.ndarray | None):
    """`table` without the rows `drop` (sorted rows dropped by earlier stages)."""
    if drop is None or not len(drop):
        return table
    keep = np.ones(table.num_rows, bool)
    keep[drop] = False
    return table.filter(keep)


def minhash_shard(task: ShardTask) -> dict:
    """Writes the MinHash signatures of the shard's surviving documents (`.npz`: `sig`,
    `has`, and `rows`: each signature's row in the normalised file)."""
    start = time.perf_counter()
    table = read_arrow(task.inputs[0], ["text"])
    rows = np.arange(table.num_rows, dtype=np.int64)
    if task.drop is not None and len(task.drop):
        rows = np.delete(rows, task.drop)
        table = table.take(rows)
    texts = table.column("text").to_pylist()
    sig, has = minhash_signatures(
        texts,
        num_perm=task.options["num_perm"],
        shingle_size=task.options["shingle_size"],
        seed=task.options["seed"],
    )

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, sig=sig, has=has, rows=rows)

    _write_atomic(task.output, write)
    no_shingles = int((~has).sum())
    return _entry(len(texts), len(texts), {}, start, altered={"no_shingles": no_shingles})


def quality_shard(task: ShardTask) -> dict:
    """Applies the quality rules (vectorised over the shard); writes the survivors to
    `documents/`."""
    start = time.perf_counter()
    table = _surviving(read_arrow(task.inputs[0], ["id", "text", "meta"]), task.drop)
    reasons = quality_reasons(table.column("text"), task.quality)
    keep = np.asarray([r is None for r in reasons], bool)
    dropped = collections.Counter(r for r in reasons if r is not None)
    examples: dict[str, list[str]] = {}
    if len(dropped):
        ids = table.column("id").to_pylist()
        for i in np.flatnonzero(~keep).tolist():
            note(examples, reasons[i], ids[i])
    write_arrow(task.output, table.filter(keep) if len(dropped) else table, _FINAL)
    return _entry(table.num_rows, int(keep.sum()), dropped, start, examples=examples)
