"""`--dry_run` of `levanter/configs/long_context.py` with and without the `sequence` split.

The recipe at 2,048 tokens with a tiny model (the 8B plans at 64k and 128k are in
levanter/README.md): the same rows per FSDP device, with the sequence split 4 ways (8
devices) and without it (2 devices). The split plan's tokens and saved residuals per device
and parameters are exactly a quarter, and its compiled temporaries at least 3.5x smaller.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import json  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import _subprocess  # noqa: E402
import pytest  # noqa: E402

from meltemi.levanter.config import load_config  # noqa: E402
from meltemi.levanter.trainer import dry_run  # noqa: E402

CONFIG = pathlib.Path(__file__).parent.parent / "configs" / "long_context.py"
SEQ, SPLIT = 2048, 4


def _report(tmp_path, split: bool):
    overrides = {
        "run_dir": str(tmp_path / "run"),
        "data.seq_len": SEQ,
        "model.max_seq_len": SEQ,
        "model.remat": "full",
        "model.hidden_dim": 64,
        "model.intermediate_dim": 64,
        "mesh.ici.fsdp": 2,
        "mesh.ici.sequence": SPLIT if split else 1,
        "model.sequence_parallel": "ring" if split else "none",
        "trainer.train_batch_size": 2,
    }
    resolved = load_config(f"{CONFIG}:smoke", [(k, str(v)) for k, v in overrides.items()])
    return dry_run(resolved, 2 * SPLIT if split else 2)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plan")
    split = _report(tmp, split=True)  # first: the dry run sizes the CPU backend to its mesh
    return _report(tmp, split=False), split


def _per_device_tokens(text: str) -> int:
    match = re.search(r"tokens per step: ([\d,]+) \(([\d,]+) per device\)", text)
    assert match, text
    return int(match.group(2).replace(",", ""))


def test_split_plan_holds_a_quarter_of_the_tokens_per_device(reports):
    whole, split = reports
    assert split.mesh["sequence"] == SPLIT and whole.mesh["sequence"] == 1
    assert split.tokens_per_step == whole.tokens_per_step == 2 * SEQ
    assert _per_device_tokens(whole.format()) == SEQ  # one row per FSDP device
    assert _per_device_tokens(split.format()) == SEQ // SPLIT
    # One residual per layer (remat "full"): 2 layers x 512 tokens x 64 x 4 B per device.
    assert split.saved_carry_bytes == 2 * (SEQ // SPLIT) * 64 * 4
    assert whole.saved_carry_bytes == SPLIT * split.saved_carry_bytes


def test_split_plan_needs_a_split_factor_less_activation_memory(reports):
    whole, split = reports
    # The parameters are sharded over fsdp x sequence: a quarter per device too (every
    # array of this model has a dimension that 8 divides).
    assert whole.param_bytes == SPLIT * split.param_bytes
    ratio = whole.temp_bytes / split.temp_bytes
    assert ratio >= 3.5, (whole.temp_bytes, split.temp_bytes)
    assert whole.peak_bytes > split.peak_bytes


def test_bench_prints_figures_for_every_strategy_and_length(tmp_path):
    bench = pathlib.Path(__file__).parent.parent / "bin" / "long_context_bench.py"
    env = _subprocess.env()
    proc = subprocess.run(
        [sys.executable, str(bench), "--lengths=64", "--steps=1", "--devices=2",
         f"--run_dir={tmp_path / 'run'}"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["lengths"] == [64] and report["devices"] == 2
    for strategy in ("none", "all_gather", "ring"):
        assert len(report[strategy]["step_s"]) == len(report[strategy]["peak_bytes"]) == 1
        assert all(t > 0 for t in report[strategy]["step_s"])
    # Split 2 ways (and the state sharded over the split), a device holds less than the one
    # device of the unsplit run.
    assert all(r > 1 for r in report["memory_ratio_none_over_ring"])
    assert set(report["crossover"]) == {
        "ring_faster_than_all_gather_from",
        "ring_less_memory_than_all_gather_from",
        "split_faster_than_none_from",
    }
