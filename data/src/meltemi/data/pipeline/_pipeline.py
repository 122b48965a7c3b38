"""The pipeline: plan, ledger, the stages of `stage_table` in order, report.

    DIR/pipeline.json        the plan: options that change the output, the input files (size
                             and content digest each), shard -> files
    DIR/ledger.jsonl         one line per finished (stage, shard): counts, or `quarantined`
    DIR/stages/normalize/NNNNN.parquet  each shard's normalised documents (written once)
    DIR/stages/<stage>/NNNNN.npy       the rows of it that exact_dedup / fuzzy_dedup drop
    DIR/stages/minhash/NNNNN.npz       the signatures of the rows that reach minhash
    DIR/documents/NNNNN.parquet        the documents that survive every stage
    DIR/store/               the token store (with --tokenize)
    DIR/report.json          written last: the pipeline has finished iff it exists

A task writes its file under a temporary name and renames it; only then does the driver
append its ledger line (fsynced once a stage's tasks have all ended: a kill loses nothing
written, a power cut at most the lines of the stage that was running). A rerun skips every
(stage, shard) the ledger lists and whose file exists, so a killed pipeline loses at most the
tasks that were running, and a rerun of a finished one (report.json present, same plan) does
nothing. The global steps (which rows are exact and near duplicates) are pure functions of
the previous stages' files, so a resumed run recomputes the same answer.

What each stage is (name, kind, what it reads, what it writes, how it makes its tasks,
whether they run inline) is one `Stage` entry of `stage_table`; the driver (`_Run`) knows
nothing else of any stage, so adding a stage is adding an entry.
"""

from __future__ import annotations

import collections
import collections.abc
import dataclasses
import functools
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from typing import Literal

import numpy as np

from meltemi import fray
from meltemi.data._build import build_store, merge_examples, plan_shards
from meltemi.data._ledger import StageLedger, exclusive_lock, write_json
from meltemi.data._sources import Files, ParquetFiles, file_digest, file_stat
from meltemi.data._tokenizer import load_tokenizer
from meltemi.data.pipeline._minhash import lsh_params, near_duplicate_drops
from meltemi.data.pipeline._quality import QualityConfig
from meltemi.data.pipeline._runner import TaskPool, run_inline
from meltemi.data.pipeline._stages import (
    ShardTask,
    filter_shard,
    minhash_shard,
    normalize_shard,
    quality_shard,
    read_table,
)

__all__ = [
    "INLINE_BELOW_BYTES",
    "PipelineConfig",
    "PipelineError",
    "Stage",
    "format_report",
    "run_pipeline",
    "stage_table",
]

FORMAT = "meltemi-pipeline/1"

# What a stage actor imports as it starts (in parallel with the others), not in a first task.
_WARM = ("pyarrow.parquet", "pyarrow.compute", "meltemi.data.pipeline._stages")
# Below this much input, actors cost more than they save: each takes ~0.5 s to start (in
# parallel) and the whole pipeline runs at ~5 MB/s in one process on this 2-core machine, so
# two workers save at most ~0.1 s per MB. data/README.md has the measurements.
INLINE_BELOW_BYTES = 8_000_000


