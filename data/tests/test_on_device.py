"""The jitted Feistel twin equals the numpy permutation; device prefetch puts batches on device."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meltemi.data.on_device import device_prefetch, feistel_jax
from meltemi.data.permutation import FeistelPermutation


@pytest.mark.parametrize("n", [1, 2, 3, 5, 97, 4096, 65_537, 1_000_003, 2**31 + 11, 2**32])
def test_jax_twin_matches_numpy(n):
    perm = FeistelPermutation(n, seed=n % 1000)
    x = np.unique(np.concatenate([np.arange(min(n, 3001)), np.linspace(0, n - 1, 2001)]))
    x = x.astype(np.int64)
    got = np.asarray(feistel_jax(perm)(jnp.asarray(x, jnp.uint32))).astype(np.int64)
    assert np.array_equal(got, perm(x))


def test_jax_inverse_matches_numpy():
    perm = FeistelPermutation(70_001, seed=3)
    y = np.arange(0, 70_001, 7)
    got = np.asarray(feistel_jax(perm, inverse=True)(jnp.asarray(y, jnp.uint32)))
    assert np.array_equal(got.astype(np.int64), perm.inverse(y))


def test_jax_twin_does_not_recompile_for_new_indices():
    perm = FeistelPermutation(1234, seed=1)
    f = feistel_jax(perm)
    f(jnp.arange(17, dtype=jnp.uint32))
    before = f._cache_size()
    f(jnp.arange(19, dtype=jnp.uint32))  # a new shape compiles: the counter sees growth
    assert f._cache_size() == before + 1
    f(jnp.arange(17, 34, dtype=jnp.uint32))  # new values, known shapes: no compilation
    f(jnp.arange(40, 59, dtype=jnp.uint32))
    assert f._cache_size() == before + 1
    assert feistel_jax(FeistelPermutation(1234, seed=1)) is f  # one jitted twin per mapping


def test_jax_twin_refuses_lengths_beyond_uint32():
    with pytest.raises(ValueError, match=r"length 4294967297 exceeds 2\*\*32"):
        feistel_jax(FeistelPermutation(2**32 + 1, seed=0))


def test_device_prefetch_yields_device_arrays_in_order():
    got = list(device_prefetch(lambda s: {"x": np.full((3,), s, np.int32)}, range(5), depth=2))
    assert [s for s, _ in got] == [0, 1, 2, 3, 4]
    assert all(isinstance(b["x"], jax.Array) for _, b in got)
    assert got[3][1]["x"].tolist() == [3, 3, 3]


def test_jax_twin_handles_several_padded_chunks_and_shapes():
    perm = FeistelPermutation(1_000_003, seed=4)
    x = np.arange(2 * 16384 + 7, dtype=np.int64) * 29
    got = np.asarray(feistel_jax(perm)(jnp.asarray(x, jnp.uint32)))
    assert np.array_equal(got.astype(np.int64), perm(x))
    grid = np.arange(21, dtype=np.int64).reshape(3, 7)
    assert np.asarray(feistel_jax(perm)(jnp.asarray(grid, jnp.uint32))).shape == (3, 7)
    assert feistel_jax(perm)(jnp.zeros((0,), jnp.uint32)).shape == (0,)
