"""Our safetensors reader/writer against the reference `safetensors` library."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from meltemi.models import SafetensorsError
from meltemi.models._safetensors import read_file, read_sharded, write_file, write_sharded

RNG = np.random.default_rng(0)
TENSORS = {
    "a.weight": RNG.standard_normal((3, 5)).astype(np.float32),
    "b.bias": RNG.standard_normal(7).astype(np.float16),
    "c.ids": RNG.integers(0, 9, (2, 3)).astype(np.int64),
    "d.empty": np.zeros((0, 4), np.float32),
}


def test_reference_library_reads_our_file(tmp_path):
    write_file(tmp_path / "x.safetensors", TENSORS, {"format": "pt"})
    back = load_file(tmp_path / "x.safetensors")
    for k, v in TENSORS.items():
        np.testing.assert_array_equal(back[k], v)


def test_we_read_the_reference_librarys_file(tmp_path):
    save_file(TENSORS, tmp_path / "y.safetensors")
    back = read_file(tmp_path / "y.safetensors")
    for k, v in TENSORS.items():
        assert back[k].dtype == v.dtype
        np.testing.assert_array_equal(back[k], v)


def test_bfloat16_round_trips_bit_exactly(tmp_path):
    x = (RNG.standard_normal((5, 3)) * 100).astype(jnp.bfloat16)
    write_file(tmp_path / "z.safetensors", {"x": x})
    back = read_file(tmp_path / "z.safetensors")["x"]
    assert back.dtype == jnp.bfloat16
    np.testing.assert_array_equal(back.view(np.uint16), x.view(np.uint16))


def test_sharded_write_splits_by_size_and_indexes_every_tensor(tmp_path):
    names = write_sharded(tmp_path, TENSORS, max_shard_bytes=64)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(TENSORS)
    assert sorted(set(index["weight_map"].values())) == names and len(names) > 1
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in TENSORS.values())
    back = read_sharded(tmp_path)
    for k, v in TENSORS.items():
        np.testing.assert_array_equal(back[k], v)


def test_missing_shard_is_named(tmp_path):
    names = write_sharded(tmp_path, TENSORS, max_shard_bytes=64)
    (tmp_path / names[-1]).unlink()
    with pytest.raises(SafetensorsError, match=f"shard files \\['{names[-1]}'\\] are missing"):
        read_sharded(tmp_path)


def test_truncated_header_is_an_error(tmp_path):
    (tmp_path / "bad.safetensors").write_bytes(b"\xff" * 8 + b"{}")
    with pytest.raises(SafetensorsError, match="exceeds the file size"):
        read_file(tmp_path / "bad.safetensors")


def test_directory_without_weights_is_an_error(tmp_path):
    with pytest.raises(SafetensorsError, match="neither model.safetensors.index.json"):
        read_sharded(tmp_path)
