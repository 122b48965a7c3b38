"""FSDP, tensor parallelism and multislice layouts are a config change: same losses (1e-5).

Eight fake CPU devices; the real model (tiny Llama) on the real data for 5 steps.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from _subprocess import DEFAULT  # noqa: E402

from meltemi.levanter.config import load_config  # noqa: E402
from meltemi.levanter.mesh import make_mesh  # noqa: E402
from meltemi.levanter.trainer import Trainer, build_parts  # noqa: E402

STEPS = 5
LAYOUTS = {
    "data_parallel": ({"data": 8}, {}, 1),
    "fsdp": ({"data": 1, "fsdp": 8}, {}, 1),
    "fsdp_x_tensor": ({"data": 1, "fsdp": 4, "tensor": 2}, {}, 1),
    "two_slices_dcn": ({"data": 1, "fsdp": 4}, {"data": 2}, 2),
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("parallel")
    resolved = load_config(
        f"{DEFAULT}:smoke",
        [
            ("run_dir", str(root / "reference")),
            ("data.cache_dir", str(root / "cache")),
            ("trainer.num_train_steps", str(STEPS)),
            ("trainer.train_batch_size", "8"),
            ("eval.num_batches", "0"),
        ],
    )
    parts = build_parts(resolved.config)
    one = make_mesh({"data": 1}, devices=jax.devices()[:1])
    reference = Trainer(resolved, parts, one).run()
    return root, resolved, parts, reference


def _with(resolved, run_dir, checkpoints=True):
    config = resolved.config.copy_and_resolve_references()
    config.run_dir = str(run_dir)
    config.checkpoint.enabled = checkpoints
    return type(resolved)(config, resolved.provenance, resolved.spec)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layout_gives_the_single_device_losses(setup, layout):
    root, resolved, parts, reference = setup
    ici, dcn, slices = LAYOUTS[layout]
    mesh = make_mesh(ici, dcn, num_slices=slices)
    result = Trainer(_with(resolved, root / layout, checkpoints=False), parts, mesh).run()
    steps = sorted(reference.losses)
    np.testing.assert_allclose(
        [result.losses[s] for s in steps],
        [reference.losses[s] for s in steps],
        rtol=1e-5,
        atol=1e-5,
    )


def test_checkpoint_restores_onto_a_different_mesh(setup):
    root, resolved, parts, reference = setup
    run = _with(resolved, root / "remesh")
    one = make_mesh({"data": 1}, devices=jax.devices()[:1])
    Trainer(run, parts, one).run(stop_after=3)
    resumed = Trainer(run, parts, make_mesh({"data": 1, "fsdp": 8})).run()
    assert resumed.start_step == 3
    np.testing.assert_allclose(
        [resumed.losses[s] for s in (4, 5)],
        [reference.losses[s] for s in (4, 5)],
        rtol=1e-5,
        atol=1e-5,
    )


def test_expert_parallelism_gives_the_single_device_losses(setup):
    root, resolved, _, _ = setup
    config = resolved.config.copy_and_resolve_references()
    config.model.preset = "tiny-mixtral"
    config.model.num_experts = 4
    config.checkpoint.enabled = False
    losses = {}
    for name, mesh in (
        ("one", make_mesh({"data": 1}, devices=jax.devices()[:1])),
        ("expert", make_mesh({"data": 1, "fsdp": 2, "expert": 4})),
    ):
        config.run_dir = str(root / f"moe-{name}")
        run = type(resolved)(config, resolved.provenance, resolved.spec)
        losses[name] = Trainer(run, build_parts(config), mesh).run().losses
    steps = sorted(losses["one"])
    np.testing.assert_allclose(
        [losses["expert"][s] for s in steps],
        [losses["one"][s] for s in steps],
        rtol=1e-5,
        atol=1e-5,
    )
