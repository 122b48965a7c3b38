"""Every binary has a short real run."""

from __future__ import annotations

import json
import os
import runpy

import pytest
from conftest import varied_texts, write_jsonl

from meltemi.data import HfTokenizer, stdlib_corpus

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
    assert summary["documents"] == 30 and summary["skipped"] == {"malformed_json": 1}
    assert _main("inspect_store")(["--store", str(out), "--sample", "1"]) == 0
    text = capsys.readouterr().out
    assert "documents   30" in text and '"malformed_json": 1' in text
    assert f"malformed_json: 1, e.g. {corpus}:31: malformed JSON" in text


def test_train_tokenizer_writes_a_usable_file(tmp_path, corpus, capsys):
    out = tmp_path / "tok.json"
    assert (
        _main("train_tokenizer")(
            ["--output", str(out), "--corpus", f"jsonl:c={corpus}", "--vocab_size", "300"]
        )
        == 0
    )
    tok = HfTokenizer(out)
    assert f"vocab {tok.vocab_size}," in capsys.readouterr().out
    assert 260 <= tok.vocab_size <= 300 and (tok.bos_id, tok.eos_id, tok.pad_id) == (0, 1, 2)
    text = "doc7: alpha beta gamma"
    assert tok.decode(tok.encode(text)) == text and len(tok.encode(text)) < len(text)


def test_shuffle_report_writes_png_and_statistics(tmp_path, capsys):
    out = tmp_path / "r.png"
    assert (
        _main("shuffle_report")(["--output", str(out), "--n", "20011", "--batch_size", "64"]) == 0
    )
    stats = json.loads(capsys.readouterr().out.split("\nwrote")[0])["statistics"]
    assert stats["Feistel"]["gap_ks"] < 1.95 < stats["linear (a*x+b mod n)"]["gap_ks"]
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_bench_quick_reports_consistent_figures(capsys):
    assert _main("bench")(["--quick", "--workers", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    ratio = out["feistel_numpy_indices_per_s"] / out["numpy_permutation_per_s"]
    assert out["feistel_numpy_vs_numpy_permutation"] == pytest.approx(ratio, rel=1e-2)
    corpus_mb = sum(os.path.getsize(f) for f in stdlib_corpus("train").files()) / 1e6
    assert out["build_input_mb"] == pytest.approx(corpus_mb, abs=0.01)
    assert out["store_tokens"] >= 0.9 * corpus_mb * 1e6  # byte tokens, cleaned
    assert out["pack_rows_lower_bound"] <= out["pack_rows_ffd"] < out["pack_rows_next_fit"]
    assert out["pack_padding_ffd"] < 0.05 < 0.2 < out["pack_padding_next_fit"]
    assert 50 < out["short_doc_mean_tokens"] < 200 and out["short_doc_pieces_per_batch"] > 32 * 20
    speedups = [k for k in out if k.endswith("_vs_reference")]
    assert len(speedups) == 5 and all(out[k] > 0 for k in speedups)
    for stage in ("normalize", "quality"):  # batch stages and their per-document references
        ratio = out[f"{stage}_mb_per_s"] / out[f"{stage}_per_document_mb_per_s_reference"]
        assert out[f"{stage}_speedup_vs_reference"] == pytest.approx(ratio, rel=1e-2)


def test_pipeline_runs_on_fray_resumes_and_reports(tmp_path, capsys):
    from meltemi.data.pipeline._synthetic import synthetic_corpus, write_corpus

    write_corpus(synthetic_corpus(40, exact=4, near=4, junk=6, seed=2), str(tmp_path / "in"), 2)
    args = ["--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--workers", "2",
            "--tokenize", "--quality", "min_words=20"]  # fmt: skip
    assert _main("pipeline")(args) == 0
    out = capsys.readouterr().out
    assert "| exact_dedup | 54 | 50 | 4 | exact_duplicate 4 | 0 |" in out
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    n = report["documents"]
    assert 40 <= n <= 44  # 40 distinct documents, plus any of the 4 near copies missed
    assert f"| tokenize | {n} | {n} | 0 |" in out and f"{n} documents in" in out
    assert _main("pipeline")(args) == 0  # finished: a rerun does nothing
    assert "finished already" in capsys.readouterr().err


def test_pipeline_user_errors_print_one_line_and_exit_2(tmp_path, capsys):
    args = ["--input", str(tmp_path / "none*.jsonl"), "--output", str(tmp_path / "o")]
    assert _main("pipeline")([*args, "--quality", "min_word=3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --quality: 'min_word=3'") and "did you mean 'min_words'" in err
    assert err.count("\n") == 1, err  # one line, not a message that goes on
    assert _main("pipeline")(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Files(name='input'): no files match") and err.count("\n") == 1
