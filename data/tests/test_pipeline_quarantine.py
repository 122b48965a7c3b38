"""A shard that crashes or hangs in ANY stage, tokenize included, is retried, then quarantined
and reported; the other shards go on through every stage and the job finishes."""

from __future__ import annotations

import json
import time

import pytest

from meltemi import fray
from meltemi.data import ByteTokenizer, TokenStore, _build
from meltemi.data.pipeline import PipelineConfig, QualityConfig, _pipeline, run_pipeline

POISON = 2  # input files sort as a, c, poison: the poisoned one is shard 2
_REAL_BUILD_SHARD = _build._build_shard


def _inputs(tmp_path) -> str:
    for name in ("a", "c", "poison"):
        lines = [json.dumps({"id": f"{name}{i}", "text": f"{name} document number {i} " * 3})
                 for i in range(3)]  # fmt: skip
        (tmp_path / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    return str(tmp_path / "*.jsonl")


def _poisoned(real, stage: str | None = None):
    def fn(task):
        if task.shard == POISON and (stage is None or task.reason == stage):
            raise OSError(f"bad shard in {stage or 'stage'}")
        return real(task)

    return fn


def _crashing_build_shard(task):
    if task.files[0].endswith(f"{POISON:05d}.parquet"):
        raise OSError("bad shard in tokenize")
    return _REAL_BUILD_SHARD(task)


def _hanging_build_shard(task):
    if task.files[0].endswith(f"{POISON:05d}.parquet"):
        time.sleep(120)  # killed with its actor at the deadline
    return _REAL_BUILD_SHARD(task)


def _patch(monkeypatch, stage: str) -> None:
    if stage == "tokenize":
        monkeypatch.setattr(_build, "_build_shard", _crashing_build_shard)
    elif stage in ("exact_duplicate", "near_duplicate"):
        monkeypatch.setattr(_pipeline, "filter_shard", _poisoned(_pipeline.filter_shard, stage))
    else:
        name = f"{stage}_shard"
        monkeypatch.setattr(_pipeline, name, _poisoned(getattr(_pipeline, name)))


def _config(tmp_path, **kw) -> PipelineConfig:
    kw = {"retries": 1, "min_shards": 3, "tokenize": True} | kw
    return PipelineConfig([_inputs(tmp_path)], tmp_path / "out",
                          quality=QualityConfig(enabled=False), **kw)  # fmt: skip


def _check(report, stage: str, error: str, attempts: int) -> None:
    assert report["quarantined_shards"] == [POISON]
    rows = {r["stage"]: r for r in report["stages"]}
    (q,) = rows[stage]["quarantined"]
    assert q["shard"] == POISON and q["attempts"] == attempts and error in q["error"]
    assert q["files"][0].endswith("poison.jsonl")
    tok = rows["tokenize"]
    assert tok["kept"] == report["documents"] - (3 if stage == "tokenize" else 0) == 6
    store = TokenStore.open(tok["store"], ByteTokenizer())
    texts = {ByteTokenizer().decode(store.document(d)).split()[0] for d in range(6)}
    assert texts == {"a", "c"}  # every other shard went through every stage


@pytest.mark.parametrize(
    "stage, row",
    [
        ("normalize", "normalize"),
        ("exact_duplicate", "exact_dedup"),
        ("minhash", "minhash"),
        ("near_duplicate", "fuzzy_dedup"),
        ("quality", "quality"),
        ("tokenize", "tokenize"),
    ],
)
def test_a_crashing_shard_is_quarantined_in_every_stage_and_the_job_finishes(
    tmp_path, monkeypatch, stage, row
):
    _patch(monkeypatch, stage)
    cfg = _config(tmp_path)
    with fray.InProcessCluster() as cluster:
        report = run_pipeline(cfg, cluster=cluster, workers=2, inline_below_bytes=0)
    _check(report, row, "OSError: bad shard in", attempts=2)
    stages = [r["stage"] for r in report["stages"]]
    assert all(r["shards"] == 2 for r in report["stages"][stages.index(row) + 1 :])
    assert run_pipeline(cfg) == report  # finished: a rerun does nothing, retries nothing


def test_a_hanging_tokenize_shard_is_killed_at_the_deadline_and_quarantined(tmp_path, monkeypatch):
    monkeypatch.setattr(_build, "_build_shard", _hanging_build_shard)
    start = time.perf_counter()
    with fray.LocalCluster() as cluster:
        # No retry (a second 8 s wait proves nothing more): the actors import what the
        # tasks need when they start, so a good shard's first call is not slow.
        report = run_pipeline(_config(tmp_path, task_timeout_s=8.0, retries=0),
                              cluster=cluster, workers=2, inline_below_bytes=0)  # fmt: skip
    _check(report, "tokenize", "timed out after --task_timeout_s=8 s", attempts=1)
    assert time.perf_counter() - start < 100  # the 120 s sleep did not hold the job


def test_a_resumed_run_keeps_the_tokenize_quarantine_and_builds_the_rest(tmp_path, monkeypatch):
    monkeypatch.setattr(_build, "_build_shard", _crashing_build_shard)
    cfg = _config(tmp_path)
    with fray.InProcessCluster() as cluster:
        first = run_pipeline(cfg, cluster=cluster, workers=2, inline_below_bytes=0)
    (tmp_path / "out" / "report.json").unlink()  # as if killed just before the report
    monkeypatch.setattr(_build, "_build_shard", _REAL_BUILD_SHARD)
    again = run_pipeline(cfg)
    assert again["quarantined_shards"] == first["quarantined_shards"] == [POISON]
    assert again["stages"][-1]["kept"] == first["stages"][-1]["kept"] == 6
