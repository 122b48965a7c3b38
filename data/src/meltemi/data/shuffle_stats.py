"""Statistics that tell a good shuffle of sorted data from a structured one.

Feed the shuffled positions of sorted data (value `i / n` at index `i`) and a batch size:

* `batch_mean_variance_ratio`: variance of per-batch means over its value under a uniformly
  random permutation, `(1 / (12 B)) (n - B) / (n - 1)`; about `1 +- sqrt(2 / batches)` when random.
* `batch_mean_autocorrelation`: lag-1 autocorrelation of per-batch means; about
  `0 +- 1 / sqrt(batches)` when random. A phase effect shows up here.
* `gap_ks`: the Kolmogorov-Smirnov statistic (times `sqrt(n - 1)`) of consecutive gaps
  `|v[i+1] - v[i]|` against their law under a random permutation, `P(gap <= x) = 1 - (1 - x)**2`.
  Below 1.95 at the 0.1% level; an affine shuffle has one gap value and scores in the hundreds.

>>> import numpy as np
>>> s = shuffle_statistics(np.random.default_rng(0).permutation(20_000), 50)
>>> 0.8 < s["batch_mean_variance_ratio"] < 1.2 and s["gap_ks"] < 1.95
True
"""

from __future__ import annotations

import numpy as np

__all__ = ["shuffle_statistics"]


def shuffle_statistics(positions: np.ndarray, batch_size: int) -> dict[str, float]:
    """The three statistics above for `positions` (a permutation of `[0, n)`)."""
    positions = np.asarray(positions)
    n = len(positions)
    batches = n // batch_size
    if batches < 3:
        raise ValueError(
            f"shuffle_statistics: {n} positions make {batches} batches of {batch_size}; "
            f"need at least 3"
        )
    v = positions / n
    means = v[: batches * batch_size].reshape(batches, batch_size).mean(axis=1)
    expected = (1.0 / (12 * batch_size)) * (n - batch_size) / (n - 1)
    centred = means - means.mean()
    autocorr = float((centred[1:] * centred[:-1]).sum() / (centred * centred).sum())
    gaps = np.sort(np.abs(np.diff(v)))
    cdf = 1.0 - (1.0 - gaps) ** 2
    m = len(gaps)
    ks = max((np.arange(1, m + 1) / m - cdf).max(), (cdf - np.arange(m) / m).max())
    return {
        "batch_mean_variance_ratio": float(means.var() / expected),
        "batch_mean_autocorrelation": autocorr,
        "gap_ks": float(ks * np.sqrt(m)),
        "batches": batches,
    }
