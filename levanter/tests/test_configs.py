"""Every config file under levanter/configs/ trains for 2 steps (its `:smoke` variant)."""

import importlib.util
import pathlib

import numpy as np
import pytest

from meltemi.levanter.config import SMOKE_MODEL, SMOKE_RUN, load_config
from meltemi.levanter.trainer import train

CONFIGS = sorted((pathlib.Path(__file__).parent.parent / "configs").glob("*.py"))


def _variants(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.VARIANTS


def test_configs_are_found():
    assert {p.name for p in CONFIGS} >= {"default.py", "marin_32b.py"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_trains_two_steps(path, tmp_path):
    assert "smoke" in _variants(path), f"{path.name} needs a `smoke` variant for this test"
    resolved = load_config(
        f"{path}:smoke",
        [("run_dir", str(tmp_path / "run")), ("data.cache_dir", str(tmp_path.parent / "cache"))],
    )
    assert resolved.config.trainer.num_train_steps == 2
    result = train(resolved)
    assert result.step == 2 and sorted(result.losses) == [1, 2]
    assert all(loss > 0 for loss in result.losses.values())
    assert result.loss_png is not None and result.loss_png.exists()
    assert (tmp_path / "run" / "checkpoints" / "step_00000002").is_dir()


# The files whose `:smoke` is `smoke_variant(...)` with no change to its run or model keys.
SHARED_SMOKE = ("default", "dpo", "mixture", "rl_arithmetic", "rl_math", "sft")


@pytest.mark.parametrize("name", SHARED_SMOKE)
def test_smoke_variants_train_the_shared_smoke_run_and_model(name):
    config = load_config(f"{CONFIGS[0].with_name(name + '.py')}:smoke").config
    for key, value in {**SMOKE_RUN, **SMOKE_MODEL}.items():
        section, field = key.split(".")
        assert config[section][field] == value, (name, key, config[section][field], value)


def test_remat_policy_is_a_config_change_with_the_same_losses(tmp_path):
    losses = {}
    for policy in ("none", "full"):
        resolved = load_config(
            f"{CONFIGS[0]}:smoke",
            [
                ("run_dir", str(tmp_path / policy)),
                ("data.cache_dir", str(tmp_path / "cache")),
                ("model.remat", policy),
                ("eval.num_batches", "0"),
                ("checkpoint.enabled", "false"),
            ],
        )
        losses[policy] = list(train(resolved).losses.values())
    np.testing.assert_allclose(losses["full"], losses["none"], rtol=1e-5, atol=1e-5)


def test_file_sources_give_one_tagged_eval_set_per_validation_file(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(6):
        (corpus / f"train{i}.txt").write_text(f"def f{i}(x):\n    return x * {i}\n" * 40)
    (corpus / "prose.jsonl").write_text(
        "\n".join('{"text": "%s"}' % ("the quick brown fox. " * 30) for _ in range(4)) + "\n"
    )
    (corpus / "code.txt").write_text("for i in range(10):\n    print(i)\n" * 40)
    resolved = load_config(
        f"{CONFIGS[0]}:smoke",
        [
            ("run_dir", str(tmp_path / "run")),
            ("data.cache_dir", str(tmp_path / "cache")),
            ("data.source", "files"),
            ("data.train_files", repr((str(corpus / "train*.txt"),))),
            (
                "data.validation_files",
                repr((str(corpus / "prose.jsonl"), str(corpus / "code.txt"))),
            ),
            ("checkpoint.enabled", "false"),
        ],
    )
    result = train(resolved)
    assert set(result.eval) == {"prose", "code"}
    assert all(ev["bpb"] > 0 for ev in result.eval.values())
