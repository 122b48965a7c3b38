"""Checkpoint files: our streamed shards against the reference `safetensors` package."""

import gc
import json
import sys
import weakref

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from meltemi.models import SafetensorsError
from meltemi.models.hf import _safetensors
from meltemi.models.hf._safetensors import Checkpoint, PendingTensor, read_all, write_sharded

RNG = np.random.default_rng(0)
TENSORS = {
    "a.weight": RNG.standard_normal((3, 5)).astype(np.float32),
    "b.bias": RNG.standard_normal(7).astype(np.float16),
    "c.ids": RNG.integers(0, 9, (2, 3)).astype(np.int64),
    "d.empty": np.zeros((0, 4), np.float32),
    "e.bf16": (RNG.standard_normal((5, 3)) * 100).astype(ml_dtypes.bfloat16),
    "f.u16": RNG.integers(0, 60_000, (4,)).astype(np.uint16),
}


def _pending(tensors):
    return [PendingTensor(k, v.shape, v.dtype, lambda v=v: v.copy()) for k, v in tensors.items()]


def test_reference_library_reads_our_shards_bit_exactly(tmp_path):
    names = write_sharded(tmp_path, _pending(TENSORS), max_shard_bytes=64)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(TENSORS)
    assert sorted(set(index["weight_map"].values())) == names and len(names) > 1
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in TENSORS.values())
    back = {}
    for name in names:
        back.update(load_file(tmp_path / name))
    for k, v in TENSORS.items():
        assert back[k].dtype == v.dtype, k
        np.testing.assert_array_equal(back[k].view(np.uint8), v.view(np.uint8), err_msg=k)


def test_we_read_slices_of_the_reference_librarys_file(tmp_path):
    save_file(TENSORS, tmp_path / "model.safetensors")
    ckpt = Checkpoint(tmp_path)
    assert ckpt.tensors["e.bf16"].dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(
        ckpt.read("a.weight", (slice(1, 3), slice(2, 5))), TENSORS["a.weight"][1:3, 2:5]
    )
    for k, v in read_all(tmp_path).items():
        np.testing.assert_array_equal(v.view(np.uint8), TENSORS[k].view(np.uint8), err_msg=k)


def test_writing_holds_one_produced_tensor_at_a_time(tmp_path):
    alive, peak = set(), [0]

    def producer(i):
        def produce():
            array = np.full((64, 64), i, np.float32)
            alive.add(i)
            peak[0] = max(peak[0], len(alive))
            weakref.finalize(array, alive.discard, i)
            return array

        return produce

    tensors = [
        PendingTensor(f"t{i}", (64, 64), np.dtype(np.float32), producer(i)) for i in range(6)
    ]
    write_sharded(tmp_path, tensors, max_shard_bytes=3 * 64 * 64 * 4)
    gc.collect()
    assert peak[0] == 1 and not alive
    assert float(read_all(tmp_path)["t5"][0, 0]) == 5.0


def test_missing_shard_is_named(tmp_path):
    names = write_sharded(tmp_path, _pending(TENSORS), max_shard_bytes=64)
    (tmp_path / names[-1]).unlink()
    with pytest.raises(SafetensorsError, match=f"shard files \\['{names[-1]}'\\] are missing"):
        Checkpoint(tmp_path)


def test_corrupt_file_is_an_error_naming_it(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 8 + b"{}")
    with pytest.raises(SafetensorsError, match=r"model.safetensors: not a readable safetensors"):
        Checkpoint(tmp_path)


def _extremes(dtype):
    """Values that catch a sign, width or rounding slip: 0, 1, the largest, the smallest."""
    info = np.iinfo(dtype) if np.issubdtype(dtype, np.integer) else ml_dtypes.finfo(dtype)
    grid = RNG.standard_normal((4, 6)) * 3
    if np.issubdtype(dtype, np.integer):
        grid = RNG.integers(0, int(info.max), (4, 6), dtype=np.uint64, endpoint=True)
    out = np.asarray(grid).astype(dtype)
    out[0, :3] = np.array([0, 1, info.max], dtype=dtype)
    out[1, 0] = np.array(info.min, dtype=dtype)
    return out


EXTRA_DTYPES = {
    "F8_E4M3": ml_dtypes.float8_e4m3fn,
    "F8_E5M2": ml_dtypes.float8_e5m2,
    "F8_E4M3FNUZ": ml_dtypes.float8_e4m3fnuz,
    "F8_E5M2FNUZ": ml_dtypes.float8_e5m2fnuz,
    "F8_E8M0": ml_dtypes.float8_e8m0fnu,
    "U8": np.uint8,
    "U16": np.uint16,
    "U32": np.uint32,
    "U64": np.uint64,
}


def _header_dtypes(path):
    raw = path.read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    return {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}