class PipelineError(ValueError):
    """A pipeline option is invalid, or DIR holds a different pipeline's outputs."""


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """What the pipeline does. Options that change the output are part of the plan.

    Attributes:
        inputs: files, directories, globs or URLs (`*.jsonl[.gz|.zst]`, `*.parquet`, text).
        output: the output directory (local).
        text_key: the text field of JSON lines / column of Parquet files.
        max_run: runs of one character (or of whitespace) are cut to this length.
        max_document_chars: longer documents are cut to this many characters.
        exact_dedup: drop documents whose normalised text equals an earlier one's.
        fuzzy_dedup: drop near-duplicates (MinHash + LSH).
        near_duplicate_threshold: estimated Jaccard similarity of word shingles above which
            two documents are near-duplicates.
        shingle_size: words per shingle.
        num_perm: MinHash permutations.
        seed: fixes the MinHash permutations.
        quality: the quality rules' thresholds.
        tokenize: build a token store of the surviving documents under DIR/store.
        tokenizer: `byte` or a `tokenizer.json` path (with `tokenize`).
        shard_bytes: input bytes per shard (whole files are never split).
        min_shards: smaller inputs are cut into about this many shards.
        task_timeout_s: deadline of one attempt of one shard task.
        retries: attempts after the first before a shard is quarantined.
    """

    inputs: tuple[str, ...]
    output: str
    text_key: str = "text"
    max_run: int = 1000
    max_document_chars: int = 1 << 24
    exact_dedup: bool = True
    fuzzy_dedup: bool = True
    near_duplicate_threshold: float = 0.8
    shingle_size: int = 5
    num_perm: int = 128
    seed: int = 1
    quality: QualityConfig = QualityConfig()
    tokenize: bool = False
    tokenizer: str = "byte"
    shard_bytes: int = 64 << 20
    min_shards: int = 8
    task_timeout_s: float = 3600.0
    retries: int = 2

    def __post_init__(self):
        if isinstance(self.inputs, str):
            object.__setattr__(self, "inputs", (self.inputs,))
        object.__setattr__(self, "inputs", tuple(os.fspath(p) for p in self.inputs))
        object.__setattr__(self, "output", os.fspath(self.output))
        if not self.inputs:
            raise PipelineError("inputs=(): pass at least one path, e.g. --input=data/*.jsonl.gz")
        t = self.near_duplicate_threshold
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t <= 1:
            raise PipelineError(
                f"near_duplicate_threshold={t!r}: need a number in (0, 1], e.g. 0.8"
            )
        for name, low in (
            ("max_run", 1),
            ("max_document_chars", 1),
            ("shingle_size", 1),
            ("num_perm", 2),
            ("shard_bytes", 1),
            ("min_shards", 1),
            ("retries", 0),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise PipelineError(f"{name}={value!r}: need an int >= {low}")
        s = self.task_timeout_s
        if isinstance(s, bool) or not isinstance(s, int | float) or not s > 0 or math.isnan(s):
            raise PipelineError(
                f"task_timeout_s={s!r}: need a number of seconds > 0, e.g. --task_timeout_s=600"
            )
        if not isinstance(self.quality, QualityConfig):
            raise PipelineError(f"quality={self.quality!r}: pass a QualityConfig(...)")
        if "://" in self.output:
            raise PipelineError(
                f"output={self.output!r}: the pipeline writes locally; copy DIR afterwards"
            )

    def plan_options(self) -> dict:
        """The options that change the output (part of the plan)."""
        skip = {"inputs", "output", "task_timeout_s", "retries"}
        out = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip
        }
        out["quality"] = dataclasses.asdict(self.quality)
        if not self.tokenize:
            out.pop("tokenizer")
        return out

    def stages(self) -> list[str]:
        """The names of the stages this config runs, in order (`stage_table`)."""
        return [s.name for s in stage_table(self)]


