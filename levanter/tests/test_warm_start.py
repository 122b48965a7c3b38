"""Warm start from a checkpoint with another architecture, optimizer and batch size."""

import jax
import numpy as np
from _subprocess import DEFAULT

from meltemi.levanter.checkpoint import flatten_state, read_manifest, restore_arrays, step_dir
from meltemi.levanter.config import load_config
from meltemi.levanter.mesh import make_mesh
from meltemi.levanter.trainer import Trainer, build_parts


def _resolved(tmp_path, name, *extra):
    return load_config(
        f"{DEFAULT}:smoke",
        [
            ("run_dir", str(tmp_path / name)),
            ("data.cache_dir", str(tmp_path / "cache")),
            ("eval.num_batches", "0"),  # the test is about parameters, not evaluation
            *extra,
        ],
    )


def test_llama_checkpoint_warm_starts_a_qwen3_run(tmp_path):
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    llama = _resolved(tmp_path, "llama")
    Trainer(llama, build_parts(llama.config), mesh).run()
    source = step_dir(tmp_path / "llama" / "checkpoints", 2)

    qwen = _resolved(
        tmp_path,
        "qwen",
        ("model.preset", "tiny-qwen3"),
        ("checkpoint.init_from", str(source)),
        ("optimizer.learning_rate", "0.001"),
        ("trainer.train_batch_size", "2"),
    )
    trainer = Trainer(qwen, build_parts(qwen.config), mesh)
    state, start = trainer._restore_or_init(None)
    assert start == 0 and int(state.step) == 0

    report = (tmp_path / "qwen" / "warm_start.txt").read_text().splitlines()
    initialised = [ln for ln in report if ln.startswith("initialised")]
    assert initialised and all("norm" in ln for ln in initialised), report

    params = flatten_state({"params": state.params})
    saved = set(read_manifest(source)["arrays"])
    shared = {k: v for k, v in params.items() if k in saved}
    loaded = restore_arrays(source, shared)
    assert len(shared) == len(params) - len(initialised)
    for key, value in shared.items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(loaded[key]), err_msg=key)
    result = trainer.run()
    assert result.step == 2 and np.isfinite(list(result.losses.values())).all()
