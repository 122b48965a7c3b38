"""Checkpoints: round trip, retention, torn/corrupt detection, restore onto another mesh."""

import hashlib
import json
import os
import shutil
import time

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
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
from meltemi.levanter.checkpoint._checksum import checksums, fetch  # noqa: E402


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


def test_a_flipped_bit_in_an_array_file_is_detected_and_previous_used(tmp_path):
    # Random floats are stored as-is by the compressor, so the flip silently changes a value:
    # no size changes and orbax reads it without complaint; only the checksum can tell.
    def state(seed):
        return {"w": jax.random.normal(jax.random.key(seed), (256, 257))}

    ckpt = Checkpointer(tmp_path)
    for step, kind in ((2, "permanent"), (3, "temporary")):
        ckpt.save(step, state(step), config_json="{}", kind=kind)
    ckpt.wait()
    manifest = read_manifest(step_dir(tmp_path, 3))
    name = max(manifest["files"], key=lambda n: manifest["files"][n]["size"])
    assert "/d/" in name  # the OCDBT data file holding the array
    path = step_dir(tmp_path, 3) / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.warns(
        CorruptCheckpointWarning, match=r"step 3: .*array w does not match its checksum"
    ):
        step, restored = ckpt.restore(state(0))
    assert step == 2
    np.testing.assert_array_equal(restored["w"], state(2)["w"])


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
    now = [100.0]
    ckpt = Checkpointer(tmp_path, RetentionPolicy(save_every_minutes=5.0), clock=lambda: now[0])
    now[0] += 5 * 60 - 1
    assert ckpt.due(7) is None
    now[0] += 1
    assert ckpt.due(7) == "temporary"


def test_synchronous_save_round_trips(tmp_path):
    ckpt = Checkpointer(tmp_path, async_save=False)
    _save_steps(ckpt, [1, 2])
    step, state = ckpt.restore(_state(0))
    assert step == 2 and ckpt.complete_steps() == [2]
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(_state(2)), strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    ckpt.close()


class _FullDisk:
    """An orbax checkpointer whose writes fail from the `fail_from`-th save on (ENOSPC)."""

    def __init__(self, fail_from, *, in_background):
        self.inner = ocp.AsyncCheckpointer(ocp.CompositeCheckpointHandler())
        self.fail_from, self.in_background, self.saves = fail_from, in_background, 0
        self.failing = False

    def save(self, directory, args):
        self.saves += 1
        self.failing = self.saves >= self.fail_from
        if self.failing and not self.in_background:
            raise OSError(28, "No space left on device", str(directory))
        self.inner.save(directory, args=args)

    def wait_until_finished(self):
        self.inner.wait_until_finished()
        if self.failing:
            raise OSError(28, "No space left on device")

    def restore(self, directory, args):
        return self.inner.restore(directory, args=args)

    def close(self):
        self.inner.close()


@pytest.mark.parametrize("in_background", [False, True])
def test_a_failing_save_is_one_error_at_its_step_and_keeps_the_previous(tmp_path, in_background):
    ckpt = Checkpointer(
        tmp_path, orbax_checkpointer=_FullDisk(fail_from=2, in_background=in_background)
    )
    _save_steps(ckpt, [2])
    message = r"^saving the checkpoint of step 4 .* failed: OSError: .*No space left on device.*"
    message += r"step 2 is the latest checkpoint"
    with pytest.raises(CheckpointError, match=message) as info:
        ckpt.save(4, _state(4), config_json="{}")
        for _ in range(400):  # a background failure surfaces at a following step's check
            ckpt.due(5)
            time.sleep(0.05)
    assert "\n" not in str(info.value)
    assert ckpt.all_steps() == [2]  # the partial step 4 is gone, step 2 kept
    assert not list(tmp_path.glob("*tmp*"))
    step, state = ckpt.restore(_state(0))
    assert step == 2 and float(state["params"]["b"][0]) == 2.0
    ckpt.close()


