import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meltemi.haliax as hax

Batch, Pos, Embed, Mlp, Vocab = (
    hax.Axis("batch", 3),
    hax.Axis("pos", 5),
    hax.Axis("embed", 7),
    hax.Axis("mlp", 11),
    hax.Axis("vocab", 13),
)
Heads, HeadSize = hax.Axis("heads", 2), hax.Axis("head_size", 3)


def _rand(axes, seed=0):
    return hax.random.normal(jax.random.key(seed), axes)


def test_linear_matches_matmul_with_torch_layout():
    lin = hax.nn.Linear.init(Embed, Mlp, key=jax.random.key(0))
    lin = hax.nn.Linear(lin.weight, _rand(Mlp, 2), Embed, Mlp)
    x = _rand((Batch, Pos, Embed), 1)
    assert lin.weight.axes == (Mlp, Embed)
    np.testing.assert_allclose(
        lin(x).array, x.array @ lin.weight.array.T + lin.bias.array, rtol=1e-5, atol=1e-5
    )


def test_linear_with_several_output_axes():
    lin = hax.nn.Linear.init(Embed, (Heads, HeadSize), key=jax.random.key(0), use_bias=False)
    out = lin(_rand((Pos, Embed), 1))
    assert out.axes == (Pos, Heads, HeadSize)
    back = hax.nn.Linear.init((Heads, HeadSize), Embed, key=jax.random.key(1))(out)
    assert back.axes == (Pos, Embed)


def test_linear_init_std_is_one_over_sqrt_fan_in():
    In, Out = hax.Axis("in", 101), hax.Axis("out", 97)
    w = hax.nn.Linear.init(In, Out, key=jax.random.key(0)).weight.array
    # a normal truncated at +-3 sigma has std 0.9866
    assert abs(float(jnp.std(w)) * np.sqrt(101) - 0.9866) < 0.03


def test_linear_wrong_input_axis_says_which():
    lin = hax.nn.Linear.init(Embed, Mlp, key=jax.random.key(0))
    with pytest.raises(hax.AxisError, match=r"expects input axes \['embed'\].*\['batch', 'mlp'\]"):
        lin(hax.ones((Batch, Mlp)))


def test_embedding_embed_and_unembed():
    emb = hax.nn.Embedding.init(Vocab, Embed, key=jax.random.key(0))
    ids = hax.named(jnp.array([[1, 12, 0, 5, 5]] * 3), (Batch, Pos))
    x = emb.embed(ids)
    assert x.axes == (Batch, Pos, Embed)
    np.testing.assert_array_equal(x.array, emb.weight.array[ids.array])
    logits = emb.unembed(x)
    np.testing.assert_allclose(logits.array, x.array @ emb.weight.array.T, rtol=1e-5, atol=1e-5)


