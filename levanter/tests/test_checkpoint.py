"""Checkpoints: round trip, retention, torn/corrupt detection, restore onto another mesh."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

from meltemi.levanter.checkpoint import (  # noqa: E402
    MANIFEST,
    Checkpointer,
    CheckpointError,
    CorruptCheckpointWarning,
    RetentionPolicy,
    read_manifest,
    restore_arrays,
    step_dir,
)


def _state(seed: float):
    return {
        "params": {"w": jnp.arange(15.0).reshape(5, 3) + seed, "b": jnp.ones(7) * seed},
        "step": jnp.int32(seed),
    }


def _save_steps(ckpt, steps, kinds=None):
    for step in steps:
        ckpt.save(
            step,
            _state(step),
            config_json='{"name": "t"}',
            kind=(kinds or {}).get(step, "temporary"),
        )
    ckpt.wait()


def test_round_trip_is_bit_exact(tmp_path):
    ckpt = Checkpointer(tmp_path)
    _save_steps(ckpt, [3])
    step, state = ckpt.restore(_state(0))
    assert step == 3
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(_state(3))):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_only_the_newest_temporary_survives(tmp_path):
    ckpt = Checkpointer(tmp_path)
    _save_steps(ckpt, [1, 2, 3])
    assert ckpt.complete_steps() == [3]


def test_permanent_and_final_checkpoints_are_kept(tmp_path):
    ckpt = Checkpointer(tmp_path)
    _save_steps(ckpt, [1, 2, 3, 4, 5], kinds={2: "permanent", 4: "final"})
    assert ckpt.complete_steps() == [2, 4, 5]


def test_retention_policy_marks_every_kth_step_permanent():
    policy = RetentionPolicy(save_every_steps=3, keep_every_steps=4)
    assert [policy.kind(s) for s in range(1, 9)] == [
        None,
        None,
        "temporary",
        "permanent",
        None,
        "temporary",
        None,
        "permanent",
    ]


def test_torn_checkpoint_is_skipped_with_a_warning(tmp_path):
    ckpt = Checkpointer(tmp_path)
    _save_steps(ckpt, [2, 3], kinds={2: "permanent"})
    (step_dir(tmp_path, 3) / MANIFEST).unlink()
    with pytest.warns(CorruptCheckpointWarning, match=r"step 3.*did not complete"):
        step, state = ckpt.restore(_state(0))
    assert step == 2 and float(state["params"]["b"][0]) == 2.0


def test_corrupt_file_is_detected_and_previous_used(tmp_path):
    ckpt = Checkpointer(tmp_path)
    _save_steps(ckpt, [2, 3], kinds={2: "permanent"})
    manifest = read_manifest(step_dir(tmp_path, 3))
    name = max(manifest["files"], key=lambda n: manifest["files"][n]["size"])
    path = step_dir(tmp_path, 3) / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.warns(CorruptCheckpointWarning, match=r"SHA-256"):
        step, _ = ckpt.restore(_state(0))
    assert step == 2


def test_no_checkpoint_is_an_error(tmp_path):
    with pytest.raises(CheckpointError, match=r"no checkpoint under"):
        Checkpointer(tmp_path).restore(_state(0))


def test_changed_state_structure_points_to_warm_start(tmp_path):
    ckpt = Checkpointer(tmp_path)
    _save_steps(ckpt, [1])
    other = {"params": {"w": jnp.zeros((5, 3))}, "step": jnp.int32(0)}
    with pytest.raises(
        CheckpointError, match=r"missing \[\], unexpected \['params.b'\].*init_from"
    ):
        ckpt.restore(other)


def test_restore_onto_a_sharded_mesh(tmp_path):
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, {"w": jnp.arange(24.0).reshape(8, 3)}, config_json="{}")
    ckpt.wait()
    mesh = jax.make_mesh((8,), ("fsdp",))
    sharding = NamedSharding(mesh, PartitionSpec("fsdp"))
    template = {"w": jax.ShapeDtypeStruct((8, 3), jnp.float32, sharding=sharding)}
    _, state = ckpt.restore(template)
    assert state["w"].sharding == sharding
    np.testing.assert_array_equal(state["w"], np.arange(24.0).reshape(8, 3))


def test_restore_arrays_returns_only_names_present(tmp_path):
    ckpt = Checkpointer(tmp_path)
    _save_steps(ckpt, [1])
    wanted = {"params.w": jnp.zeros((5, 3)), "params.q_norm": jnp.zeros(3)}
    got = restore_arrays(step_dir(tmp_path, 1), wanted)
    assert set(got) == {"params.w"}
    np.testing.assert_array_equal(got["params.w"], _state(1)["params"]["w"])


def test_saved_config_is_readable(tmp_path):
    ckpt = Checkpointer(tmp_path)
    _save_steps(ckpt, [1])
    assert ckpt.read_config(1) == {"name": "t"}


def test_checkpoint_is_due_by_minutes(tmp_path):
    ckpt = Checkpointer(tmp_path, RetentionPolicy(save_every_minutes=5.0))
    assert ckpt.due(7) is None
    ckpt._last_save_time -= 5 * 60 + 1
    assert ckpt.due(7) == "temporary"
