"""ALiBi bias, prefix-LM and forgetful causal masks (Haliax's attention helpers)."""

import jax
import numpy as np
import pytest

import meltemi.haliax as hax
from meltemi.haliax.nn import attention as hattn

Pos, KPos, Heads, Head = hax.make_axes(pos=5, key_pos=5, heads=8, head_size=3)


def test_alibi_slopes_follow_the_paper_for_8_heads():
    b = hattn.alibi_attention_bias(Heads, KPos)
    assert b.axes == (Heads, KPos)
    slopes = 2.0 ** -np.arange(1, 9)  # Press et al.: 1/2, 1/4, ..., 1/256
    np.testing.assert_allclose(b.array, slopes[:, None] * np.arange(5)[None, :], rtol=1e-6)


def test_alibi_for_a_non_power_of_two_interleaves_the_next_power():
    b = hattn.alibi_attention_bias(hax.Axis("heads", 6), KPos, dtype=np.float32)
    first4 = 2.0 ** -(2.0 * np.arange(1, 5))  # 4 heads: start 2^-2
    extra = (2.0 ** -np.arange(1, 9))[0::2][:2]  # from 8 heads, every other
    np.testing.assert_allclose(b.array[:, 1], np.concatenate([first4, extra]), rtol=1e-6)


def test_alibi_bias_in_causal_attention_penalises_distance_linearly():
    q = hax.random.normal(jax.random.key(0), (Pos, Heads, Head))
    k = hax.random.normal(jax.random.key(1), (KPos, Heads, Head))
    v = hax.random.normal(jax.random.key(2), (KPos, Heads, Head))
    mask = hattn.causal_mask(Pos, KPos)
    bias = hattn.alibi_attention_bias(Heads, KPos)
    out = hattn.dot_product_attention(KPos, Head, q, k, v, mask=mask, bias=bias)
    qr, kr, vr = (np.asarray(t.array) for t in (q, k, v))
    slopes = 2.0 ** -np.arange(1, 9)
    logits = np.einsum("qhd,khd->hqk", qr, kr) / np.sqrt(3)
    dist = np.arange(5)[:, None] - np.arange(5)[None, :]
    logits = logits - slopes[:, None, None] * dist  # the paper's form
    logits = np.where(dist >= 0, logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ref = np.einsum("hqk,khd->qhd", p, vr)
    np.testing.assert_allclose(out.rearrange((Pos, Heads, Head)).array, ref, rtol=1e-4, atol=1e-5)


def test_prefix_lm_mask_is_full_before_the_prefix_and_causal_after():
    m = np.asarray(hattn.prefix_lm_mask(Pos, KPos, 2).array)
    ref = np.tril(np.ones((5, 5), bool))
    ref[:, :2] = True
    np.testing.assert_array_equal(m, ref)
    with pytest.raises(ValueError, match="prefix_len must be >= 0"):
        hattn.prefix_lm_mask(Pos, KPos, -1)


def test_forgetful_causal_mask_keeps_position_zero_and_drops_at_the_rate():
    Big = hax.Axis("key_pos", 20_001)
    m = hattn.forgetful_causal_mask(Big, 0.3, sample_prob=False, key=jax.random.key(3))
    raw = np.asarray(m.array)
    assert raw[0]
    assert abs(raw[1:].mean() - 0.7) < 0.01
    assert bool(hattn.forgetful_causal_mask(KPos, 1.0, key=jax.random.key(4)).array.sum() == 1)
    assert hattn.forgetful_causal_mask(KPos, 0.0, key=jax.random.key(4)).array.all()