def test_rms_norm_matches_formula():
    x = _rand((Batch, Embed))
    norm = hax.nn.RmsNorm.init(Embed, eps=1e-5)
    ref = x.array / np.sqrt(np.mean(np.square(x.array), axis=-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(
        norm(x.rearrange(("embed", "batch"))).rearrange(("batch", "embed")).array,
        ref,
        rtol=1e-5,
        atol=1e-6,
    )


def test_layer_norm_matches_formula():
    x = _rand((Batch, Embed))
    norm = hax.nn.LayerNorm.init(Embed, eps=1e-5)
    a = np.asarray(x.array)
    ref = (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(norm(x).array, ref, rtol=1e-5, atol=1e-5)


def test_norm_in_bfloat16_keeps_dtype():
    x = _rand((Batch, Embed)).astype(jnp.bfloat16)
    assert hax.nn.RmsNorm.init(Embed, dtype=jnp.bfloat16)(x).dtype == jnp.bfloat16


def test_gated_mlp_is_swiglu():
    mlp = hax.nn.MLP.init(
        Embed,
        Embed.alias("out"),
        Mlp,
        depth=1,
        activation=hax.nn.silu,
        gated=True,
        use_bias=False,
        key=jax.random.key(0),
    )
    x = _rand((Batch, Embed), 1)
    up, gate, down = (
        mlp.layers[0].weight.array,
        mlp.gates[0].weight.array,
        mlp.layers[1].weight.array,
    )
    ref = (jax.nn.silu(x.array @ gate.T) * (x.array @ up.T)) @ down.T
    np.testing.assert_allclose(mlp(x).array, ref, rtol=1e-5, atol=1e-5)


def test_plain_mlp_depth_two_alternates_hidden_names():
    mlp = hax.nn.MLP.init(Embed, Vocab, 4, depth=2, key=jax.random.key(0))
    assert [layer.Out.name for layer in mlp.layers] == ["mlp", "mlp2", "vocab"]
    assert mlp(_rand((Batch, Embed))).axes == (Batch, Vocab)


def test_dropout_rescales_kept_and_needs_key():
    d = hax.nn.Dropout(0.5)
    out = d(hax.ones((Batch, Embed)), key=jax.random.key(0))
    vals = set(np.unique(np.asarray(out.array)).tolist())
    assert vals <= {0.0, 2.0} and len(vals) == 2
    with pytest.raises(ValueError, match=r"needs a PRNG key"):
        d(hax.ones(Embed))


def test_dropout_broadcast_axes_share_draw():
    out = hax.nn.Dropout(0.5, broadcast_axes=Embed)(hax.ones((Batch, Embed)), key=jax.random.key(1))
    a = np.asarray(out.array)
    assert np.all(a == a[:, :1])


def test_softmax_and_log_softmax_over_named_axis():
    x = _rand((Batch, Vocab))
    np.testing.assert_allclose(
        hax.nn.softmax(x, Vocab).array, jax.nn.softmax(x.array, -1), rtol=1e-6
    )
    np.testing.assert_allclose(
        hax.nn.log_softmax(x.rearrange(("vocab", "batch")), "vocab").array,
        jax.nn.log_softmax(x.array, -1).T,
        rtol=1e-5,
    )


def test_cross_entropy_integer_targets_matches_reference():
    logits = _rand((Batch, Pos, Vocab))
    ids = hax.random.randint(jax.random.key(1), (Batch, Pos), 0, 13)
    loss = hax.nn.cross_entropy_loss(logits, Vocab, ids, reduction=None)
    ref = -np.take_along_axis(
        np.asarray(jax.nn.log_softmax(logits.array, -1)), np.asarray(ids.array)[..., None], -1
    )[..., 0]
    np.testing.assert_allclose(loss.array, ref, rtol=1e-5, atol=1e-6)


def test_cross_entropy_one_hot_equals_integer_targets():
    logits = _rand((Batch, Vocab))
    ids = hax.random.randint(jax.random.key(1), (Batch,), 0, 13)
    a = hax.nn.cross_entropy_loss(logits, Vocab, ids)
    b = hax.nn.cross_entropy_loss(logits, Vocab, hax.nn.one_hot(ids, Vocab))
    np.testing.assert_allclose(a.scalar(), b.scalar(), rtol=1e-5)


def test_cross_entropy_mask_averages_over_unmasked_only():
    logits = _rand((Pos, Vocab))
    ids = hax.random.randint(jax.random.key(1), (Pos,), 0, 13)
    mask = hax.arange(Pos) < 2
    per = hax.nn.cross_entropy_loss(logits, Vocab, ids, reduction=None)
    masked = hax.nn.cross_entropy_loss(logits, Vocab, ids, where=mask)
    np.testing.assert_allclose(masked.scalar(), per.array[:2].mean(), rtol=1e-5)


def test_cross_entropy_z_loss_adds_log_z_squared():
    logits = _rand((Pos, Vocab))
    ids = hax.random.randint(jax.random.key(1), (Pos,), 0, 13)
    base = hax.nn.cross_entropy_loss(logits, Vocab, ids, reduction="sum")
    z = hax.nn.cross_entropy_loss(logits, Vocab, ids, reduction="sum", z_loss_weight=1e-2)
    log_z = jax.nn.logsumexp(logits.array, -1)
    np.testing.assert_allclose(z.scalar() - base.scalar(), 1e-2 * np.sum(log_z**2), rtol=1e-4)


def test_cross_entropy_integer_targets_with_label_axis_is_error():
    with pytest.raises(hax.AxisError, match=r"must not have the label axis"):
        hax.nn.cross_entropy_loss(_rand((Pos, Vocab)), Vocab, hax.zeros((Pos, Vocab), jnp.int32))


@pytest.mark.parametrize("out_first", [True, False])
def test_linear_flatten_for_export_is_2d_and_round_trips(out_first):
    layer = hax.nn.Linear.init(
        (Heads, HeadSize), (Pos, Mlp), key=jax.random.key(0), out_first=out_first
    )
    flat = layer.flatten_for_export()
    out_in = (Pos.size * Mlp.size, Heads.size * HeadSize.size)
    assert flat.weight.array.shape == (out_in if out_first else out_in[::-1])
    assert flat.bias.array.shape == (Pos.size * Mlp.size,)
    # row-major flattening: element [o, i] of the 2-D weight is the (pos, mlp, heads, head_size) one
    w = np.asarray(layer.weight.rearrange(("pos", "mlp", "heads", "head_size")).array)
    flat_oi = np.asarray(flat.weight.array if out_first else flat.weight.array.T)
    np.testing.assert_array_equal(flat_oi, w.reshape(out_in))
    other = hax.nn.Linear.init(
        (Heads, HeadSize), (Pos, Mlp), key=jax.random.key(1), out_first=out_first
    )
    back = flat.unflatten_from_export(other)
    assert back.weight.axes == layer.weight.axes and back.bias.axes == layer.bias.axes
    np.testing.assert_array_equal(back.weight.array, layer.weight.array)


def test_layer_norm_flatten_for_export_round_trips():
    norm = hax.nn.LayerNorm.init((Heads, HeadSize))
    norm = norm.__class__(_rand((Heads, HeadSize)), _rand((Heads, HeadSize), 1), norm.axis)
    flat = norm.flatten_for_export()
    assert flat.weight.array.shape == flat.bias.array.shape == (Heads.size * HeadSize.size,)
    back = flat.unflatten_from_export(hax.nn.LayerNorm.init((Heads, HeadSize)))
    assert back.weight.axes == (Heads, HeadSize)
    np.testing.assert_array_equal(back.bias.array, norm.bias.array)
