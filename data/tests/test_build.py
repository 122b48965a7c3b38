"""Building stores: contents, bad-input policies, decontamination, resume, atomic finalise."""

from __future__ import annotations

import concurrent.futures
import fcntl
import functools
import gzip
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import varied_texts, write_jsonl

from meltemi import fray
from meltemi.data import (
    ByteTokenizer,
    CleanPolicy,
    Files,
    FrayExecutor,
    JsonlFiles,
    ProcessExecutor,
    StoreError,
    TextFiles,
    TokenizerMismatchError,
    TokenStore,
    build_store,
    train_bpe,
)
from meltemi.data._build import _build_shard
from meltemi.data._clean import (
    contains_any,
)

TOK = ByteTokenizer()


def _decoded(store):
    return [TOK.decode(store.document(d)) for d in range(store.num_documents)]


def _jsonl_source(tmp_path, texts, name="src"):
    return JsonlFiles(name, [str(write_jsonl(tmp_path / f"{name}.jsonl", texts))])


def test_documents_come_back_in_source_order_wrapped_in_bos_eos(tmp_path):
    texts = varied_texts(23)
    store = build_store([_jsonl_source(tmp_path, texts)], TOK, tmp_path / "s")
    assert _decoded(store) == texts
    doc = store.document(4)
    assert doc[0] == TOK.bos_id and doc[-1] == TOK.eos_id
    assert store.num_tokens == sum(len(t.encode()) + 2 for t in texts)


def test_token_ranges_read_inside_a_document(tiny_store):
    full = tiny_store.document(5)
    assert np.array_equal(tiny_store.tokens(5, 3, 9), full[3:9])
    with pytest.raises(IndexError, match=r"token range \[0, 9999\) outside document 5"):
        tiny_store.tokens(5, 0, 9999)
    with pytest.raises(IndexError, match="document 37 out of range"):
        tiny_store.document(37)


def test_provenance_names_file_and_line(tmp_path):
    store = build_store([_jsonl_source(tmp_path, ["a", "b", "c"])], TOK, tmp_path / "s")
    assert store.location(2).endswith("src.jsonl:3")


def test_malformed_lines_are_counted_by_reason_with_file_and_line(tmp_path):
    lines = '{"text": "good"}\n{"text": \n[1, 2]\n{"text": 7}\nnot json\n{"text": "fine"}\n'
    (tmp_path / "m.jsonl").write_text(lines)
    store = build_store([JsonlFiles("m", [str(tmp_path / "m.jsonl")])], TOK, tmp_path / "s")
    assert _decoded(store) == ["good", "fine"]
    assert store.skipped == {"malformed_json": 2, "no_text_field": 2}
    m = str(tmp_path / "m.jsonl")
    examples = store.metadata["examples"]
    assert [e.split(": ")[0] for e in examples["malformed_json"]] == [f"{m}:2", f"{m}:5"]
    assert [e.split(": ")[0] for e in examples["no_text_field"]] == [f"{m}:3", f"{m}:4"]
    assert store.metadata["per_source"]["m"]["counts"] == store.skipped


