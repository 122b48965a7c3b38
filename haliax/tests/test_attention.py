import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import meltemi.haliax as hax
from meltemi.haliax.nn import attention as A
from meltemi.haliax.nn import rotary

Batch, Pos, KVHeads, Group, HeadSize = (
    hax.Axis("batch", 3),
    hax.Axis("pos", 5),
    hax.Axis("kv_heads", 2),
    hax.Axis("q_per_kv", 3),
    hax.Axis("head_size", 4),
)
KPos = Pos.alias("key_pos")


def _ref_attention(q, k, v, mask):
    # q: b p h d, k/v: b s h d, mask p s
    logits = np.einsum("bphd,bshd->bhps", q, k) / np.sqrt(q.shape[-1])
    logits = np.where(mask, logits, -1e30)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w = w / w.sum(-1, keepdims=True)
    return np.einsum("bhps,bshd->bphd", w, v)


def test_causal_mask_is_lower_triangular():
    m = A.causal_mask(Pos, KPos)
    assert m.axes == (Pos, KPos)
    np.testing.assert_array_equal(m.array, np.tril(np.ones((5, 5), bool)))


def test_grouped_query_attention_matches_repeated_kv_reference():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    q = hax.random.normal(k1, (Batch, Pos, KVHeads, Group, HeadSize))
    k = hax.random.normal(k2, (Batch, KPos, KVHeads, HeadSize))
    v = hax.random.normal(k3, (Batch, KPos, KVHeads, HeadSize))
    out = jax.jit(
        lambda q, k, v: A.dot_product_attention(
            KPos, HeadSize, q, k, v, mask=A.causal_mask(Pos, KPos)
        )
    )(q, k, v)
    out = out.rearrange((Batch, Pos, KVHeads, Group, HeadSize))
    qf = np.asarray(q.array).reshape(3, 5, 6, 4)
    kf = np.repeat(np.asarray(k.array), 3, axis=2)
    vf = np.repeat(np.asarray(v.array), 3, axis=2)
    ref = _ref_attention(qf, kf, vf, np.tril(np.ones((5, 5), bool)))
    np.testing.assert_allclose(np.asarray(out.array).reshape(3, 5, 6, 4), ref, rtol=1e-5, atol=1e-5)


def test_segment_ids_block_attention_across_documents():
    seg = hax.named(jnp.array([[0, 0, 1, 1, 1]] * 3), (Batch, Pos))
    mask = A.AttentionMask.causal().with_segment_ids(seg).materialize(Pos, KPos)
    assert set(a.name for a in mask.axes) == {"batch", "pos", "key_pos"}
    m = mask.rearrange(("batch", "pos", "key_pos")).array[0]
    ref = np.tril(np.ones((5, 5), bool)) & (
        np.array([0, 0, 1, 1, 1])[:, None] == np.array([0, 0, 1, 1, 1])[None]
    )
    np.testing.assert_array_equal(m, ref)


def test_attention_module_gqa_qk_norm_and_rope_runs_with_odd_sizes():
    Embed = hax.Axis("embed", 12)
    attn = A.Attention.init(
        Embed,
        num_heads=6,
        num_kv_heads=2,
        head_size=4,
        key=jax.random.key(0),
        use_qk_norm=True,
        rotary=rotary.RotaryConfig(theta=500000.0),
    )
    x = hax.random.normal(jax.random.key(1), (Batch, Pos, Embed))
    run = eqx.filter_jit(lambda m, x: m(x, A.AttentionMask.causal()))
    out = run(attn, x)
    assert out.axes == (Batch, Pos, Embed)
    # causality: changing the last position must not change earlier outputs
    x2 = x.at[{"pos": 4}].set(0.0)
    np.testing.assert_allclose(run(attn, x2).array[:, :4], out.array[:, :4], rtol=1e-5, atol=1e-5)


def test_rotary_matches_hf_rotate_half():
    x = hax.random.normal(jax.random.key(0), (Pos, HeadSize))
    out = rotary.apply_rotary(x, hax.arange(Pos), HeadSize, theta=10000.0)
    inv = 1.0 / (10000.0 ** (np.arange(0, 4, 2) / 4))
    ang = np.arange(5)[:, None] * inv[None]
    emb = np.concatenate([ang, ang], -1)
    a = np.asarray(x.array)
    rot = np.concatenate([-a[:, 2:], a[:, :2]], -1)
    np.testing.assert_allclose(out.array, a * np.cos(emb) + rot * np.sin(emb), rtol=1e-5, atol=1e-5)


def test_rotary_preserves_relative_position_dot_products():
    H = hax.Axis("head_size", 8)
    q = hax.random.normal(jax.random.key(0), H)
    k = hax.random.normal(jax.random.key(1), H)
    P1 = hax.Axis("p", 1)

    def rot(x, p):
        return rotary.apply_rotary(x.broadcast_axis(P1), hax.full(P1, p), H)[{"p": 0}]

    d1 = hax.dot(rot(q, 7), rot(k, 3), axis=H).scalar()
    d2 = hax.dot(rot(q, 14), rot(k, 10), axis=H).scalar()
    np.testing.assert_allclose(d1, d2, rtol=1e-4)


def test_llama3_scaling_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = dict(
        rope_type="llama3",
        rope_theta=500000.0,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=64,
    )
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=2, rope_parameters=params)
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    ours = rotary.rotary_inv_frequencies(32, 500000.0, rotary.Llama3RopeScaling(8.0, 1.0, 4.0, 64))
    np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-5)
    plain = rotary.rotary_inv_frequencies(32, 500000.0)
    assert not np.allclose(ours, plain)  # the scaling does change the low frequencies


def test_qk_norm_hook_makes_attention_invariant_to_query_key_scale():
    Embed = hax.Axis("embed", 12)
    attn = A.Attention.init(
        Embed, num_heads=6, num_kv_heads=2, head_size=4, key=jax.random.key(0), use_qk_norm=True
    )
    scaled = eqx.tree_at(
        lambda a: (a.q_proj.weight, a.k_proj.weight),
        attn,
        (attn.q_proj.weight * 7.0, attn.k_proj.weight * 5.0),
    )
    x = hax.random.normal(jax.random.key(1), (Pos, Embed))
    run = eqx.filter_jit(lambda m, x: m(x, A.AttentionMask.causal()))
    np.testing.assert_allclose(run(scaled, x).array, run(attn, x).array, rtol=1e-4, atol=1e-5)
    no_norm = eqx.tree_at(
        lambda a: (a.q_norm, a.k_norm), scaled, (None, None), is_leaf=lambda v: v is None
    )
    assert not np.allclose(run(no_norm, x).array, run(attn, x).array, atol=1e-3)


def test_bias_and_soft_cap_change_logits_as_documented():
    k1, k2 = jax.random.split(jax.random.key(3))
    q = hax.random.normal(k1, (Pos, HeadSize)) * 10
    k = hax.random.normal(k2, (KPos, HeadSize)) * 10
    w = A.dot_product_attention_weights(HeadSize, KPos, q, k, logits_soft_cap=2.0)
    raw = np.asarray(q.array) @ np.asarray(k.array).T / 2.0
    ref = jax.nn.softmax(np.tanh(raw / 2.0) * 2.0, axis=-1)
    np.testing.assert_allclose(w.array, ref, rtol=1e-5, atol=1e-6)
    bias = A.mask_to_bias(A.causal_mask(Pos, KPos))
    wb = A.dot_product_attention_weights(HeadSize, KPos, q, k, bias=bias)
    np.testing.assert_allclose(np.triu(np.asarray(wb.array), 1), 0.0, atol=1e-6)
