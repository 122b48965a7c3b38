"""`hf.load` with a mesh: each parameter gets its NamedSharding; each tensor is read once."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import model_testing as T  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

import meltemi.haliax as hax  # noqa: E402
import meltemi.models as mm  # noqa: E402
from meltemi.haliax import partitioning  # noqa: E402
from meltemi.models import hf  # noqa: E402
from meltemi.models.hf import _safetensors  # noqa: E402

MESH = {"data": 2, "model": 4}
CASES = {
    # head_size is the innermost of the flattened q/k/v rows: exercises a strided slice.
    "tiny-llama": {"embed": "data", "mlp": "model", "head_size": "data"},
    # stacked experts (layers x experts lead axes), expert weights split by expert.
    "tiny-mixtral": {"embed": "data", "experts": "model"},
    # GPT-2: Conv1D [in, out] layout and the fused c_attn.
    "tiny-gpt2": {"embed": "data", "mlp": "model"},
}


def _config(name):
    cfg = mm.get_preset(name)
    return cfg.replace(moe=cfg.moe.replace(num_experts=4)) if cfg.moe else cfg


@pytest.fixture(scope="module")
def mesh():
    return partitioning.make_mesh(MESH)


@pytest.mark.parametrize("name", sorted(CASES))
def test_sharded_load_gives_each_parameter_its_sharding_and_the_exact_values(name, mesh, tmp_path):
    mapping = CASES[name]
    hf.save(T.random_model(_config(name), seed=4), None, tmp_path)
    whole, _ = hf.load(tmp_path)
    sharded, _ = hf.load(tmp_path, mesh=mesh, axis_mapping=mapping)
    leaves = jax.tree.leaves(sharded, is_leaf=hax.is_named_array)
    expected = jax.tree.leaves(whole, is_leaf=hax.is_named_array)
    split = 0
    for got, want in zip(leaves, expected, strict=True):
        spec = partitioning.pspec_for_axis(got.axes, mapping, mesh)
        assert got.array.sharding == NamedSharding(mesh, spec), [a.name for a in got.axes]
        split += any(p is not None for p in spec)
        np.testing.assert_array_equal(np.asarray(got.array), np.asarray(want.array))
    assert split >= 4  # the mapping really shards several parameters


def test_sharded_load_follows_the_active_mesh_and_mapping(mesh, tmp_path):
    mapping = CASES["tiny-mixtral"]
    hf.save(T.random_model(_config("tiny-mixtral"), seed=4), None, tmp_path)
    with jax.set_mesh(mesh), hax.axis_mapping(mapping):
        model, _ = hf.load(tmp_path)
    gate = model.blocks.stacked.mlp.gate_proj
    assert gate.array.sharding.spec == partitioning.pspec_for_axis(gate.axes, mapping, mesh)
    assert "model" in tuple(gate.array.sharding.spec)


@pytest.mark.parametrize("name", ["tiny-mixtral", "tiny-gpt2"])
def test_each_tensor_is_read_once_for_all_devices_into_their_own_buffers(
    name, mesh, tmp_path, monkeypatch
):
    # GPT-2's fused `c_attn` fills three parameters from one tensor, still read once.
    mapping = {"embed": "data", "experts": "model", "mlp": "model"}
    hf.save(T.random_model(_config(name), seed=4), None, tmp_path)
    names = list(_safetensors.Checkpoint(tmp_path))
    reads = []
    original = _safetensors.Checkpoint.read_rows

    def counting(self, name, start=0, stop=None):
        reads.append(name)
        assert (start, stop) == (0, self.tensors[name].shape[0]), name  # one process: all rows
        return original(self, name, start, stop)

    monkeypatch.setattr(_safetensors.Checkpoint, "read_rows", counting)
    model, _ = hf.load(tmp_path, mesh=mesh, axis_mapping=mapping)
    # Eight devices hold pieces of every expert matrix, yet each tensor is read exactly once.
    assert sorted(reads) == sorted(names)
    # A piece replicated over `model` (norms: embed split over `data` only) is a separate
    # buffer on each device, so donating one device's buffer cannot clobber another's.
    norm = model.blocks.stacked.attn_norm.weight.array
    pointers = [s.data.unsafe_buffer_pointer() for s in norm.addressable_shards]
    assert len(set(pointers)) == len(pointers) == 8


def test_save_of_a_sharded_model_round_trips(mesh, tmp_path):
    mapping = CASES["tiny-mixtral"]
    hf.save(T.random_model(_config("tiny-mixtral"), seed=4), None, tmp_path / "a")
    sharded, _ = hf.load(tmp_path / "a", mesh=mesh, axis_mapping=mapping)
    hf.save(sharded, None, tmp_path / "b", max_shard_bytes=20_000)
    first, second = _safetensors.read_all(tmp_path / "a"), _safetensors.read_all(tmp_path / "b")
    assert sorted(first) == sorted(second)
    for k in first:
        np.testing.assert_array_equal(first[k], second[k], err_msg=k)


F8 = np.dtype(ml_dtypes.float8_e4m3fn)
EMBED_KEY = "model.embed_tokens.weight"


def _as_float8_file(directory, keys):
    """Rewrites a saved checkpoint as one `model.safetensors` written by the `safetensors`
    package itself, with the tensors `keys` in F8_E4M3 (`None`: all of them)."""
    tensors = _safetensors.read_all(directory)
    for name in list(directory.glob("*.safetensors")) + [directory / _safetensors.INDEX_NAME]:
        name.unlink()
    tensors = {k: v.astype(F8) if keys is None or k in keys else v for k, v in tensors.items()}
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    return tensors


def test_float8_checkpoint_is_upcast_to_the_requested_dtype_or_kept(tmp_path):
    hf.save(T.random_model(mm.get_preset("tiny-llama"), seed=4), None, tmp_path)
    original, _ = hf.load(tmp_path)
    _as_float8_file(tmp_path, None)
    upcast, _ = hf.load(tmp_path, dtype=jnp.float32)
    kept, _ = hf.load(tmp_path)
    trio = [jax.tree.leaves(m, is_leaf=hax.is_named_array) for m in (original, upcast, kept)]
    changed = 0
    for want, up, f8 in zip(*trio, strict=True):
        quantised = np.asarray(want.array).astype(F8)
        assert up.array.dtype == jnp.float32 and f8.array.dtype == F8
        np.testing.assert_array_equal(np.asarray(up.array), quantised.astype(np.float32))
        np.testing.assert_array_equal(np.asarray(f8.array).view(np.uint8), quantised.view(np.uint8))
        changed += not np.array_equal(quantised.astype(np.float32), np.asarray(want.array))
    assert changed  # the values really went through float8


def test_sharded_load_of_a_float8_tensor(mesh, tmp_path):
    mapping = CASES["tiny-llama"]
    hf.save(T.random_model(_config("tiny-llama"), seed=4), None, tmp_path)
    whole, _ = hf.load(tmp_path)
    tensors = _as_float8_file(tmp_path, {EMBED_KEY})
    for dtype in (None, jnp.float32):
        model, _ = hf.load(tmp_path, mesh=mesh, axis_mapping=mapping, dtype=dtype)
        embed = model.embed.weight
        assert embed.array.dtype == (F8 if dtype is None else np.float32)
        spec = partitioning.pspec_for_axis(embed.axes, mapping, mesh)
        assert embed.array.sharding == NamedSharding(mesh, spec) and "data" in tuple(spec)
        np.testing.assert_array_equal(
            np.asarray(embed.array.astype(jnp.float32)), tensors[EMBED_KEY].astype(np.float32)
        )
        # The other tensors are read as they were.
        np.testing.assert_array_equal(
            np.asarray(model.final_norm.weight.array), np.asarray(whole.final_norm.weight.array)
        )
