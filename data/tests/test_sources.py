"""Sources: the embedded stdlib corpus and the file formats, plus their errors."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from meltemi.data import JsonlFiles, ParquetFiles, SourceError, TextFiles, stdlib_corpus


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


def test_fingerprint_changes_when_a_file_changes(tmp_path):
    (tmp_path / "a.txt").write_text("one")
    src = TextFiles("t", [str(tmp_path / "a.txt")])
    before = src.fingerprint()
    (tmp_path / "a.txt").write_text("one more")
    assert src.fingerprint() != before


def test_urls_are_read_through_tensorstore_kvstores(tmp_path):
    lines = "".join(json.dumps({"text": t}) + "\n" for t in ["one", "two"]).encode()
    with gzip.open(tmp_path / "b.jsonl.gz", "wb") as f:
        f.write(lines)
    src = JsonlFiles("j", [f"file://{tmp_path}/*.jsonl.gz"])
    assert src.files() == [f"file://{tmp_path}/b.jsonl.gz"]
    assert _texts(src) == ["one", "two"]


def test_missing_url_is_a_source_error(tmp_path):
    src = TextFiles("t", [f"file://{tmp_path}/absent.txt"])
    with pytest.raises(SourceError, match="absent.txt' does not exist"):
        list(src.read(src.files()[0]))
