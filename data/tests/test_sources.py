"""Sources: the embedded stdlib corpus and the file formats, plus their errors."""

from __future__ import annotations

import gzip
import json
import os
import tracemalloc

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import write_jsonl

from meltemi.data import (
    ByteTokenizer,
    JsonlFiles,
    ParquetFiles,
    SourceError,
    SourcesChangedError,
    StoreError,
    TextFiles,
    TokenStore,
    build_store,
    stdlib_corpus,
)


def _texts(source):
    return [d.text for f in source.files() for d in source.read(f)]


def test_stdlib_split_is_disjoint_and_mostly_train():
    train, val = stdlib_corpus("train").files(), stdlib_corpus("validation").files()
    assert not set(train) & set(val)
    assert len(val) > 0 and len(train) > 10 * len(val)
    assert all(f.endswith(".py") and "site-packages" not in f for f in train + val)


def test_stdlib_split_is_stable_by_module_path():
    assert stdlib_corpus("validation").files() == stdlib_corpus("validation").files()
    assert stdlib_corpus("validation", validation_percent=50).files() != (
        stdlib_corpus("validation").files()
    )


def test_stdlib_unknown_split_is_an_error():
    with pytest.raises(SourceError, match=r"split='test'.*'train' or 'validation'"):
        stdlib_corpus("test")