class _Stopped(Exception):
    """`stop_after_tasks` ran out (tests and incremental runs)."""


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of the pipeline: all the driver knows about it, in one entry.

    The driver runs the entries of `stage_table` in order, with no other knowledge of any
    stage: it skips what the ledger lists, runs the rest, records each outcome, and builds
    the stage's report row. A stage's shards are the ones the stage before it kept.

    Attributes:
        name: its name in the ledger, the report and `DIR/stages/<name>/`.
        kind: `"map"`: each shard's task reads a file and writes one of its own;
            `"dedup"`: a global step over every shard picks the rows to drop, each shard's
            task records its rows (a `.npy` of rows of the normalised file), and every
            later stage skips them (`ShardTask.drop`). The step drops only rows that
            reached it (`_Run.dropped_before`), so each stage's `in` is the last one's `kept`.
        reads: the stage whose files its tasks (`"map"`) or its global step (`"dedup"`)
            read; None: the input files.
        writes: the file a shard's task writes, relative to DIR (`{shard:05d}` filled in).
        fn: the shard task, `ShardTask -> counts` (its ledger line).
        tasks: `tasks(run, stage) -> [ShardTask]`, every shard that reaches the stage.
        inline: run the tasks in the driver (they only write a list of rows), not on actors.
        when: whether this config runs the stage.
        sums: ledger counts beyond in/kept/dropped that the report row sums over shards.
    """

    name: str
    kind: Literal["map", "dedup"]
    reads: str | None
    writes: str
    fn: Callable[[ShardTask], dict]
    tasks: Callable[[_Run, Stage], list[ShardTask]]
    inline: bool = False
    when: bool = True
    sums: tuple[str, ...] = ()


# Every list of dropped rows is of rows of this stage's file (the one copy of the documents).
_ROWS_OF = "normalize"


def stage_table(config: PipelineConfig) -> tuple[Stage, ...]:
    """The stages `config` runs, in order; adding a stage is adding an entry here.

    >>> [s.name for s in stage_table(PipelineConfig(["in.jsonl"], "out", fuzzy_dedup=False))]
    ['normalize', 'exact_dedup', 'quality']
    """
    cfg = config
    table = (
        Stage(
            "normalize", "map", reads=None, writes="stages/normalize/{shard:05d}.parquet",
            fn=normalize_shard,
            tasks=functools.partial(_input_tasks, options={
                "text_key": cfg.text_key,
                "max_run": cfg.max_run,
                "max_document_chars": cfg.max_document_chars,
            }),
            sums=("truncated_files", "input_bytes"),
        ),
        Stage(
            "exact_dedup", "dedup", reads="normalize", writes="stages/exact_dedup/{shard:05d}.npy",
            fn=filter_shard,
            tasks=functools.partial(_dedup_tasks, drops=_exact_drops, reason="exact_duplicate"),
            inline=True,
            when=cfg.exact_dedup,
        ),
        Stage(
            "minhash", "map", reads="normalize", writes="stages/minhash/{shard:05d}.npz",
            fn=minhash_shard,
            tasks=functools.partial(_survivor_tasks, options={
                "num_perm": cfg.num_perm, "shingle_size": cfg.shingle_size, "seed": cfg.seed
            }),
            when=cfg.fuzzy_dedup,
        ),
        Stage(
            "fuzzy_dedup", "dedup", reads="minhash", writes="stages/fuzzy_dedup/{shard:05d}.npy",
            fn=filter_shard,
            tasks=functools.partial(_dedup_tasks, drops=_fuzzy_drops, reason="near_duplicate"),
            inline=True,
            when=cfg.fuzzy_dedup,
        ),
        Stage(
            "quality", "map", reads="normalize", writes="documents/{shard:05d}.parquet",
            fn=quality_shard,
            tasks=functools.partial(_survivor_tasks, quality=cfg.quality),
        ),
    )  # fmt: skip
    return tuple(s for s in table if s.when)


def _input_tasks(run: _Run, stage: Stage, *, options: dict) -> list[ShardTask]:
    """One task per planned shard, reading the shard's input files."""
    return [
        ShardTask(s["id"], tuple(s["files"]), run.path(stage.name, s["id"]), options)
        for s in run.shards
    ]


def _survivor_tasks(run: _Run, stage: Stage, **fields) -> list[ShardTask]:
    """One task per shard that reached `stage`, reading `stage.reads` without the rows the
    dedup stages before it drop; `fields` are the stage's `ShardTask` settings."""
    alive = run.alive(run.previous(stage))
    pending = [s for s in alive if run.ledger.done(stage.name, s) is None]
    drop = {s: run.dropped_before(stage, s) for s in pending}
    return [
        ShardTask(
            s, (run.path(stage.reads, s),), run.path(stage.name, s), drop=drop.get(s), **fields
        )
        for s in alive
    ]


