"""The pipeline skeleton: ids and metadata, Parquet outputs, exact dedup, ledger and resume,
report.json, truncated archives, option errors, tokenize into the store."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from meltemi.data import ByteTokenizer, TokenStore
from meltemi.data.pipeline import PipelineConfig, PipelineError, QualityConfig, run_pipeline

OFF = QualityConfig(enabled=False)


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def _documents(out) -> list[dict]:
    files = sorted(os.listdir(out / "documents"))
    rows = []
    for f in files:
        rows += pq.read_table(out / "documents" / f).to_pylist()
    return rows


def _config(tmp_path, inputs, **kw) -> PipelineConfig:
    kw.setdefault("quality", OFF)
    kw.setdefault("fuzzy_dedup", False)
    return PipelineConfig(inputs, tmp_path / "out", **kw)


def test_ids_come_from_the_id_field_else_the_location_and_other_fields_are_kept(tmp_path):
    a = _jsonl(tmp_path / "a.jsonl", [{"id": 7, "text": "seven", "url": "u7"}, {"text": "x"}])
    pq.write_table(pa.table({"text": ["row one", "row two"], "lang": ["en", "el"]}),
                   tmp_path / "b.parquet")  # fmt: skip
    (tmp_path / "c.txt").write_text("plain text file")
    cfg = _config(tmp_path, [a, str(tmp_path / "b.parquet"), str(tmp_path / "c.txt")])
    run_pipeline(cfg)
    rows = {r["id"]: r for r in _documents(tmp_path / "out")}
    assert set(rows) == {"7", f"{a}:2", f"{tmp_path}/b.parquet:1", f"{tmp_path}/b.parquet:2",
                         f"{tmp_path}/c.txt"}  # fmt: skip
    assert json.loads(rows["7"]["meta"]) == {"url": "u7"} and rows["7"]["text"] == "seven"
    assert json.loads(rows[f"{tmp_path}/b.parquet:2"]["meta"]) == {"lang": "el"}
    assert set(pq.read_schema(tmp_path / "out" / "documents" / "00000.parquet").names) == {
        "id", "text", "meta"}  # fmt: skip


def test_exact_duplicates_across_shards_keep_the_first_in_input_order(tmp_path):
    a = _jsonl(tmp_path / "a.jsonl", [{"id": "a1", "text": "same text"}, {"id": "a2", "text": "u"}])
    b = _jsonl(
        tmp_path / "b.jsonl", [{"id": "b1", "text": "same  text\n"}, {"id": "b2", "text": "v"}]
    )
    report = run_pipeline(_config(tmp_path, [a, b], min_shards=2))
    assert sorted(r["id"] for r in _documents(tmp_path / "out")) == ["a1", "a2", "b2"]
    exact = report["stages"][1]
    assert exact["stage"] == "exact_dedup" and exact["dropped"] == {"exact_duplicate": 1}


def test_report_counts_add_up_from_stage_to_stage(tmp_path):
    texts = [{"text": t} for t in ["one", "one", "", "two", "three", "two"]] + [{"no": 1}]
    a = _jsonl(tmp_path / "a.jsonl", texts)
    (tmp_path / "a.jsonl").open("a").write("{broken\n")
    report = run_pipeline(_config(tmp_path, [a]))
    assert json.loads((tmp_path / "out" / "report.json").read_text()) == report
    rows = report["stages"]
    for prev, row in zip(rows, rows[1:], strict=False):
        assert row["in"] == prev["kept"]
    for row in rows:
        assert row["in"] == row["kept"] + sum(row["dropped"].values())
    assert rows[0]["dropped"] == {"empty": 1, "malformed_json": 1, "no_text_field": 1}
    assert rows[0]["examples"]["malformed_json"] == [f"{a}:8"]
    assert report["documents"] == 3


def test_a_truncated_archive_keeps_the_records_before_the_damage(tmp_path):
    data = gzip.compress(
        "".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(400)).encode()
    )
    (tmp_path / "t.jsonl.gz").write_bytes(data[: len(data) // 2])
    report = run_pipeline(_config(tmp_path, [str(tmp_path / "t.jsonl.gz")]))
    normalize = report["stages"][0]
    assert normalize["truncated_files"] == 1
    assert "t.jsonl.gz" in normalize["examples"]["truncated_file"][0]
    kept = [r["text"] for r in _documents(tmp_path / "out")]
    assert 50 < len(kept) < 400 and kept[:3] == ["doc 0", "doc 1", "doc 2"]


def _recoverable_lines(kind: str, damaged: bytes) -> int:
    """Complete lines a streaming decompressor gets out of `damaged` (independent of fsspec)."""
    if kind == "gz":
        out = zlib.decompressobj(wbits=31).decompress(damaged)
    else:
        out = zstandard.ZstdDecompressor().decompressobj().decompress(damaged)
    return out.count(b"\n")


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_every_record_before_the_damage_of_a_truncated_archive_is_kept(tmp_path, kind):
    rng = np.random.default_rng(0)  # incompressible enough for several zstd blocks
    tail = [bytes(rng.integers(97, 123, i % 50, dtype=np.uint8)).decode() for i in range(12000)]
    raw = "".join(json.dumps({"text": f"doc {i} x{t}"}) + "\n" for i, t in enumerate(tail))
    if kind == "gz":
        data = gzip.compress(raw.encode())
    else:
        data = zstandard.ZstdCompressor(level=3).compress(raw.encode())
    damaged = data[: int(len(data) * 0.6)]
    (tmp_path / f"t.jsonl.{kind}").write_bytes(damaged)
    report = run_pipeline(_config(tmp_path, [str(tmp_path / f"t.jsonl.{kind}")], exact_dedup=False))
    assert report["stages"][0]["truncated_files"] == 1
    kept = [r["text"] for r in _documents(tmp_path / "out")]
    want = _recoverable_lines(kind, damaged)
    assert 1000 < want < 12000 and len(kept) == want
    assert kept == [f"doc {i} x{t}" for i, t in enumerate(tail[:want])]


def test_a_rerun_of_a_finished_pipeline_does_nothing(tmp_path):
    a = _jsonl(tmp_path / "a.jsonl", [{"text": f"text {i}"} for i in range(20)])
    cfg = _config(tmp_path, [a], fuzzy_dedup=True)
    first = run_pipeline(cfg)
    out = tmp_path / "out"
    before = {p: os.stat(p).st_mtime_ns for p in out.rglob("*") if p.is_file()}
    lines = []
    assert run_pipeline(cfg, log=lines.append) == first
    assert lines == [f"{out}: finished already (report.json); nothing to do"]
    assert {p: os.stat(p).st_mtime_ns for p in out.rglob("*") if p.is_file()} == before


def _ledger(out) -> list[dict]:
    return [json.loads(x) for x in (out / "ledger.jsonl").read_text().splitlines()]


def test_a_stopped_pipeline_resumes_and_matches_an_uninterrupted_run(tmp_path):
    recs = [{"id": f"d{i}", "text": f"text {i % 13} of {i % 7}"} for i in range(60)]
    a = _jsonl(tmp_path / "a.jsonl", recs[:30])
    b = _jsonl(tmp_path / "b.jsonl", recs[30:])
    full = run_pipeline(PipelineConfig([a, b], tmp_path / "full", quality=OFF, min_shards=2))
    cfg = PipelineConfig([a, b], tmp_path / "out", quality=OFF, min_shards=2)
    assert run_pipeline(cfg, stop_after_tasks=3) is None
    assert not (tmp_path / "out" / "report.json").exists() and len(_ledger(tmp_path / "out")) == 3
    assert run_pipeline(cfg, stop_after_tasks=4) is None
    report = run_pipeline(cfg)
    assert [r["id"] for r in _documents(tmp_path / "out")] == [
        r["id"] for r in _documents(tmp_path / "full")]  # fmt: skip
    strip = [{k: r[k] for k in ("stage", "in", "kept", "dropped")} for r in report["stages"]]
    assert strip == [{k: r[k] for k in ("stage", "in", "kept", "dropped")} for r in full["stages"]]
    done = [(e["stage"], e["shard"]) for e in _ledger(tmp_path / "out") if "shard" in e]
    assert len(done) == len(set(done)) == 5 * 2  # every (stage, shard) ran exactly once


def test_a_torn_ledger_line_or_a_missing_output_is_redone(tmp_path):
    a = _jsonl(tmp_path / "a.jsonl", [{"text": f"text {i}"} for i in range(10)])
    cfg = _config(tmp_path, [a], min_shards=1)
    assert run_pipeline(cfg, stop_after_tasks=2) is None
    out = tmp_path / "out"
    os.remove(out / "stages" / "exact_dedup" / "00000.npy")  # killed before the rename
    with (out / "ledger.jsonl").open("a") as fh:
        fh.write('{"stage": "quality", "sha')  # killed mid-line
    report = run_pipeline(cfg)
    assert report["documents"] == 10 and len(_documents(out)) == 10


def test_another_plan_in_the_same_output_is_refused(tmp_path):
    a = _jsonl(tmp_path / "a.jsonl", [{"text": "x"}])
    run_pipeline(_config(tmp_path, [a], fuzzy_dedup=True))
    with pytest.raises(PipelineError, match=r"different \['near_duplicate_threshold'\]; use a new"):
        run_pipeline(_config(tmp_path, [a], fuzzy_dedup=True, near_duplicate_threshold=0.7))


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        (
            "near_duplicate_threshold",
            1.5,
            r"near_duplicate_threshold=1.5: need a number in \(0, 1\]",
        ),
        ("task_timeout_s", 0, r"task_timeout_s=0: need a number of seconds > 0"),
        ("shingle_size", 0, r"shingle_size=0: need an int >= 1"),
        ("inputs", (), r"inputs=\(\): pass at least one path"),
    ],
)
def test_invalid_options_name_the_field_and_the_fix(tmp_path, field, value, match):
    kw = {"inputs": ("a.jsonl",), "output": str(tmp_path)} | {field: value}
    with pytest.raises(PipelineError, match=match):
        PipelineConfig(**kw)


def test_tokenize_builds_a_store_of_the_surviving_documents(tmp_path):
    a = _jsonl(tmp_path / "a.jsonl", [{"text": t} for t in ["héllo", "world", "héllo", "ok"]])
    report = run_pipeline(_config(tmp_path, [a], tokenize=True))
    tok = report["stages"][-1]
    assert tok["stage"] == "tokenize" and tok["in"] == tok["kept"] == 3
    store = TokenStore.open(tok["store"], ByteTokenizer())
    texts = [ByteTokenizer().decode(store.document(d)) for d in range(store.num_documents)]
    assert texts == [r["text"] for r in _documents(tmp_path / "out")] == ["héllo", "world", "ok"]


def test_a_killed_pipeline_resumes_where_it_stopped(tmp_path):
    from meltemi.data.pipeline._synthetic import synthetic_corpus, write_corpus

    write_corpus(synthetic_corpus(400, exact=20, near=20, junk=40, seed=3), str(tmp_path / "in"), 8)
    code = (
        "import sys; from meltemi.data.pipeline import PipelineConfig, run_pipeline; "
        "run_pipeline(PipelineConfig([sys.argv[1]], sys.argv[2], min_shards=8))"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / "in"), str(tmp_path / "out")], env=env
    )
    ledger = tmp_path / "out" / "ledger.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if ledger.exists() and len(ledger.read_text().splitlines()) >= 3:
            break
        time.sleep(0.02)
    proc.kill()  # SIGKILL: no cleanup runs
    proc.wait()
    assert not (tmp_path / "out" / "report.json").exists(), "finished before the kill"
    before = [(e["stage"], e["shard"]) for e in _ledger(tmp_path / "out") if "shard" in e]
    assert 3 <= len(before) < 5 * 8
    report = run_pipeline(PipelineConfig([str(tmp_path / "in")], tmp_path / "out", min_shards=8))
    done = [(e["stage"], e["shard"]) for e in _ledger(tmp_path / "out") if "shard" in e]
    assert done[: len(before)] == before and len(done) == len(set(done)) == 5 * 8
    full = run_pipeline(PipelineConfig([str(tmp_path / "in")], tmp_path / "full", min_shards=8))
    assert [r["id"] for r in _documents(tmp_path / "out")] == [
        r["id"] for r in _documents(tmp_path / "full")]  # fmt: skip
    assert report["documents"] == full["documents"]


def test_the_store_synced_per_shard_equals_the_store_synced_per_file(tmp_path, monkeypatch):
    from meltemi.data import ParquetFiles, build_store

    a = _jsonl(tmp_path / "a.jsonl", [{"text": f"document {i} " * (i + 1)} for i in range(40)])
    run_pipeline(_config(tmp_path, [a], min_shards=1))
    docs = ParquetFiles("documents", [str(tmp_path / "out" / "documents" / "00000.parquet")])
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    stores = {
        sync: build_store([docs], ByteTokenizer(), tmp_path / sync, sync=sync, chunk_tokens=64)
        for sync in ("files", "shards")
    }
    shard = tmp_path / "shards" / "shards" / "00000"
    chunk_files = [p for p in shard.rglob("*") if p.is_file()]
    assert len(chunk_files) > 10 and len(synced) >= len(chunk_files)  # each one fsynced
    a_store, b_store = stores["files"], stores["shards"]
    assert a_store.num_documents == b_store.num_documents == 40
    for d in range(40):
        assert np.array_equal(a_store.document(d), b_store.document(d))
    with pytest.raises(ValueError, match=r"build_store\(sync='disk'\): use one of \['files', 'sha"):
        build_store([docs], ByteTokenizer(), tmp_path / "x", sync="disk")
