"""On sorted data the affine shuffle visibly fails; Feistel passes as a random permutation.

Bounds (n = 128,000 values, batches of 64 -> 2,000 batches):
  batch-mean variance ratio within [0.8, 1.2]  (random: 1 +- 0.032, so about 6 sigma)
  |lag-1 autocorrelation of batch means| < 0.11 (random: 0 +- 0.022, 5 sigma)
  gap KS statistic * sqrt(n) < 1.95             (the 0.1% critical value)
"""

from __future__ import annotations

import numpy as np
import pytest

from meltemi.data.permutation import FeistelPermutation, LinearPermutation
from meltemi.data.shuffle_stats import shuffle_statistics

N, B = 128_000, 64
SEEDS = [0, 1, 2, 3, 4]


def _stats(perm):
    return shuffle_statistics(perm(np.arange(N)), B)


@pytest.mark.parametrize("seed", SEEDS)
def test_feistel_gap_distribution_matches_a_random_permutation(seed):
    assert _stats(FeistelPermutation(N, seed))["gap_ks"] < 1.95


@pytest.mark.parametrize("seed", SEEDS)
def test_feistel_batch_means_look_random(seed):
    s = _stats(FeistelPermutation(N, seed))
    assert 0.8 < s["batch_mean_variance_ratio"] < 1.2
    assert abs(s["batch_mean_autocorrelation"]) < 0.11


@pytest.mark.parametrize("seed", SEEDS)
def test_linear_gap_distribution_is_far_from_random(seed):
    assert _stats(LinearPermutation(N, seed))["gap_ks"] > 20


@pytest.mark.parametrize("seed", SEEDS)
def test_linear_batch_means_are_structured(seed):
    s = _stats(LinearPermutation(N, seed))
    off_variance = not 0.8 < s["batch_mean_variance_ratio"] < 1.2
    phased = abs(s["batch_mean_autocorrelation"]) >= 0.11
    assert off_variance or phased, s


def test_statistics_need_three_batches():
    with pytest.raises(ValueError, match="make 2 batches of 5; need at least 3"):
        shuffle_statistics(np.arange(10), 5)
