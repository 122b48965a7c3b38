"""Hugging Face checkpoints in the trainer: `--export_hf=DIR` and `model.init_from_hf=DIR`."""

import _subprocess
import equinox as eqx
import jax
import numpy as np
import pytest
from _subprocess import DEFAULT

import meltemi.models as mm
from meltemi.levanter.config import ConfigError, InertKeyError, load_config, resolve
from meltemi.levanter.mesh import make_mesh
from meltemi.levanter.trainer import Trainer


def _spec(root, name, *extra):
    return resolve(
        load_config(
            f"{DEFAULT}:smoke",
            [
                ("run_dir", str(root / name)),
                ("data.cache_dir", str(root / "cache")),
                ("eval.num_batches", "0"),
                *extra,
            ],
        )
    )


def _leaves(params):
    return [np.asarray(x) for x in jax.tree.leaves(eqx.filter(params, eqx.is_array))]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    trainer = Trainer(_spec(root, "run"), mesh=mesh)
    trainer.run()
    trainer.export_hf(root / "export")
    return root, trainer


def test_export_writes_the_trained_parameters_as_a_hf_checkpoint(exported):
    root, trainer = exported
    model, config = mm.hf.load(root / "export")
    assert config == trainer.spec.model
    for ours, theirs in zip(_leaves(trainer.state.params), _leaves(model), strict=True):
        np.testing.assert_array_equal(ours, theirs)


def test_init_from_hf_starts_from_the_checkpoints_weights(exported):
    root, trainer = exported
    spec = _spec(root, "from_hf", ("model.init_from_hf", str(root / "export")))
    assert spec.model == trainer.spec.model
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    state, start = Trainer(spec, mesh=mesh)._restore_or_init(None)
    assert start == 0 and int(state.step) == 0
    for ours, theirs in zip(_leaves(state.params), _leaves(trainer.state.params), strict=True):
        np.testing.assert_array_equal(ours, theirs)


def test_init_from_hf_needs_a_checkpoint_directory(tmp_path):
    with pytest.raises(ConfigError, match=r"model.init_from_hf=.*no config.json"):
        _spec(tmp_path, "run", ("model.init_from_hf", str(tmp_path)))


def test_a_preset_is_inert_beside_init_from_hf(exported):
    root, _ = exported
    with pytest.raises(InertKeyError, match=r"model.preset='tiny-qwen3' has no effect with"):
        _spec(
            root,
            "run",
            ("model.init_from_hf", str(root / "export")),
            ("model.preset", "tiny-qwen3"),
        )


def test_the_binary_exports_after_training(tmp_path):
    proc = _subprocess.run(
        tmp_path / "run",
        tmp_path / "cache",
        "--config.eval.num_batches=0",
        f"--export_hf={tmp_path / 'export'}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"Hugging Face export: {tmp_path / 'export'}" in proc.stdout
    assert (tmp_path / "export" / "config.json").is_file()
    assert list((tmp_path / "export").glob("*.safetensors"))


def test_a_preset_that_describes_the_checkpoint_may_stay_beside_init_from_hf(tmp_path):
    # A config that plans with a preset (`--dry_run`, no checkpoint present) trains from the
    # checkpoint with a flag when the preset is its architecture (marin_8b_instruct.py).
    from meltemi.levanter.config import ResolvedConfig, apply_overrides, base_config

    config = mm.get_preset("tiny-qwen3").replace(vocab_size=259)
    mm.hf.save(mm.init(config, key=jax.random.key(0)), None, tmp_path / "qwen3")
    provenance = {"model.preset": "file", "model.init_from_hf": "flag"}
    for preset, ok in (("tiny-qwen3", True), ("tiny-llama", False)):
        c = apply_overrides(
            base_config(), {"model.preset": preset, "model.init_from_hf": str(tmp_path / "qwen3")}
        )
        if ok:
            assert resolve(ResolvedConfig(c, provenance)).model.family == "qwen3"
        else:
            with pytest.raises(InertKeyError, match=r"model.preset='tiny-llama' has no effect"):
                resolve(ResolvedConfig(c, provenance))