def _truncated_gzip_jsonl(path, count: int) -> int:
    """Writes `count` records gzipped, cut 1% before the end; returns the readable count."""
    data = "".join(json.dumps({"text": f"record {i} " * 4}) + "\n" for i in range(count))
    blob = gzip.compress(data.encode())
    path.write_bytes(blob[: len(blob) * 99 // 100])
    readable = 0
    try:
        with gzip.open(path, "rt") as f:
            for line in f:
                readable += line.endswith("\n")
    except EOFError:
        pass
    return readable


@pytest.mark.parametrize("kind", [Files, JsonlFiles])
def test_a_truncated_gzip_in_a_directory_keeps_every_readable_record(tmp_path, kind):
    (tmp_path / "dir").mkdir()
    readable = _truncated_gzip_jsonl(tmp_path / "dir" / "a.jsonl.gz", 10_000)
    write_jsonl(tmp_path / "dir" / "b.jsonl", ["after"])
    store = build_store([kind("d", [str(tmp_path / "dir")])], TOK, tmp_path / "s")
    assert readable > 9_000 and store.num_documents == readable + 1
    assert store.skipped == {"truncated_file": 1}
    assert "a.jsonl.gz: unreadable (EOFError" in store.metadata["examples"]["truncated_file"][0]


def test_files_reads_each_file_by_its_name(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    write_jsonl(d / "a.jsonl", ["one", "two"])
    (d / "b.txt").write_text("three")
    pq.write_table(pa.table({"text": ["four"]}), d / "c.parquet")
    store = build_store([Files("f", [str(d)])], TOK, tmp_path / "s")
    assert _decoded(store) == ["one", "two", "three", "four"]


def test_invalid_utf8_is_replaced_by_default(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"caf\xe9 ok")
    store = build_store([TextFiles("t", [str(tmp_path / "a.txt")])], TOK, tmp_path / "s")
    assert _decoded(store) == ["caf\ufffd ok"]
    assert store.skipped == {"invalid_utf8_replaced": 1}


def test_invalid_utf8_can_be_skipped(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"caf\xe9")
    (tmp_path / "b.txt").write_bytes(b"fine")
    src = TextFiles("t", [str(tmp_path / "*.txt")])
    store = build_store([src], TOK, tmp_path / "s", policy=CleanPolicy(invalid_utf8="skip"))
    assert _decoded(store) == ["fine"]
    assert store.skipped == {"invalid_utf8_skipped": 1}


def test_empty_documents_are_skipped_and_counted(tmp_path):
    store = build_store([_jsonl_source(tmp_path, ["", "x", "   \n "])], TOK, tmp_path / "s")
    assert _decoded(store) == ["x"]
    assert store.skipped == {"empty": 2}


def test_megabyte_runs_are_truncated_quickly(tmp_path):
    text = "start " + "a" * 3_000_000 + " \n\t" * 700_000 + " end"
    start = time.perf_counter()
    store = build_store(
        [_jsonl_source(tmp_path, [text])], TOK, tmp_path / "s", policy=CleanPolicy(max_run=50)
    )
    assert time.perf_counter() - start < 20
    assert _decoded(store) == ["start " + "a" * 50 + (" \n\t" * 17)[:50] + "end"]
    assert store.skipped == {"truncated_runs": 1}


def test_long_documents_are_truncated(tmp_path):
    policy = CleanPolicy(max_document_chars=11)
    store = build_store(
        [_jsonl_source(tmp_path, ["abcdefghijklmnop"])], TOK, tmp_path / "s", policy=policy
    )
    assert _decoded(store) == ["abcdefghijk"]
    assert store.skipped == {"truncated_long": 1}


def test_decontamination_drops_overlapping_documents_per_source(tmp_path):
    secret = "the quick brown fox jumps over the lazy dog"
    a = _jsonl_source(tmp_path, [f"x {secret} y", "clean one", "clean two"], name="a")
    b = _jsonl_source(tmp_path, ["nothing here", f"{secret[:12]}"], name="b")
    evals = _jsonl_source(tmp_path, [f"prefix {secret}"], name="eval")
    store = build_store([a, b], TOK, tmp_path / "s", decontaminate=[evals])
    assert _decoded(store) == ["clean one", "clean two", "nothing here", secret[:12]]
    assert store.metadata["per_source"]["a"]["counts"] == {"decontaminated": 1}
    assert store.metadata["per_source"]["b"]["counts"] == {}


def test_contains_any_agrees_with_isin():
    rng = np.random.default_rng(0)
    big = np.unique(rng.integers(0, 2**63, 50_000, dtype=np.uint64))
    for _ in range(200):
        values = rng.integers(0, 2**63, int(rng.integers(0, 30)), dtype=np.uint64)
        if rng.random() < 0.5 and len(values):
            values[int(rng.integers(len(values)))] = big[int(rng.integers(len(big)))]
        assert contains_any(big, values) == bool(np.isin(values, big).any())
    top = np.asarray([np.iinfo(np.uint64).max], np.uint64)
    assert not contains_any(big, top) and not contains_any(big[:0], big[:3])


class _Recording:
    """An inline executor that records how many bytes each task pickles to."""

    def __init__(self):
        self.sizes = []

    def map_unordered(self, fn, items):
        for item in items:
            self.sizes.append(len(pickle.dumps(item)))
            yield fn(item)


def test_the_evaluation_set_is_not_shipped_with_every_task(tmp_path):
    rng = np.random.default_rng(1)
    evals = [" ".join(rng.choice(["a", "b", "c", "d"], 20_000)) for _ in range(10)]
    ev = _jsonl_source(tmp_path, evals, name="eval")  # ~200,000 distinct 13-gram hashes
    parts = [[f"doc {i} {j}" for j in range(10)] for i in range(4)]
    parts[2].append(evals[3][:200])
    files = [str(write_jsonl(tmp_path / f"t{i}.jsonl", texts)) for i, texts in enumerate(parts)]
    executor = _Recording()
    build = functools.partial(build_store, decontaminate=[ev], executor=executor, min_shards=4)
    store = build([JsonlFiles("t", files)], TOK, tmp_path / "s")
    assert store.metadata["per_source"]["t"]["counts"] == {"decontaminated": 1}
    assert len(executor.sizes) == 4 and max(executor.sizes) < 20_000
    assert not [f for f in os.listdir(tmp_path / "s") if f.startswith(".eval-hashes")]


def test_decontamination_runs_in_worker_processes(tmp_path):
    secret = "the quick brown fox jumps over the lazy dog"
    a = _jsonl_source(tmp_path, [f"x {secret} y", "clean one"], name="a")
    evals = _jsonl_source(tmp_path, [f"prefix {secret}"], name="eval")
    store = build_store([a], TOK, tmp_path / "s", decontaminate=[evals],
                        executor=ProcessExecutor(1))  # fmt: skip
    assert _decoded(store) == ["clean one"]


def test_opening_with_another_tokenizer_is_a_clear_error(tmp_path, tiny_store):
    other = train_bpe(["some text to learn from"] * 5, 270, tmp_path / "t.json")
    with pytest.raises(TokenizerMismatchError, match=r"built with tokenizer ByteTokenizer\(\)"):
        TokenStore.open(tiny_store.path, tokenizer=other)
    assert TokenStore.open(tiny_store.path, tokenizer=TOK).num_documents == 37


def test_opening_a_missing_store_says_how_to_build_one(tmp_path):
    with pytest.raises(StoreError, match=r"no token store here.*build_store"):
        TokenStore.open(tmp_path / "nothing")


def _many_files(tmp_path, count):
    texts = varied_texts(count, seed=4)
    for i, t in enumerate(texts):
        (tmp_path / "in").mkdir(exist_ok=True)
        (tmp_path / "in" / f"f{i:04d}.txt").write_text(t)
    return TextFiles("files", [str(tmp_path / "in" / "*.txt")]), texts


def test_stopped_build_does_not_open_and_resumes_without_loss(tmp_path):
    src, texts = _many_files(tmp_path, 19)
    assert build_store([src], TOK, tmp_path / "s", shard_bytes=100, stop_after_shards=3) is None
    with pytest.raises(StoreError, match="did not finish; rerun build_store"):
        TokenStore.open(tmp_path / "s")
    store = build_store([src], TOK, tmp_path / "s", shard_bytes=100)
    assert _decoded(store) == texts
    assert len(store.metadata["shards"]) > 3


def test_rerun_with_other_options_is_refused(tmp_path):
    src, _ = _many_files(tmp_path, 5)
    build_store([src], TOK, tmp_path / "s", stop_after_shards=0)
    with pytest.raises(StoreError, match=r"different \['options'\]"):
        build_store([src], TOK, tmp_path / "s", policy=CleanPolicy(max_run=7))


def test_finished_build_is_reopened_not_rebuilt(tmp_path):
    src, _ = _many_files(tmp_path, 5)
    build_store([src], TOK, tmp_path / "s")
    mtime = os.stat(tmp_path / "s" / "meta.json").st_mtime_ns
    build_store([src], TOK, tmp_path / "s")
    assert os.stat(tmp_path / "s" / "meta.json").st_mtime_ns == mtime


def test_fray_workers_build_the_same_store_as_inline(tmp_path):
    src, texts = _many_files(tmp_path, 9)
    inline = build_store([src], TOK, tmp_path / "i", shard_bytes=200)
    pooled = build_store([src], TOK, tmp_path / "p", shard_bytes=200, workers=2)
    assert _decoded(pooled) == _decoded(inline) == texts
    assert pooled.metadata["shards"] == inline.metadata["shards"]


def test_process_pool_executor_builds_the_same_store(tmp_path):
    src, texts = _many_files(tmp_path, 5)
    store = build_store([src], TOK, tmp_path / "p", shard_bytes=200, executor=ProcessExecutor(2))
    assert _decoded(store) == texts


def test_a_failing_worker_leaves_a_resumable_build(tmp_path):
    src, texts = _many_files(tmp_path, 6)
    with fray.InProcessCluster() as cluster:
        flaky = FrayExecutor(2, cluster=cluster)
        with pytest.raises(fray.RemoteError, match="shard 3 exploded"):
            build_store([src], TOK, tmp_path / "s", shard_bytes=1, executor=_Exploding(flaky, 3))
    ledger = (tmp_path / "s" / "ledger.jsonl").read_text().splitlines()
    assert 3 not in {json.loads(x)["shard"] for x in ledger}
    store = build_store([src], TOK, tmp_path / "s", shard_bytes=1)
    assert _decoded(store) == texts


def _is_none(item):
    return item is None


def test_map_unordered_runs_every_item_even_none():
    # None used to end the items early: [1, None, 2] gave one result.
    with fray.InProcessCluster() as cluster:
        results = list(FrayExecutor(2, cluster=cluster).map_unordered(_is_none, [1, None, 2, None]))
    assert sorted(results) == [False, False, True, True]


def test_a_second_concurrent_build_is_refused(tmp_path):
    src, _ = _many_files(tmp_path, 3)
    build_store([src], TOK, tmp_path / "s", stop_after_shards=0)
    with open(tmp_path / "s" / ".build.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(StoreError, match=r"another build of .* is running"):
            build_store([src], TOK, tmp_path / "s")


def test_a_finished_store_opens_while_another_process_holds_the_build_lock(tmp_path):
    # Checking for a finished store takes no lock: a trainer whose cache directory is locked
    # by another one (building, or checking) is not refused.
    src, _ = _many_files(tmp_path, 3)
    built = build_store([src], TOK, tmp_path / "s")
    with open(tmp_path / "s" / ".build.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        opened = build_store([src], TOK, tmp_path / "s")
    assert opened.num_tokens == built.num_tokens > 0


def test_two_concurrent_openers_of_a_finished_store_both_open_it(tmp_path):
    src, _ = _many_files(tmp_path, 3)
    built = build_store([src], TOK, tmp_path / "s")
    barrier = threading.Barrier(2)

    def opener(_):  # each thread locks through its own file description, like a process
        tokens = []
        try:
            for _ in range(20):
                barrier.wait(timeout=60)
                tokens.append(build_store([src], TOK, tmp_path / "s").num_tokens)
        except BaseException:
            barrier.abort()  # the other opener stops waiting too
            raise
        return tokens

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(opener, range(2)))
    assert results == [[built.num_tokens] * 20] * 2


def test_a_finished_store_of_other_sources_is_refused_without_the_lock(tmp_path):
    src, _ = _many_files(tmp_path, 3)
    build_store([src], TOK, tmp_path / "s")
    other = TextFiles("other", src.paths)
    with pytest.raises(StoreError, match=r"holds a build with different \['sources'\]"):
        build_store([other], TOK, tmp_path / "s")


def _explode_on(task, shard):
    if task.shard == shard:
        raise RuntimeError(f"shard {shard} exploded")
    return _build_shard(task)


class _Exploding:
    def __init__(self, inner, shard):
        self.inner, self.shard = inner, shard

    def map_unordered(self, fn, items):
        return self.inner.map_unordered(functools.partial(_explode_on, shard=self.shard), items)


_KILL_SCRIPT = """
import sys
from meltemi.data import ByteTokenizer, TextFiles, build_store
build_store([TextFiles("files", [sys.argv[1]])], ByteTokenizer(), sys.argv[2], shard_bytes=1)
"""


def test_killed_build_resumes_with_no_duplicated_or_lost_documents(tmp_path):
    src, texts = _many_files(tmp_path, 160)
    out = tmp_path / "s"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT, src.paths[0], str(out)], env=env)
    ledger = out / "ledger.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline:
        if ledger.exists() and len(ledger.read_text().splitlines()) >= 5:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "meta.json").exists(), "the build finished before it could be killed"
    done_before = len(ledger.read_text().splitlines())
    assert 5 <= done_before < 160
    store = build_store([src], TOK, out, shard_bytes=1)
    assert _decoded(store) == texts
    entries = [json.loads(x) for x in ledger.read_text().splitlines() if x.strip()]
    assert sorted({e["shard"] for e in entries}) == list(range(160))


def test_a_store_opens_from_a_url(tiny_store):
    again = TokenStore.open(f"file://{tiny_store.path}", tokenizer=TOK)
    assert np.array_equal(again.document(7), tiny_store.document(7))
    assert again.location(7) == tiny_store.location(7)


_NO_JAX_SCRIPT = """
import sys
from meltemi.data import ByteTokenizer, JsonlFiles, PackedDataset, build_store
store = build_store([JsonlFiles("a", [sys.argv[1]])], ByteTokenizer(), sys.argv[2])
PackedDataset(store, seq_len=9, batch_size=2).batch(3)
assert "jax" not in sys.modules, "meltemi.data imported jax"
"""


def test_store_and_datasets_work_without_importing_jax(tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", varied_texts(11))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run(
        [sys.executable, "-c", _NO_JAX_SCRIPT, str(src), str(tmp_path / "s")], env=env, check=True
    )


def test_corrupt_files_are_counted_not_fatal(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", ["fine"])
    (tmp_path / "b.jsonl.gz").write_bytes(b"\x1f\x8b\x08\x00garbage that is not deflate")
    src = JsonlFiles("j", [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl.gz")])
    store = build_store([src], TOK, tmp_path / "s")
    assert _decoded(store) == ["fine"]
    assert store.skipped == {"truncated_file": 1}
    assert any("b.jsonl.gz: unreadable" in p for p in store.metadata["problems"])


def test_lone_surrogate_escapes_are_replaced(tmp_path):
    (tmp_path / "s.jsonl").write_text('{"text": "a\\ud800b"}\n')
    store = build_store([JsonlFiles("s", [str(tmp_path / "s.jsonl")])], TOK, tmp_path / "st")
    assert _decoded(store) == ["a\ufffd\ufffd\ufffdb"]
    assert store.skipped == {"invalid_utf8_replaced": 1}


class _BrokenTokenizer(ByteTokenizer):
    def encode(self, text):
        raise RuntimeError("tokenizer bug")


def test_a_bug_in_processing_is_raised_not_counted(tmp_path):
    with pytest.raises(RuntimeError, match="tokenizer bug"):
        build_store([_jsonl_source(tmp_path, ["x"])], _BrokenTokenizer(), tmp_path / "s")


def test_skipped_summary_is_one_line_naming_reasons_and_an_example(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"text": "fine"}\n{oops\n{"text": "bad \xff byte"}\n{"x": 1}\n')
    store = build_store([JsonlFiles("a", [str(path)])], ByteTokenizer(), tmp_path / "s")
    line = store.skipped_summary()
    assert line == (
        f"data: {tmp_path}/s skipped 2 inputs (malformed_json 1, no_text_field 1; e.g. "
        f"{path}:2: malformed JSON (Expecting property name enclosed in double quotes at "
        f"column 2)); altered 1 documents (invalid_utf8_replaced 1); 2 documents kept; "
        f"details in {tmp_path}/s/meta.json"
    )
    clean = tmp_path / "b.jsonl"
    clean.write_text('{"text": "fine"}\n')
    assert (
        build_store(
            [JsonlFiles("b", [str(clean)])], ByteTokenizer(), tmp_path / "t"
        ).skipped_summary()
        is None
    )