def _dedup_tasks(
    run: _Run,
    stage: Stage,
    *,
    drops: Callable[[_Run, Stage, list[int]], tuple[dict[int, np.ndarray], dict | None]],
    reason: str,
) -> list[ShardTask]:
    """The global step `drops` (run only if a shard is left to do), then one task per shard
    that reached `stage`, recording its dropped rows under `reason`."""
    source = run.previous(stage)  # its `kept` rows reach this stage
    alive = run.alive(source)
    dropped: dict[int, np.ndarray] = {}
    if any(run.ledger.done(stage.name, s) is None for s in alive):
        # A pure function of the previous stages' files: a resumed run gets the same answer.
        dropped, stats = drops(run, stage, alive)
        if stats is not None:
            run.ledger.add({"stage": stage.name, "plan": stats})
    return [
        ShardTask(
            s,
            (run.path(_ROWS_OF, s),),
            run.path(stage.name, s),
            {"in": run.ledger.done(source, s)["kept"]},
            drop=dropped.get(s),
            reason=reason,
        )
        for s in alive
    ]


def _exact_drops(run: _Run, stage: Stage, shards: list[int]) -> tuple[dict[int, np.ndarray], None]:
    """Rows of each shard's normalised file whose text is a duplicate of an earlier row
    (input order)."""
    digests = [read_table(run.path(stage.reads, s), ["digest"])["digest"] for s in shards]
    if not digests:
        return {}, None
    allv = np.concatenate(digests)
    _, first = np.unique(allv, return_index=True)  # first occurrence in input order
    dup = np.ones(len(allv), bool)
    dup[first] = False
    bounds = np.cumsum([0] + [len(d) for d in digests])
    return {s: np.flatnonzero(dup[bounds[i] : bounds[i + 1]]) for i, s in enumerate(shards)}, None


def _fuzzy_drops(run: _Run, stage: Stage, shards: list[int]) -> tuple[dict[int, np.ndarray], dict]:
    """Rows of each shard's normalised file that are near-duplicates of an earlier row among
    those that reached minhash, and the LSH statistics."""
    cfg = run.config
    sigs, has, rows = [], [], []
    for s in shards:
        with np.load(run.path(stage.reads, s)) as z:
            sigs.append(z["sig"])
            has.append(z["has"])
            rows.append(z["rows"])
    if not sigs:
        return {}, {}
    bands, nrows = lsh_params(float(cfg.near_duplicate_threshold), cfg.num_perm)
    start = time.perf_counter()
    drop, stats = near_duplicate_drops(
        np.concatenate(sigs),
        np.concatenate(has),
        threshold=float(cfg.near_duplicate_threshold),
        bands=bands,
        rows=nrows,
    )
    stats["seconds"] = round(time.perf_counter() - start, 4)
    bounds = np.cumsum([0] + [len(x) for x in sigs])
    return {
        s: rows[i][np.flatnonzero(drop[bounds[i] : bounds[i + 1]])] for i, s in enumerate(shards)
    }, stats