def test_jsonl_reads_plain_gzip_and_zstd(tmp_path):
    lines = "".join(json.dumps({"text": t}) + "\n" for t in ["one", "two"]).encode()
    (tmp_path / "a.jsonl").write_bytes(lines)
    with gzip.open(tmp_path / "b.jsonl.gz", "wb") as f:
        f.write(lines)
    (tmp_path / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    src = JsonlFiles("j", [str(tmp_path / "*.jsonl*")])
    assert _texts(src) == ["one", "two"] * 3


def test_jsonl_reports_malformed_lines_with_file_and_line(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{not json\n{"body": "x"}\n')
    docs = [
        d for d in JsonlFiles("j", [str(tmp_path / "bad.jsonl")]).read(str(tmp_path / "bad.jsonl"))
    ]
    assert [d.problem is None for d in docs] == [True, False, False]
    assert docs[1].location.endswith("bad.jsonl:2") and "malformed JSON" in docs[1].problem
    assert docs[2].location.endswith("bad.jsonl:3") and "no string field 'text'" in docs[2].problem


def test_jsonl_hands_invalid_utf8_back_as_bytes(tmp_path):
    (tmp_path / "u.jsonl").write_bytes(b'{"text": "caf\xe9"}\n')
    (doc,) = JsonlFiles("j", [str(tmp_path / "u.jsonl")]).read(str(tmp_path / "u.jsonl"))
    assert doc.text == b"caf\xe9"


def test_parquet_reads_a_column_and_reports_nulls(tmp_path):
    pq.write_table(pa.table({"text": ["a", None, "c"]}), tmp_path / "t.parquet")
    docs = list(ParquetFiles("p", [str(tmp_path / "t.parquet")]).read(str(tmp_path / "t.parquet")))
    assert [d.text for d in docs] == ["a", None, "c"]
    assert docs[1].problem == "null value" and docs[1].location.endswith("row 2")


def test_parquet_missing_column_lists_the_columns(tmp_path):
    pq.write_table(pa.table({"body": ["a"]}), tmp_path / "t.parquet")
    src = ParquetFiles("p", [str(tmp_path / "t.parquet")])
    with pytest.raises(SourceError, match=r"no column 'text'; its columns are \['body'\]"):
        list(src.read(str(tmp_path / "t.parquet")))


def test_no_matching_files_is_an_error(tmp_path):
    with pytest.raises(SourceError, match=r"TextFiles\(name='t'\): no files match"):
        TextFiles("t", [str(tmp_path / "*.txt")]).files()


def _same_size_edit_keeping_mtime(path):
    """Rewrites a file in place with other bytes of the same length and puts its modification
    time back (what `cp -p` of an edited copy does): size and mtime are unchanged."""
    st = os.stat(path)
    data = path.read_bytes()
    path.write_bytes(data[::-1])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def test_fingerprint_changes_with_a_same_size_edit_that_keeps_mtime(tmp_path):
    (tmp_path / "a.txt").write_text("one two")
    src = TextFiles("t", [str(tmp_path / "a.txt")])
    before = src.fingerprint()
    assert src.fingerprint() == before  # unchanged file, same fingerprint
    _same_size_edit_keeping_mtime(tmp_path / "a.txt")
    assert src.fingerprint() != before


def test_store_open_refuses_a_source_edited_after_the_build(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", ["first", "second"])
    src = JsonlFiles("j", [str(tmp_path / "a.jsonl")])
    build_store([src], ByteTokenizer(), tmp_path / "s")
    TokenStore.open(tmp_path / "s")  # unchanged: opens
    _same_size_edit_keeping_mtime(tmp_path / "a.jsonl")
    with pytest.raises(SourcesChangedError, match=r"a\.jsonl \(source 'j'\) changed since"):
        TokenStore.open(tmp_path / "s")
    assert TokenStore.open(tmp_path / "s", check_sources=False).num_documents == 2
    with pytest.raises(StoreError, match=r"different \['sources'\]"):
        build_store([src], ByteTokenizer(), tmp_path / "s")


def test_store_opens_when_its_sources_are_gone(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", ["only"])
    build_store([JsonlFiles("j", [str(tmp_path / "a.jsonl")])], ByteTokenizer(), tmp_path / "s")
    os.remove(tmp_path / "a.jsonl")  # a store copied to a machine without its sources
    assert TokenStore.open(tmp_path / "s").num_documents == 1


def test_file_and_memory_urls_are_streamed_through_fsspec(tmp_path):
    lines = "".join(json.dumps({"text": t}) + "\n" for t in ["one", "two"]).encode()
    with gzip.open(tmp_path / "b.jsonl.gz", "wb") as f:
        f.write(lines)
    src = JsonlFiles("j", [f"file://{tmp_path}/*.jsonl.gz"])
    assert src.files() == [f"file://{tmp_path}/b.jsonl.gz"]
    assert _texts(src) == ["one", "two"]
    fs = fsspec.filesystem("memory")
    fs.pipe(f"/{tmp_path.name}/x/a.jsonl.gz", gzip.compress(lines))
    fs.pipe(f"/{tmp_path.name}/x/b.jsonl", lines)
    mem = JsonlFiles("m", [f"memory://{tmp_path.name}/x/*.jsonl*"])
    assert [f.rsplit("/", 1)[1] for f in mem.files()] == ["a.jsonl.gz", "b.jsonl"]
    assert _texts(mem) == ["one", "two"] * 2
    assert mem.fingerprint() == mem.fingerprint()
    store = build_store([mem], ByteTokenizer(), tmp_path / "s")
    assert store.num_documents == 4 and store.location(2).startswith("memory://")


def test_missing_url_is_a_source_error(tmp_path):
    src = TextFiles("t", [f"file://{tmp_path}/absent.txt"])
    with pytest.raises(SourceError, match="absent.txt' does not exist"):
        list(src.read(src.files()[0]))


def test_overlapping_patterns_read_each_file_once(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", ["a"])
    write_jsonl(tmp_path / "b.jsonl", ["b"])
    src = JsonlFiles("j", [str(tmp_path), str(tmp_path / "*.jsonl"), str(tmp_path / "a.jsonl")])
    assert src.files() == [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    assert _texts(src) == ["a", "b"]


def test_a_utf8_byte_order_mark_keeps_the_first_record(tmp_path):
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + b'{"text": "first"}\n{"text": "2"}\n')
    docs = list(JsonlFiles("j", [str(tmp_path / "bom.jsonl")]).read(str(tmp_path / "bom.jsonl")))
    assert [(d.text, d.problem) for d in docs] == [("first", None), ("2", None)]


def test_parquet_non_string_values_are_skipped_with_file_and_row(tmp_path):
    pq.write_table(pa.table({"text": pa.array([1, 2], pa.int64())}), tmp_path / "i.parquet")
    pq.write_table(pa.table({"text": [["a"], ["b", "c"]]}), tmp_path / "l.parquet")
    pq.write_table(pa.table({"text": ["kept"]}), tmp_path / "s.parquet")
    src = ParquetFiles("p", [str(tmp_path / "*.parquet")])
    store = build_store([src], ByteTokenizer(), tmp_path / "st")
    assert store.num_documents == 1 and store.skipped == {"non_string_value": 4}
    examples = store.metadata["examples"]["non_string_value"]
    assert examples[0] == f"{tmp_path / 'i.parquet'}:row 1: int value, not text"
    assert examples[3] == f"{tmp_path / 'l.parquet'}:row 2: list value, not text"


def test_a_truncated_text_archive_keeps_what_was_read(tmp_path):
    words = np.random.default_rng(0).choice(["alpha", "beta", "gamma", "delta"], 400_000)
    blob = gzip.compress(" ".join(words).encode())
    (tmp_path / "t.txt.gz").write_bytes(blob[: len(blob) // 2])
    store = build_store([TextFiles("t", [str(tmp_path / "t.txt.gz")])], ByteTokenizer(),
                        tmp_path / "s")  # fmt: skip
    assert store.num_documents == 1 and 500_000 < store.num_tokens < 1_500_000
    assert store.skipped == {"truncated_file": 1}


def test_a_url_source_is_streamed_not_read_whole(tmp_path):
    line = json.dumps({"text": "x" * 1000}) + "\n"
    (tmp_path / "big.jsonl").write_text(line * 30_000)  # 30 MB
    src = JsonlFiles("j", [f"file://{tmp_path}/big.jsonl"])
    tracemalloc.start()
    try:
        first = next(iter(src.read(src.files()[0])))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert first.text == "x" * 1000
    assert peak < 4 << 20, f"reading one line of a 30 MB URL allocated {peak / 1e6:.1f} MB"
