"""The stage table: a stage is one `Stage` entry, and the driver knows nothing else of it."""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from meltemi.data.pipeline import (
    PipelineConfig,
    PipelineError,
    QualityConfig,
    _pipeline,
    run_pipeline,
)
from meltemi.data.pipeline._stages import read_table

_TEXTS = [
    "the first plain document",
    "a marked document to drop",
    "the first plain document",  # an exact duplicate of row 0
    "another plain document here",
    "one more marked text",
    "the last plain document",
    "a marked document to drop",  # exact duplicate of a marked one: exact dedup drops it first
]


def _inputs(tmp_path) -> list[str]:
    paths = []
    for i, part in enumerate((_TEXTS[:4], _TEXTS[4:])):
        path = tmp_path / f"in{i}.jsonl"
        path.write_text("".join(json.dumps({"id": f"{i}-{j}", "text": t}) + "\n"
                                for j, t in enumerate(part)))  # fmt: skip
        paths.append(str(path))
    return paths


def _config(tmp_path, **kw) -> PipelineConfig:
    kw = {"quality": QualityConfig(enabled=False), "fuzzy_dedup": False, "min_shards": 2} | kw
    return PipelineConfig(_inputs(tmp_path), str(tmp_path / "out"), **kw)


def _documents(root: str) -> list[str]:
    texts = []
    for name in sorted(os.listdir(os.path.join(root, "documents"))):
        texts += pq.read_table(os.path.join(root, "documents", name))["text"].to_pylist()
    return texts


def _marked_drops(run, stage, shards):
    """A global step of a stage the pipeline does not have: drop every text with "marked"
    among the rows that reach it (not those a dedup stage before it dropped)."""
    out, seen = {}, 0
    for s in shards:
        texts = read_table(run.path(stage.reads, s), ["text"])["text"]
        before = run.dropped_before(stage, s)
        gone = set() if before is None else set(before.tolist())
        marked = [i for i, t in enumerate(texts) if "marked" in t]
        seen += len(marked)
        out[s] = np.asarray([i for i in marked if i not in gone], np.int64)
    return out, {"marked_rows": seen}


def _with_marked_stage(table_fn):
    def table(config):
        marked = _pipeline.Stage(
            "marked_dedup",
            "dedup",
            reads="normalize",
            writes="stages/marked_dedup/{shard:05d}.npy",
            fn=_pipeline.filter_shard,
            tasks=functools.partial(_pipeline._dedup_tasks, drops=_marked_drops, reason="marked"),
            inline=True,
        )
        stages = list(table_fn(config))
        return (*stages[:-1], marked, stages[-1])  # just before quality

    return table


def test_a_stage_added_as_one_table_entry_runs_and_later_stages_skip_its_rows(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(_pipeline, "stage_table", _with_marked_stage(_pipeline.stage_table))
    cfg = _config(tmp_path)
    report = run_pipeline(cfg)
    assert cfg.stages() == ["normalize", "exact_dedup", "marked_dedup", "quality"]
    # Independent of the pipeline: first occurrences in input order, then no "marked".
    expected = [t for t in dict.fromkeys(_TEXTS) if "marked" not in t]
    assert _documents(cfg.output) == expected
    rows = {r["stage"]: r for r in report["stages"]}
    assert [r["stage"] for r in report["stages"]] == cfg.stages()
    assert rows["marked_dedup"]["in"] == rows["exact_dedup"]["kept"] == 5
    assert rows["marked_dedup"]["dropped"] == {"marked": 2}
    assert rows["marked_dedup"]["plan"] == {"marked_rows": 3}  # its step saw all of row 1, 4, 6
    assert rows["quality"]["in"] == rows["marked_dedup"]["kept"] == 3
    for shard in range(2):
        assert os.path.exists(f"{cfg.output}/stages/marked_dedup/{shard:05d}.npy")


def test_a_stage_writes_where_its_entry_says_and_nothing_else_knows_the_path(tmp_path, monkeypatch):
    real = _pipeline.stage_table

    def moved(config):
        return tuple(
            dataclasses.replace(s, writes=f"elsewhere/{s.name}-{{shard:05d}}.x")
            if s.name in ("normalize", "exact_dedup") else s
            for s in real(config)
        )  # fmt: skip

    monkeypatch.setattr(_pipeline, "stage_table", moved)
    cfg = _config(tmp_path)
    report = run_pipeline(cfg)
    assert _documents(cfg.output) == list(dict.fromkeys(_TEXTS))
    assert sorted(os.listdir(f"{cfg.output}/elsewhere")) == [
        "exact_dedup-00000.x", "exact_dedup-00001.x", "normalize-00000.x", "normalize-00001.x"
    ]  # fmt: skip
    assert not os.path.exists(f"{cfg.output}/stages/normalize")
    ledger = [json.loads(line) for line in open(f"{cfg.output}/ledger.jsonl")]
    assert {e["output"] for e in ledger if e["stage"] == "normalize"} == {
        f"{cfg.output}/elsewhere/normalize-00000.x", f"{cfg.output}/elsewhere/normalize-00001.x"
    }  # fmt: skip
    assert report["stages"][1]["dropped"] == {"exact_duplicate": 2}


def test_the_table_follows_the_config_and_stages_lists_its_names(tmp_path):
    for exact, fuzzy, names in [
        (True, True, ["normalize", "exact_dedup", "minhash", "fuzzy_dedup", "quality"]),
        (False, True, ["normalize", "minhash", "fuzzy_dedup", "quality"]),
        (True, False, ["normalize", "exact_dedup", "quality"]),
        (False, False, ["normalize", "quality"]),
    ]:
        cfg = _config(tmp_path, exact_dedup=exact, fuzzy_dedup=fuzzy)
        table = _pipeline.stage_table(cfg)
        assert [s.name for s in table] == cfg.stages() == names
        # Only the dedup stages drop rows the later stages skip, and only they run inline.
        assert {s.name for s in table if s.kind == "dedup"} == {
            n for n in names if n.endswith("_dedup")
        }
        assert all(s.inline == (s.kind == "dedup") for s in table)


def test_a_second_pipeline_on_the_same_output_is_refused_naming_the_lock(tmp_path):
    cfg = _config(tmp_path)
    os.makedirs(cfg.output)
    with open(os.path.join(cfg.output, ".pipeline.lock"), "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(PipelineError, match=r"another pipeline is running on it .*/out/"
                           r"\.pipeline\.lock\); wait for it or use another --output"):  # fmt: skip
            run_pipeline(cfg)
    assert run_pipeline(cfg)["documents"] == 5  # the lock released, the same DIR runs
