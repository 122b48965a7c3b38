"""Every binary has a short real run."""

from __future__ import annotations

import json
import os
import runpy

import pytest
from conftest import varied_texts, write_jsonl

BIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bin")


def _main(name):
    return runpy.run_path(os.path.join(BIN, name + ".py"), run_name="not_main")["main"]


@pytest.fixture
def corpus(tmp_path):
    return write_jsonl(tmp_path / "c.jsonl", varied_texts(29) + ["{broken"])


def test_build_store_then_inspect(tmp_path, corpus, capsys):
    (tmp_path / "c.jsonl").open("a").write("{not json\n")
    out = tmp_path / "store"
    assert (
        _main("build_store")(
            ["--output", str(out), "--source", f"jsonl:c={corpus}", "--no_progress"]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["documents"] == 30 and summary["skipped"] == {"malformed": 1}
    assert _main("inspect_store")(["--store", str(out), "--sample", "1"]) == 0
    text = capsys.readouterr().out
    assert "documents   30" in text and '"malformed": 1' in text and "c.jsonl:31" in text


def test_train_tokenizer_writes_a_usable_file(tmp_path, corpus, capsys):
    out = tmp_path / "tok.json"
    assert (
        _main("train_tokenizer")(
            ["--output", str(out), "--corpus", f"jsonl:c={corpus}", "--vocab_size", "300"]
        )
        == 0
    )
    assert out.exists() and "vocab" in capsys.readouterr().out


def test_shuffle_report_writes_png_and_statistics(tmp_path, capsys):
    out = tmp_path / "r.png"
    assert (
        _main("shuffle_report")(["--output", str(out), "--n", "20011", "--batch_size", "64"]) == 0
    )
    stats = json.loads(capsys.readouterr().out.split("\nwrote")[0])["statistics"]
    assert stats["Feistel"]["gap_ks"] < 1.95 < stats["linear (a*x+b mod n)"]["gap_ks"]
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_bench_quick_prints_every_key(capsys):
    assert _main("bench")(["--quick", "--workers", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in (
        "feistel_numpy_indices_per_s",
        "feistel_jax_indices_per_s",
        "numpy_permutation_per_s",
        "store_batches_per_s",
        "build_mb_per_s",
    ):
        assert out[key] > 0
