"""metrics.jsonl, TensorBoard event files and the loss-curve PNG."""

import struct

import pytest

from meltemi.levanter.tracking import (
    MetricsWriter,
    TensorBoardWriter,
    crc32c,
    plot_loss_curve,
    read_metrics,
)


def test_resume_drops_records_after_the_checkpoint_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with MetricsWriter(path) as w:
        for step in range(1, 6):
            w.write({"step": step, "train/loss": float(step)})
    with MetricsWriter(path, resume_step=3) as w:
        w.write({"step": 4, "train/loss": 40.0})
    assert [(r["step"], r["train/loss"]) for r in read_metrics(path)] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 40.0),
    ]


def test_torn_last_line_is_ignored(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "train/loss": 2.0}\n{"step": 2, "tra')
    assert read_metrics(path) == [{"step": 1, "train/loss": 2.0}]


def test_non_finite_values_are_written_as_text(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with MetricsWriter(path) as w:
        w.write({"step": 1, "train/loss": float("nan")})
    assert read_metrics(path)[0]["train/loss"] == "nan"


def test_tensorboard_records_are_framed_with_valid_crcs(tmp_path):
    writer = TensorBoardWriter(tmp_path)
    writer.write(7, {"train/loss": 1.5})
    writer.close()
    data = next(tmp_path.glob("events.out.tfevents.*")).read_bytes()
    records = 0
    while data:
        (length,) = struct.unpack("<Q", data[:8])
        payload = data[12 : 12 + length]
        (crc,) = struct.unpack("<I", data[12 + length : 16 + length])
        masked = (((crc32c(payload) >> 15) | (crc32c(payload) << 17)) + 0xA282EAD8) & 0xFFFFFFFF
        assert crc == masked
        data = data[16 + length :]
        records += 1
    assert records == 2


def test_loss_curve_png_is_written(tmp_path):
    with MetricsWriter(tmp_path / "metrics.jsonl") as w:
        for step in range(1, 4):
            w.write({"step": step, "train/loss": 3.0 - step * 0.5})
        w.write({"step": 3, "train/loss": 1.4, "eval/stdlib/loss": 1.6})
    png = plot_loss_curve(tmp_path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_loss_curve_without_metrics_says_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"holds no `train/loss` records"):
        plot_loss_curve(tmp_path)
