"""Shard tasks on fray: a crash is retried then quarantined, a task over --task_timeout_s
costs its actor and is quarantined, and the job always finishes."""

from __future__ import annotations

import json
import os
import time

import pytest

from meltemi import fray
from meltemi.data.pipeline import PipelineConfig, QualityConfig, _pipeline, run_pipeline
from meltemi.data.pipeline._runner import run_tasks
from meltemi.data.pipeline._stages import normalize_shard


def _task(item):
    kind, marker = item
    if kind == "crash":
        raise RuntimeError("bad parquet shard")
    if kind == "hang":
        time.sleep(30)
    if kind == "flaky" and not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("transient")
    return kind


def _outcomes(cluster, items, **kw):
    kw = {"workers": 2, "task_timeout_s": 20.0, "retries": 1} | kw
    out = run_tasks(_task, list(enumerate(items)), cluster=cluster, **kw)
    return {o.key: o for o in out}


def test_a_crashing_task_is_retried_then_quarantined_and_the_others_finish(tmp_path):
    with fray.InProcessCluster() as cluster:
        items = [("ok", None), ("crash", None), ("flaky", str(tmp_path / "m")), ("ok", None)]
        got = _outcomes(cluster, items, retries=2)
    assert [got[k].result for k in (0, 2, 3)] == ["ok", "flaky", "ok"]
    assert got[2].attempts == 2 and got[2].error is None
    assert got[1].result is None and got[1].attempts == 3
    assert "RuntimeError: bad parquet shard" in got[1].error


def test_a_hung_task_is_killed_at_the_deadline_and_a_fresh_actor_takes_over():
    start = time.perf_counter()
    with fray.LocalCluster() as cluster:
        # 4 s and one retry: a fresh actor's first call (imports) can take seconds on a
        # loaded machine, and must not be mistaken for the hang.
        got = _outcomes(cluster, [("hang", None), ("ok", None), ("ok", None)], workers=1,
                        task_timeout_s=4.0, retries=1)  # fmt: skip
    assert got[0].error == "timed out after --task_timeout_s=4 s" and got[0].attempts == 2
    assert got[1].result == got[2].result == "ok"
    assert time.perf_counter() - start < 25  # the 30 s sleep did not hold the job


_POISON = "poison"


def _poisoned_normalize(task):
    if any(_POISON in f for f in task.inputs):
        raise OSError("stalled reading a bad shard")
    return normalize_shard(task)


def test_a_quarantined_shard_is_reported_and_the_pipeline_finishes(tmp_path, monkeypatch):
    monkeypatch.setattr(_pipeline, "normalize_shard", _poisoned_normalize)
    for name in ("a", _POISON, "c"):
        (tmp_path / f"{name}.jsonl").write_text(json.dumps({"text": f"from {name}"}) + "\n")
    cfg = PipelineConfig([str(tmp_path / "*.jsonl")], tmp_path / "out", retries=1,
                         quality=QualityConfig(enabled=False), min_shards=3)  # fmt: skip
    with fray.InProcessCluster() as cluster:
        report = run_pipeline(cfg, cluster=cluster, workers=2, inline_below_bytes=0)
    assert report["quarantined_shards"] == [2]  # files sorted: a, c, poison
    (q,) = report["stages"][0]["quarantined"]
    assert q["attempts"] == 2 and "OSError: stalled reading a bad shard" in q["error"]
    assert q["files"] == [str(tmp_path / f"{_POISON}.jsonl")]
    assert report["documents"] == 2 and all(r["shards"] == 2 for r in report["stages"][1:])
    assert run_pipeline(cfg) == report  # finished: a rerun does nothing


def test_task_timeout_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match=r"task_timeout_s=-1: need a number of seconds > 0"):
        PipelineConfig(["x"], tmp_path, task_timeout_s=-1)


class _NoActors:
    """A cluster that must not be used: starting an actor fails the test."""

    def spawn(self, *args, **kwargs):
        raise AssertionError("an actor was started for a tiny input")

    spawn_group = spawn


def test_a_tiny_input_runs_in_this_process_without_starting_actors(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "one small document"}) + "\n")
    cfg = PipelineConfig([str(tmp_path / "a.jsonl")], tmp_path / "out",
                         quality=QualityConfig(enabled=False))  # fmt: skip
    lines = []
    report = run_pipeline(cfg, cluster=_NoActors(), workers=2, log=lines.append)
    assert report["documents"] == 1
    assert any("< inline_below_bytes=8.00 MB: running in this process" in m for m in lines)


def test_an_input_at_the_threshold_uses_the_cluster(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "one small document"}) + "\n")
    size = os.path.getsize(tmp_path / "a.jsonl")
    cfg = PipelineConfig([str(tmp_path / "a.jsonl")], tmp_path / "out")
    with pytest.raises(AssertionError, match="an actor was started"):
        run_pipeline(cfg, cluster=_NoActors(), workers=2, inline_below_bytes=size)


def test_inline_below_bytes_must_be_a_non_negative_int(tmp_path):
    cfg = PipelineConfig(["x"], tmp_path)
    with pytest.raises(ValueError, match=r"inline_below_bytes=-1: need an int >= 0"):
        run_pipeline(cfg, inline_below_bytes=-1)