@pytest.mark.parametrize("kind", sorted(EXTRA_DTYPES))
def test_float8_and_unsigned_files_of_the_reference_library_read_exactly(kind, tmp_path):
    value = _extremes(EXTRA_DTYPES[kind])
    save_file({"t": value}, tmp_path / "model.safetensors")
    assert _header_dtypes(tmp_path / "model.safetensors") == {"t": kind}
    ckpt = Checkpoint(tmp_path)
    assert ckpt.tensors["t"].dtype == value.dtype
    whole, part = ckpt.read("t"), ckpt.read("t", (slice(1, 3), slice(2, 5)))
    assert whole.dtype == part.dtype == value.dtype
    np.testing.assert_array_equal(whole.view(np.uint8), value.view(np.uint8))
    np.testing.assert_array_equal(part.view(np.uint8), value[1:3, 2:5].view(np.uint8))


def test_bool_file_of_the_reference_library_reads_exactly(tmp_path):
    value = RNG.random((5, 3)) > 0.5
    save_file({"m": value}, tmp_path / "model.safetensors")
    got = Checkpoint(tmp_path).read("m", (slice(1, 4),))
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, value[1:4])


def test_float8_next_to_other_dtypes_in_one_shard(tmp_path):
    # The float8 tensor is read by byte offset: an offset slip would read its neighbour.
    tensors = {**TENSORS, "g.f8": _extremes(ml_dtypes.float8_e4m3fn)}
    save_file(tensors, tmp_path / "model.safetensors")
    for k, v in read_all(tmp_path).items():
        np.testing.assert_array_equal(v.view(np.uint8), tensors[k].view(np.uint8), err_msg=k)


def test_our_float8_and_unsigned_shards_carry_the_format_names(tmp_path):
    tensors = {k: _extremes(v) for k, v in EXTRA_DTYPES.items()}
    names = write_sharded(tmp_path, _pending(tensors), max_shard_bytes=64)
    written = {}
    for name in names:
        written.update(_header_dtypes(tmp_path / name))
    assert written == {k: k for k in EXTRA_DTYPES}
    for k, v in read_all(tmp_path).items():
        np.testing.assert_array_equal(v.view(np.uint8), tensors[k].view(np.uint8), err_msg=k)


def test_unsupported_dtype_names_the_tensor_and_the_fix(tmp_path):
    save_file({"w": np.ones(3, np.complex64)}, tmp_path / "model.safetensors")
    with pytest.raises(SafetensorsError, match=r"tensor 'w' has dtype C64.*convert the checkpoint"):
        Checkpoint(tmp_path)


def test_directory_without_weights_is_an_error(tmp_path):
    with pytest.raises(SafetensorsError, match="neither model.safetensors.index.json"):
        Checkpoint(tmp_path)


def _rss_anon() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and madvise are Linux")
def test_load_buffers_are_aligned_populated_and_adopted_by_device_put():
    import jax

    from meltemi.models.hf import _host_memory

    small = _host_memory.empty((3, 5), np.float32)
    assert small.ctypes.data % 64 == 0 and small.shape == (3, 5)
    before = _rss_anon()
    big = _host_memory.empty((64, 1 << 16), ml_dtypes.bfloat16)  # 8 MiB, never written
    # Populated by the kernel in one call, not page by page as it is written.
    assert _rss_anon() - before >= 0.9 * big.nbytes
    assert big.ctypes.data % 4096 == 0 and big.flags.c_contiguous
    big[:] = 1
    on_device = jax.device_put(big, jax.devices("cpu")[0])
    assert on_device.unsafe_buffer_pointer() == big.ctypes.data  # adopted, not copied
    del big
    gc.collect()
    assert float(on_device[-1, -1]) == 1.0


@pytest.mark.parametrize("row", [None, 0, 6, 7, 12])
def test_first_difference_finds_the_first_differing_row_across_read_blocks(
    tmp_path, monkeypatch, row
):
    monkeypatch.setattr(_safetensors, "_COMPARE_BYTES", 3 * 5 * 4)  # blocks of 3 rows
    a = np.random.default_rng(0).standard_normal((13, 5)).astype(np.float32)
    b = a.copy()
    if row is not None:
        b[row, 4] = np.nan if row == 12 else b[row, 4] + 1  # NaN differs, as in array_equal
        b[min(row + 4, 12), 0] += 1  # a later difference must not be the one reported
    save_file({"a": a, "b": b}, tmp_path / "model.safetensors")
    ckpt = Checkpoint(tmp_path)
    rows = ckpt.read_rows("a", 2, 13)  # the scratch of read_rows stays valid meanwhile
    differing = [] if row is None else [row, min(row + 4, 12)]
    assert ckpt.first_difference("b", rows, 2) == min(
        [r for r in differing if r >= 2], default=None
    )
    np.testing.assert_array_equal(rows, a[2:])
    assert ckpt.first_difference("b", a[:2], 0) == min(
        [r for r in differing if r < 2], default=None
    )