@dataclasses.dataclass
class _Run:
    config: PipelineConfig
    root: str
    ledger: StageLedger
    shards: list[dict]
    pool: TaskPool
    budget: int | None
    log: Callable[[str], None]
    stages: tuple[Stage, ...]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    def path(self, stage: str, shard: int) -> str:
        """The file the task of (`stage`, `shard`) writes (`Stage.writes`)."""
        return os.path.join(self.root, self.stage(stage).writes.format(shard=shard))

    def previous(self, stage: Stage) -> str:
        """The stage before `stage`: the shards it kept reach `stage`."""
        return self.stages[[s.name for s in self.stages].index(stage.name) - 1].name

    def alive(self, stage: str) -> list[int]:
        """Shards whose output of `stage` exists (finished, not quarantined)."""
        out = []
        for s in self.shards:
            e = self.ledger.done(stage, s["id"])
            if e is not None and not e.get("quarantined"):
                out.append(s["id"])
        return out

    def dropped_before(self, stage: Stage, shard: int) -> np.ndarray | None:
        """Rows of the shard's normalised file that the dedup stages before `stage` drop."""
        before = self.stages[: [s.name for s in self.stages].index(stage.name)]
        drops = [np.load(self.path(s.name, shard)) for s in before if s.kind == "dedup"]
        return np.unique(np.concatenate(drops)) if drops else None

    def run(self, stage: Stage) -> None:
        """Runs the tasks of `stage` the ledger does not list; records each outcome."""
        tasks = stage.tasks(self, stage)
        todo = [t for t in tasks if self.ledger.done(stage.name, t.shard) is None]
        if self.budget is not None:
            if self.budget <= 0 and todo:
                raise _Stopped
            todo = todo[: self.budget]
        if not todo:
            return
        self.log(f"{stage.name}: {len(todo)} shard tasks")
        items = [(t.shard, t) for t in todo]
        if stage.inline:
            outcomes = run_inline(stage.fn, items, self.pool.retries)
        else:
            outcomes = self.pool.run(stage.fn, items)
        output = {t.shard: t.output for t in todo}
        try:
            self._record(stage.name, outcomes, output)
        finally:
            self.ledger.sync()
        if self.budget is not None and any(
            self.ledger.done(stage.name, t.shard) is None for t in tasks
        ):
            raise _Stopped

    def _record(self, stage: str, outcomes, output: dict) -> None:
        for o in outcomes:
            entry = {
                "stage": stage,
                "shard": o.key,
                "output": output[o.key],
                "attempts": o.attempts,
            }
            if o.error is None:
                entry.update(o.result)
            else:
                entry.update(quarantined=True, error=o.error)
                self.log(
                    f"{stage}: shard {o.key} quarantined after {o.attempts} attempts: {o.error}"
                )
            self.ledger.add(entry, sync=False)
            if self.budget is not None:
                self.budget -= 1


def _input_records(files: list[str]) -> list[dict]:
    return [{"path": f, "size": file_stat(f)[0], "digest": file_digest(f)} for f in files]


def _check_plan(root: str, plan: dict) -> None:
    path = os.path.join(root, "pipeline.json")
    if not os.path.exists(path):
        write_json(path, plan)
        return
    with open(path) as fh:
        old = json.load(fh)
    diff = sorted(k for k in set(old) | set(plan) if old.get(k) != plan.get(k))
    if "options" in diff:
        diff.remove("options")
        keys = set(old["options"]) | set(plan["options"])
        diff += [k for k in sorted(keys) if old["options"].get(k) != plan["options"].get(k)]
    if diff:
        raise PipelineError(
            f"output={root!r} holds a pipeline run with different {diff}; use a new --output, "
            f"or delete {root} to start over"
        )


def _stage_report(run: _Run, stage: Stage) -> dict:
    entries = [run.ledger.done(stage.name, s["id"]) for s in run.shards]
    entries = [e for e in entries if e is not None]
    ok = [e for e in entries if not e.get("quarantined")]
    dropped: collections.Counter = collections.Counter()
    altered: collections.Counter = collections.Counter()
    for e in ok:
        dropped.update(e["dropped"])
        altered.update(e.get("altered", {}))
    files = {s["id"]: s["files"] for s in run.shards}
    row = {
        "stage": stage.name,
        "in": sum(e["in"] for e in ok),
        "kept": sum(e["kept"] for e in ok),
        "dropped": dict(sorted(dropped.items())),
        "altered": dict(sorted(altered.items())),
        "examples": merge_examples(e.get("examples", {}) for e in ok),
        "task_seconds": round(sum(e["seconds"] for e in ok), 3),
        "shards": len(ok),
        "quarantined": [
            {
                "shard": e["shard"],
                "error": e["error"],
                "attempts": e["attempts"],
                "files": files[e["shard"]][:5],
            }
            for e in entries
            if e.get("quarantined")
        ],  # fmt: skip
    }
    for key in stage.sums:
        row[key] = sum(e.get(key, 0) for e in ok)
    if stage.name in run.ledger.plans:
        row["plan"] = run.ledger.plans[stage.name]
    return row


