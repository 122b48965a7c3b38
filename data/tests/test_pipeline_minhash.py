"""MinHash + LSH, checked against independent computations: a pure-Python shingle hash, exact
Jaccard similarities of shingle sets, and a plain union-find."""

from __future__ import annotations

import re

import numpy as np
import pytest

from meltemi.data.pipeline import lsh_params, minhash_signatures, near_duplicate_drops
from meltemi.data.pipeline._minhash import connected_components, word_shingles
from meltemi.data.pipeline._synthetic import synthetic_corpus

M = (1 << 64) - 1


def _mix(h: int) -> int:
    h ^= h >> 30
    h = (h * 0xBF58476D1CE4E5B9) & M
    h ^= h >> 27
    h = (h * 0x94D049BB133111EB) & M
    return h ^ (h >> 31)


def _reference_shingles(text: str, n: int) -> list[int]:
    """Word hash: polynomial over the bytes (base 0x100000001B3), then a rolling combination."""
    words = [
        w for w in re.split(rb"[\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f]+", text.lower().encode()) if w
    ]
    hashes = []
    for w in words:
        h = 0
        for byte in w:
            h = (h * 0x100000001B3 + byte + 1) & M
        hashes.append(_mix(h))
    out = []
    for k in range(len(hashes) - n + 1):
        h = 0
        for j in range(n):
            h = (h * 0x9E3779B97F4A7C15 + hashes[k + j]) & M
        out.append(_mix(h))
    return out


def test_vectorised_shingles_equal_a_plain_python_computation():
    texts = ["The cat, the HAT; and the bat!", "x", "ünïcode wörds\nacross lines of text", ""]
    got, doc = word_shingles(texts, 3)
    want = [(d, h) for d, t in enumerate(texts) for h in _reference_shingles(t, 3)]
    assert list(zip(doc.tolist(), got.tolist(), strict=True)) == want


@pytest.mark.parametrize("scheme", ["one_permutation", "permutations"])
def test_signature_agreement_estimates_the_jaccard_similarity(scheme):
    rng = np.random.default_rng(3)
    base = synthetic_corpus(12, exact=0, near=0, junk=0, seed=5)
    texts, pairs = [], []
    for r in base:  # pairs with every overlap from ~0.2 to 1
        words = r["text"].split(" ")
        other = list(words)
        for at in rng.choice(len(words), int(rng.integers(0, len(words) // 4)), replace=False):
            other[at] = f"zz{at}"
        pairs.append((len(texts), len(texts) + 1))
        texts += [" ".join(words), " ".join(other)]
    sig, has = minhash_signatures(texts, num_perm=256, shingle_size=3, scheme=scheme)
    errors, truths = [], []
    for i, j in pairs:
        a, b = set(_reference_shingles(texts[i], 3)), set(_reference_shingles(texts[j], 3))
        truth = len(a & b) / len(a | b)
        truths.append(truth)
        errors.append(abs((sig[i] == sig[j]).mean() - truth))
    assert has.all() and min(truths) < 0.5 and max(truths) > 0.95
    assert np.mean(errors) < 0.03 and max(errors) < 0.1  # std at 256 permutations: <= 0.031


def test_components_equal_a_plain_union_find():
    rng = np.random.default_rng(0)
    n = 500
    i, j = rng.integers(0, n, 300), rng.integers(0, n, 300)
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for a, b in zip(i.tolist(), j.tolist(), strict=True):
        ra, rb = find(a), find(b)
        parent[max(ra, rb)] = min(ra, rb)
    want = [min(k for k in range(n) if find(k) == find(x)) for x in range(n)]
    assert connected_components(n, i, j).tolist() == want


def test_planted_near_duplicates_are_dropped_and_the_first_is_kept():
    recs = synthetic_corpus(60, exact=0, near=25, junk=0, seed=1)
    sig, has = minhash_signatures([r["text"] for r in recs], shingle_size=5)
    bands, rows = lsh_params(0.8, 128)
    drop, stats = near_duplicate_drops(sig, has, threshold=0.8, bands=bands, rows=rows)
    first = {}
    for k, r in enumerate(recs):
        first.setdefault(r["group"], k)
    expected = np.array([first[r["group"]] != k for k, r in enumerate(recs)])
    assert expected.sum() == 25 and (drop == expected).mean() >= 0.98
    assert stats["similar_pairs"] >= 24 and stats["bands"] * stats["rows"] <= 128


@pytest.mark.parametrize("threshold", [0.7, 0.8, 0.9])
@pytest.mark.parametrize("num_perm", [128, 256])
def test_lsh_bands_lose_almost_no_pair_just_above_the_threshold(threshold, num_perm):
    # Candidates are verified, so the bands may pass many dissimilar pairs; what they miss
    # is lost for good. At threshold + 0.05 they must find >= 98% of pairs, and at most 10%
    # of the pairs 0.3 below the threshold (the verification work) may become candidates.
    bands, rows = lsh_params(threshold, num_perm)
    p = lambda s: 1 - (1 - s**rows) ** bands  # noqa: E731
    assert bands * rows <= num_perm
    assert p(threshold + 0.05) >= 0.98 and p(threshold - 0.3) <= 0.1


def test_one_permutation_fills_every_bin_alike_for_equal_shingle_sets():
    sig, has = minhash_signatures(
        ["one two three", "ONE, two; three!", "two three four"], shingle_size=1
    )
    assert has.all() and (sig != 0xFFFFFFFF).all()  # 3 shingles, 128 bins: densified
    assert (sig[0] == sig[1]).all() and 0.3 < (sig[0] == sig[2]).mean() < 0.7  # Jaccard 0.5


def test_an_unknown_scheme_is_refused():
    with pytest.raises(ValueError, match=r"scheme='oph'\): use 'one_permutation' or 'permut"):
        minhash_signatures(["a"], scheme="oph")


def test_every_ascii_byte_splits_words_as_the_plain_python_computation_does():
    texts = [f"ab{chr(c)}cd{chr(c)}{chr(c)}ef é{chr(c)}" for c in range(128)]
    got, doc = word_shingles(texts, 1)
    want = [(d, h) for d, t in enumerate(texts) for h in _reference_shingles(t, 1)]
    assert list(zip(doc.tolist(), got.tolist(), strict=True)) == want
