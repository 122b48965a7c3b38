"""`data.packing` and the one-line summary of skipped inputs, in the trainer."""

import json

import _subprocess
import jax
import numpy as np
import pytest
from _one_error import one_error_line

from meltemi.levanter.config import ConfigError, base_config, resolve, with_variant
from meltemi.levanter.runtime import make_loss_fns
from meltemi.levanter.trainer import build_parts

# Documents of 5..24 bytes (+ bos/eos), much shorter than the 32-token rows: whole-document
# packing must pad, stream packing must not.
_DOCS = [f"doc {i} " + "x" * (i % 17) for i in range(300)]


def _corpus(tmp_path, bad_lines=0):
    path = tmp_path / "corpus.jsonl"
    lines = [json.dumps({"text": t}) for t in _DOCS] + ["{not json"] * bad_lines
    path.write_text("\n".join(lines) + "\n")
    return path


def _spec(tmp_path, packing):
    config = with_variant(base_config(), None, {})
    config.data.source = "files"
    config.data.train_files = (str(_corpus(tmp_path)),)
    config.data.seq_len = 32
    config.data.cache_dir = str(tmp_path / "cache")
    config.data.packing = packing
    config.trainer.train_batch_size = 8
    config.model.hidden_dim = 16
    config.model.intermediate_dim = 24
    config.model.num_layers = 1
    config.model.num_heads = 2
    config.model.num_kv_heads = 1
    config.model.head_dim = 8
    config.run_dir = str(tmp_path / "run")
    return resolve(config)


def test_packing_defaults_to_stream_and_rejects_unknown_names(tmp_path):
    config = with_variant(base_config(), None, {})
    assert resolve(config).data.packing == "stream"
    config.data.packing = "whole_document"
    with pytest.raises(ConfigError, match=r"data.packing='whole_document'.*whole_documents"):
        resolve(config)


def test_whole_documents_pads_and_the_loss_ignores_padding(tmp_path):
    parts = build_parts(_spec(tmp_path, "whole_documents"))
    rows = parts.train_data.sequences(np.arange(8))
    pad = rows["segment_ids"] == 0
    assert pad.mean() > 0.05  # short documents: rows are padded
    assert not rows["loss_mask"][pad].any()  # no loss on a padding position
    # Every document starts a fresh segment at position 0 (none straddles two rows).
    assert (rows["positions"][:, 0][rows["segment_ids"][:, 0] > 0] == 0).all()
    assert parts.data_metrics(np.arange(8))["data/padding_fraction"] == pytest.approx(
        parts.train_data.padding_fraction
    )

    # The loss cannot see what the padding holds: overwrite it and the loss is unchanged.
    model = parts.step.init_model(jax.random.PRNGKey(0))
    loss_fn, _ = make_loss_fns(0.0)
    batch = {k: v for k, v in rows.items()}
    noisy = dict(batch)
    noisy["tokens"] = np.where(pad, 7, batch["tokens"])
    noisy["targets"] = np.where(rows["loss_mask"] > 0, batch["targets"], 11)
    base = float(loss_fn(model, batch))
    assert float(loss_fn(model, noisy)) == pytest.approx(base, abs=1e-6)
    # ...while a real target changes it (the comparison above can fail).
    changed = dict(batch)
    real = np.argwhere(rows["loss_mask"] > 0)[0]
    changed["targets"] = batch["targets"].copy()
    changed["targets"][tuple(real)] = (batch["targets"][tuple(real)] + 1) % 256
    assert abs(float(loss_fn(model, changed)) - base) > 1e-6


def test_stream_packing_has_no_padding(tmp_path):
    parts = build_parts(_spec(tmp_path, "stream"))
    rows = parts.train_data.sequences(np.arange(8))
    assert (rows["segment_ids"] > 0).all()
    assert parts.data_metrics is None


def _binary_args(tmp_path, corpus):
    return (
        "--config.data.source=files",
        f"--config.data.train_files=('{corpus}',)",
        "--config.eval.num_batches=0",
        "--config.checkpoint.enabled=False",
        "--config.data.packing=whole_documents",
    )


def test_binary_trains_whole_documents_and_reports_skips_once(tmp_path):
    corpus = _corpus(tmp_path, bad_lines=2)
    args = _binary_args(tmp_path, corpus)
    first = _subprocess.run("run", "cache", *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "run finished: step 2/2" in first.stdout
    skipped = [ln for ln in first.stdout.splitlines() if "skipped" in ln and "data:" in ln]
    assert len(skipped) == 1, first.stdout
    assert skipped[0].startswith("data: cache/") and "malformed_json 2" in skipped[0]
    assert skipped[0].endswith("/train/meta.json")
    assert str(tmp_path) not in first.stdout
    padding = [ln for ln in first.stdout.splitlines() if "of row tokens are padding" in ln]
    assert len(padding) == 1, first.stdout
    records = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").open()]
    fractions = [r["data/padding_fraction"] for r in records if "data/padding_fraction" in r]
    assert fractions and 0.05 < fractions[0] < 1.0

    # A second run reuses the cached store: the build (and its skips) was reported already.
    again = _subprocess.run("run2", "cache", *args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert not [ln for ln in again.stdout.splitlines() if "skipped" in ln], again.stdout


def test_binary_refuses_an_unknown_packing_with_one_error_line(tmp_path):
    proc = _subprocess.run(tmp_path / "run", tmp_path / "cache", "--config.data.packing=documents")
    assert proc.returncode == 2, proc.stderr[-3000:]
    error = one_error_line(proc.stderr)
    assert "data.packing='documents'" in error and "whole_documents" in error
    assert not (tmp_path / "cache").exists()