class _QuarantiningExecutor:
    """`build_store`'s executor on the pipeline's actors: a store shard that still fails after
    the retries is remembered instead of raised, so the build returns None (incomplete) and
    the pipeline can quarantine that shard's documents file and build the rest."""

    def __init__(self, pool: TaskPool):
        self.pool = pool
        self.failed: dict[int, tuple[str, int]] = {}  # store shard -> (error, attempts)

    def map_unordered(self, fn: Callable, items) -> collections.abc.Iterator:
        for outcome in self.pool.run(fn, [(item.shard, item) for item in items]):
            if outcome.error is None:
                yield outcome.result
            else:
                self.failed[outcome.key] = (outcome.error, outcome.attempts)


def _tokenize(run: _Run) -> dict | None:
    """Builds DIR/store from the last stage's files (`documents/`), one store shard per
    pipeline shard; a shard whose store task crashes or times out after the retries is
    quarantined (ledger stage `tokenize`) and the store is rebuilt from the others, so the
    job always finishes."""
    cfg = run.config
    last = run.stages[-1].name
    tokenizer = load_tokenizer(cfg.tokenizer)
    store_path = os.path.join(run.root, "store")
    start = time.perf_counter()
    while True:
        shards = [s for s in run.alive(last) if run.ledger.done("tokenize", s) is None]
        if not shards:
            run.log("tokenize: no documents survived (every shard quarantined?); no store built")
            return None
        executor = _QuarantiningExecutor(run.pool)
        store = build_store(
            [ParquetFiles("documents", [run.path(last, s) for s in shards])],
            tokenizer,
            store_path,
            executor=executor,
            shard_bytes=1,  # one store shard per documents file: a failure names its shard
            min_shards=1,
            sync="shards",  # a shard's files fsynced all at once, not each as written
        )
        if store is not None:
            break
        if not executor.failed:
            raise PipelineError(f"tokenize: the store build at {store_path} did not finish")
        # The store holds every shard or none: rebuild it without the failed ones.
        shutil.rmtree(store_path, ignore_errors=True)
        for store_shard, (error, attempts) in sorted(executor.failed.items()):
            shard = shards[store_shard]
            run.log(f"tokenize: shard {shard} quarantined after {attempts} attempts: {error}")
            run.ledger.add(
                {
                    "stage": "tokenize",
                    "shard": shard,
                    "output": store_path,
                    "attempts": attempts,
                    "quarantined": True,
                    "error": error,
                }
            )
    files = {s["id"]: s["files"] for s in run.shards}
    quarantined = [run.ledger.done("tokenize", s["id"]) for s in run.shards]
    return {
        "stage": "tokenize",
        "in": sum(run.ledger.done(last, s)["kept"] for s in shards),
        "kept": store.num_documents,
        "dropped": store.skipped,
        "altered": {},
        "tokens": store.num_tokens,
        "store": store_path,
        "task_seconds": round(time.perf_counter() - start, 3),
        "shards": len(shards),
        "quarantined": [
            {
                "shard": e["shard"],
                "error": e["error"],
                "attempts": e["attempts"],
                "files": files[e["shard"]][:5],
            }
            for e in quarantined
            if e is not None
        ],  # fmt: skip
    }