def test_an_unwritable_checkpoint_directory_is_one_error(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(CheckpointError, match=r"cannot create the checkpoint directory .*file/c"):
        Checkpointer(tmp_path / "file" / "c")


class _Broadcast:
    """Two "processes" deciding in turn: process 1's n-th call gets process 0's n-th flag."""

    def __init__(self):
        self.sent, self.read = [], 0

    def agree(self, process):
        def agree(flag):
            if process == 0:
                self.sent.append(flag)
                return flag
            self.read += 1
            return self.sent[self.read - 1]

        return agree


def test_time_based_saves_follow_process_0_clock_on_every_process(tmp_path):
    policy = RetentionPolicy(save_every_minutes=1.0)
    now = [0.0]
    broadcast = _Broadcast()
    # Process 1's clock runs 30% fast (drift; a constant offset would cancel out).
    clocks = (lambda: now[0], lambda: 1.3 * now[0])
    ckpts = [
        Checkpointer(tmp_path / str(i), policy, clock=clocks[i], agree=broadcast.agree(i))
        for i in (0, 1)
    ]
    decisions, own_clock = [], []
    for step in range(1, 13):
        now[0] += 10.0
        kinds = [c.due(step) for c in ckpts]
        decisions.append(kinds)
        own_clock.append([clocks[i]() - ckpts[i]._last_save_time >= 60 for i in (0, 1)])
        if kinds[0]:
            for c in ckpts:
                c._last_save_time = c._clock()  # what `save` records
    assert all(a == b for a, b in decisions)  # both processes take the same decision
    assert [s for s, (k, _) in enumerate(decisions, 1) if k] == [6, 12]  # process 0's minutes
    assert any(a != b for a, b in own_clock)  # their own clocks would have disagreed


def _numpy_checksum(x):
    """The checksum's formula, in numpy: sum of 32-bit words times odd position weights."""
    x = np.ascontiguousarray(np.asarray(x)).ravel()
    if x.dtype == np.bool_:
        words = x.astype(np.uint64)
    else:
        unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint32}[x.dtype.itemsize]
        words = x.view(unsigned).astype(np.uint64)
    i = np.arange(words.size, dtype=np.uint64)
    weights = ((i * 2654435761) % 2**32 * 2 + 1) % 2**32
    return int(np.sum((words * weights) % 2**32) % 2**32)


@pytest.mark.parametrize(
    "array",
    [
        jnp.linspace(-3.0, 5.0, 77).reshape(7, 11),
        jnp.arange(13, dtype=jnp.int32) - 6,
        jnp.linspace(0.0, 1.0, 9, dtype=jnp.bfloat16),
        jnp.array([True, False, True]),
    ],
)
def test_array_checksum_matches_its_formula(array):
    assert fetch(checksums({"a": array}))["a"] == _numpy_checksum(array)


def test_array_checksum_is_the_same_on_any_sharding_and_sees_a_swap():
    x = jnp.arange(24.0).reshape(8, 3)
    mesh = jax.make_mesh((8,), ("fsdp",))
    sharded = jax.device_put(x, NamedSharding(mesh, PartitionSpec("fsdp")))
    swapped = x.at[0, 0].set(x[0, 1]).at[0, 1].set(x[0, 0])
    got = fetch(checksums({"x": x, "sharded": sharded, "swapped": swapped}))
    assert got["x"] == got["sharded"] != got["swapped"]


def test_save_and_restore_hash_no_file(tmp_path, monkeypatch):
    ckpt = Checkpointer(tmp_path)
    _save_steps(ckpt, [1])

    def no_file_hashing(*args, **kwargs):
        raise AssertionError("a file was hashed")

    monkeypatch.setattr(hashlib, "sha256", no_file_hashing)
    _save_steps(ckpt, [2])
    step, _ = ckpt.restore(_state(0))
    manifest = read_manifest(step_dir(tmp_path, 2))
    assert step == 2 and all(set(e) == {"size"} for e in manifest["files"].values())
    assert manifest["arrays"]["params.w"]["checksum"] == _numpy_checksum(_state(2)["params"]["w"])


def test_an_array_that_differs_from_its_checksum_falls_back(tmp_path):
    ckpt = Checkpointer(tmp_path)
    _save_steps(ckpt, [2, 3], kinds={2: "permanent"})
    path = step_dir(tmp_path, 3) / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["arrays"]["params.b"]["checksum"] ^= 1
    path.write_text(json.dumps(manifest))
    with pytest.warns(
        CorruptCheckpointWarning, match=r"array params.b does not match its checksum"
    ):
        step, _ = ckpt.restore(_state(0))
    assert step == 2


def test_an_unknown_verify_mode_is_an_error(tmp_path):
    with pytest.raises(CheckpointError, match=r"checkpoint.verify='md5' is not one of"):
        Checkpointer(tmp_path, verify="md5")


def test_a_real_write_failure_prints_no_orbax_traceback(tmp_path, capfd):
    root = tmp_path / "ckpt"
    ckpt = Checkpointer(root)
    _save_steps(ckpt, [2])
    shutil.rmtree(root)
    root.write_text("a file where the checkpoint directory was (a lost mount, say)")
    with pytest.raises(CheckpointError, match=r"^saving the checkpoint of step 4 .*Not a direct"):
        ckpt.save(4, _state(4), config_json="{}")
        ckpt.wait()
    assert "Traceback" not in capfd.readouterr().err
