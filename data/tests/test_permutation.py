"""Exact bijection and inverse checks for every permutation, plus argument errors."""

from __future__ import annotations

import numpy as np
import pytest

from meltemi.data.permutation import (
    BlockShuffle,
    EraShuffle,
    FeistelPermutation,
    LinearPermutation,
)


def _assert_bijection(perm, n: int) -> None:
    x = np.arange(n)
    y = perm(x)
    assert y.dtype == np.int64
    assert np.array_equal(np.sort(y), x), f"{perm} is not a bijection of [0, {n})"
    assert np.array_equal(perm.inverse(y), x), f"{perm}.inverse is wrong"


def test_feistel_is_a_bijection_for_every_length_up_to_5000():
    x = np.arange(5000)
    for n in range(1, 5001):
        y = FeistelPermutation(n, seed=n).__call__(x[:n])
        counts = np.bincount(y, minlength=n)
        assert len(counts) == n and counts.min() == 1, f"length {n}"


def test_feistel_inverse_undoes_forward_for_every_length_up_to_5000():
    for n in range(1, 5001, 7):
        _assert_bijection(FeistelPermutation(n, seed=3 * n + 1), n)


@pytest.mark.parametrize("k", [16, 17, 20, 22])
def test_feistel_is_a_bijection_around_powers_of_two(k):
    for n in (2**k - 1, 2**k, 2**k + 1):
        _assert_bijection(FeistelPermutation(n, seed=k), n)


@pytest.mark.parametrize("m", [1001, 1024, 1500])
def test_feistel_is_a_bijection_around_squares(m):
    # The network's domain is A x B with A = ceil(sqrt(length)): squares are its edge cases.
    for n in (m * m - 1, m * m, m * m + 1, m * (m + 1), m * (m + 1) + 1):
        _assert_bijection(FeistelPermutation(n, seed=m), n)


@pytest.mark.parametrize("n", [65_537, 1_000_003, 2_097_143])
def test_feistel_is_a_bijection_for_primes(n):
    _assert_bijection(FeistelPermutation(n, seed=11), n)


@pytest.mark.parametrize(
    "n",
    [2**k + d for k in range(23, 31) for d in (-1, 0, 1)]
    + [2_147_483_647, 2**32 - 1, 2**32, 2**32 + 1, 10**12 + 39, 2**61 - 1, 2**62],
)
def test_feistel_sampled_inverse_and_distinct_outputs_for_large_lengths(n):
    rng = np.random.default_rng(n % 2**32)
    x = np.unique(np.concatenate([rng.integers(0, n, 20_011), [0, n - 1], np.arange(min(n, 64))]))
    perm = FeistelPermutation(n, seed=5)
    y = perm(x)
    assert y.min() >= 0 and y.max() < n
    assert len(np.unique(y)) == len(x), "two inputs collided"
    assert np.array_equal(perm.inverse(y), x)
    z = rng.integers(0, n, 5003)
    assert np.array_equal(perm(perm.inverse(z)), z)


def test_feistel_65537_has_65537_distinct_outputs():
    assert len(np.unique(FeistelPermutation(65_537, seed=0)(np.arange(65_537)))) == 65_537


def test_feistel_is_deterministic_in_seed_and_length():
    x = np.arange(1001)
    assert np.array_equal(FeistelPermutation(1001, 7)(x), FeistelPermutation(1001, 7)(x))
    assert not np.array_equal(FeistelPermutation(1001, 7)(x), FeistelPermutation(1001, 8)(x))
    # Another length is another mapping, even on the indices both share.
    for other in (1002, 1000, 1024):
        shared = np.arange(min(1001, other))
        a, b = FeistelPermutation(1001, 7)(shared), FeistelPermutation(other, 7)(shared)
        assert np.mean(a == b) < 0.05, other


def test_feistel_output_is_pinned_across_versions():
    # Resumed runs depend on this exact mapping: changing it must be a deliberate format change.
    got = FeistelPermutation(1_000_000_007, seed=42)(np.arange(6)).tolist()
    assert got == [256785893, 913484817, 107796922, 760836493, 355236321, 82527414]


def test_feistel_keeps_array_shape():
    x = np.arange(15).reshape(3, 5)
    assert FeistelPermutation(15, seed=1)(x).shape == (3, 5)
    assert FeistelPermutation(15, seed=1)(4).shape == ()


@pytest.mark.parametrize("n", [1, 2, 3, 31, 64, 65, 257, 1000])
def test_linear_era_and_block_shuffles_are_bijections(n):
    for perm in (
        LinearPermutation(n, seed=n),
        EraShuffle(n, era_length=7, seed=n),
        EraShuffle(n, era_length=1000, seed=n),
        BlockShuffle(n, block_size=5, window=3, seed=n),
        BlockShuffle(n, block_size=64, window=2, seed=n),
    ):
        _assert_bijection(perm, n)


def test_linear_permutation_is_exact_beyond_int64_products():
    n = 2**61 - 1
    perm = LinearPermutation(n, seed=3)
    x = np.asarray([0, 1, n - 1, 12345678901234])
    a, b = perm.coefficients
    assert perm(x).tolist() == [(a * int(v) + b) % n for v in x]
    assert np.array_equal(perm.inverse(perm(x)), x)


def test_era_shuffle_keeps_indices_in_their_era():
    perm = EraShuffle(103, era_length=10, seed=2)
    x = np.arange(103)
    assert np.array_equal(perm(x) // 10, x // 10)


def test_block_shuffle_window_reads_at_most_window_plus_one_blocks():
    perm = BlockShuffle(1013, block_size=16, window=4, seed=9)
    out = perm(np.arange(1013))
    for start in range(0, 1013, 64):
        assert len(np.unique(out[start : start + 64] // 16)) <= 5


def test_out_of_range_index_names_the_value_and_length():
    with pytest.raises(IndexError, match=r"contain 10, outside \[0, 10\)"):
        FeistelPermutation(10, seed=0)(np.arange(11))
    with pytest.raises(IndexError, match=r"contain -1"):
        FeistelPermutation(10, seed=0).inverse(-1)


def test_float_indices_are_rejected():
    with pytest.raises(TypeError, match="must be integers, got dtype float64"):
        FeistelPermutation(10, seed=0)(np.arange(3.0))


def test_too_few_rounds_is_an_error():
    with pytest.raises(ValueError, match=r"rounds=2.*need an int >= 3"):
        FeistelPermutation(10, seed=0, rounds=2)


def test_bad_seed_and_length_are_errors():
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*64\), got -1"):
        FeistelPermutation(10, seed=-1)
    with pytest.raises(ValueError, match=r"length must be in \[1, 2\*\*62\], got 0"):
        FeistelPermutation(0)