def run_pipeline(
    config: PipelineConfig,
    *,
    cluster: fray.Cluster | None = None,
    workers: int = 1,
    stop_after_tasks: int | None = None,
    log: Callable[[str], None] | None = None,
    inline_below_bytes: int = INLINE_BELOW_BYTES,
) -> dict | None:
    """Runs (or resumes, or just reads the report of) the pipeline; returns the report.

    Args:
        config: what to do (`PipelineConfig`).
        cluster: a fray cluster to run the shard tasks on (None: in this process, where a
            task's deadline cannot be enforced).
        workers: tasks at once (actors) on `cluster`.
        stop_after_tasks: run at most this many new tasks, then return None (rerun to
            continue); for incremental runs and tests.
        log: called with one line per event (default: silent).
        inline_below_bytes: with less input than this, run in this process even when given a
            `cluster` (logged): starting the actors would cost more than they save; a task's
            deadline is then not enforced. 0: always use `cluster`.

    Raises:
        PipelineError: invalid options, or `config.output` holds another pipeline's run.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise PipelineError(f"workers={workers!r}: need an int >= 1")
    b = inline_below_bytes
    if isinstance(b, bool) or not isinstance(b, int) or b < 0:
        raise PipelineError(f"inline_below_bytes={b!r}: need an int >= 0 (0: always use cluster)")
    root = config.output
    log = log or (lambda _: None)
    os.makedirs(root, exist_ok=True)
    busy = PipelineError(
        f"output={root!r}: another pipeline is running on it (it holds "
        f"{root}/.pipeline.lock); wait for it or use another --output"
    )
    with exclusive_lock(os.path.join(root, ".pipeline.lock"), busy):
        files = Files("input", config.inputs, text_key=config.text_key).files()
        shards = plan_shards([files], config.shard_bytes, config.min_shards)
        plan = {
            "format": FORMAT,
            "options": config.plan_options(),
            "inputs": _input_records(files),
            "shards": [{"id": s["id"], "files": s["files"]} for s in shards],
        }
        plan = json.loads(json.dumps(plan))
        _check_plan(root, plan)
        report_path = os.path.join(root, "report.json")
        if os.path.exists(report_path):
            log(f"{root}: finished already (report.json); nothing to do")
            with open(report_path) as fh:
                return json.load(fh)
        total_bytes = sum(f["size"] for f in plan["inputs"])
        if cluster is not None and total_bytes < inline_below_bytes:
            log(
                f"{total_bytes / 1e6:.2f} MB of input < inline_below_bytes="
                f"{inline_below_bytes / 1e6:.2f} MB: running in this process (actors would "
                f"not pay off; task deadlines are not enforced)"
            )
            cluster = None
        pool = TaskPool(cluster, workers, config.task_timeout_s, config.retries, _WARM)
        stages = stage_table(config)
        ledger = StageLedger(root)
        run = _Run(config, root, ledger, plan["shards"], pool, stop_after_tasks, log, stages)
        start = time.perf_counter()
        try:
            for stage in stages:
                run.run(stage)
            rows = [_stage_report(run, stage) for stage in stages]
            if config.tokenize:
                if run.budget is not None and run.budget <= 0:
                    raise _Stopped
                row = _tokenize(run)
                if row is not None:
                    rows.append(row)
        except _Stopped:
            log("stopped (stop_after_tasks); rerun to continue")
            return None
        finally:
            pool.close()
        last = rows[len(stages) - 1]  # the last stage writes documents/
        input_bytes = rows[0]["input_bytes"]
        elapsed = time.perf_counter() - start
        report = {
            "format": FORMAT,
            "input_files": len(files),
            "input_bytes": input_bytes,
            "documents": last["kept"],
            "documents_dir": os.path.join(root, "documents"),
            "stages": rows,
            "quarantined_shards": sorted({q["shard"] for r in rows for q in r["quarantined"]}),
            "last_run_seconds": round(elapsed, 3),
        }
        write_json(report_path, report)
        return report


def format_report(report: dict) -> str:
    """The report as a table: one row per stage, in, kept, dropped per reason.

    >>> print(format_report({"stages": [{"stage": "normalize", "in": 3, "kept": 2,
    ...     "dropped": {"empty": 1}, "altered": {}, "quarantined": []}]}))
    | stage | in | kept | dropped | by reason | quarantined shards |
    |---|---|---|---|---|---|
    | normalize | 3 | 2 | 1 | empty 1 | 0 |
    """
    lines = [
        "| stage | in | kept | dropped | by reason | quarantined shards |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["stages"]:
        reasons = ", ".join(f"{k} {v:,}" for k, v in r["dropped"].items()) or "-"
        notes = [f"{k} {v:,}" for k, v in r.get("altered", {}).items() if v]
        if r.get("truncated_files"):
            notes.append(f"truncated_file {r['truncated_files']:,}")
        if notes:
            reasons += f" (notes: {', '.join(notes)})"
        n_drop = sum(r["dropped"].values())
        lines.append(
            f"| {r['stage']} | {r['in']:,} | {r['kept']:,} | {n_drop:,} | {reasons} | "
            f"{len(r['quarantined'])} |"
        )
    return "\n".join(lines)
