"""Activations, dropout and losses added for Haliax parity, against jax.nn / numpy formulas."""

import jax
import numpy as np
import pytest

import meltemi.haliax as hax

Batch, Pos, Embed = hax.make_axes(batch=3, pos=5, embed=7)


def _x(seed=0):
    return hax.random.normal(jax.random.key(seed), (Batch, Pos, Embed)) * 3


@pytest.mark.parametrize(
    "name",
    [
        "celu",
        "selu",
        "hard_sigmoid",
        "hard_silu",
        "hard_swish",
        "hard_tanh",
        "log_sigmoid",
        "soft_sign",
    ],
)
def test_activation_matches_jax_nn(name):
    x = _x()
    out = getattr(hax.nn, name)(x)
    assert out.axes == x.axes
    np.testing.assert_allclose(out.array, getattr(jax.nn, name)(x.array), rtol=1e-6)


def test_relu_squared_formula():
    x = _x(1)
    np.testing.assert_allclose(
        hax.nn.relu_squared(x).array, np.maximum(np.asarray(x.array), 0) ** 2, rtol=1e-6
    )


def test_glu_halves_the_named_axis():
    Hidden = hax.Axis("hidden", 10)
    x = hax.random.normal(jax.random.key(2), (Batch, Hidden, Pos))
    out = hax.nn.glu(x, "hidden")
    assert out.axes == (Batch, Hidden.resize(5), Pos)
    a, b = np.asarray(x.array)[:, :5], np.asarray(x.array)[:, 5:]
    np.testing.assert_allclose(out.array, a / (1 + np.exp(-b)), rtol=1e-5)
    with pytest.raises(hax.AxisError, match="odd size 7"):
        hax.nn.glu(x.rename({"hidden": "h"})[{"h": slice(0, 7)}], "h")


def test_dropout_function_scales_kept_entries_and_shares_masks_over_broadcast_axes():
    x = hax.ones((Batch, Pos, Embed))
    out = hax.nn.dropout(x, 0.4, broadcast_axes=Embed, inference=False, key=jax.random.key(3))
    raw = np.asarray(out.array)
    assert np.all(np.isclose(raw, 0.0) | np.isclose(raw, 1 / 0.6))
    assert (raw == raw[:, :, :1]).all()  # one draw per (batch, pos)
    assert hax.nn.dropout(x, 0.4, inference=True) is x
    np.testing.assert_array_equal(hax.nn.dropout(x, 1.0, inference=False).array, 0.0)
    with pytest.raises(ValueError, match="needs a PRNG key"):
        hax.nn.dropout(x, 0.5, inference=False)


def test_dropout_keep_fraction_over_many_draws():
    Big = hax.Axis("big", 100_001)
    out = hax.nn.dropout(hax.ones(Big), 0.3, inference=False, key=jax.random.key(4))
    assert abs(float((out.array > 0).mean()) - 0.7) < 0.005


def test_binary_cross_entropy_matches_the_formula():
    logits = _x(5)
    t = hax.random.uniform(jax.random.key(6), (Pos, Embed, Batch))  # other order, soft labels
    out = hax.nn.binary_cross_entropy_loss(logits, t, reduction=None)
    p = jax.nn.sigmoid(np.asarray(logits.array))
    tt = np.transpose(np.asarray(t.array), (2, 0, 1))
    ref = -tt * np.log(p) - (1 - tt) * np.log(1 - p)
    np.testing.assert_allclose(out.array, ref, rtol=1e-4, atol=1e-5)
    mean = hax.nn.binary_cross_entropy_loss(logits, t)
    np.testing.assert_allclose(mean.scalar(), ref.mean(), rtol=1e-5)


def test_reduce_loss_weighted_mean_and_masks():
    loss = hax.random.uniform(jax.random.key(7), (Batch, Pos))
    w = hax.random.uniform(jax.random.key(8), (Pos,))
    mask = hax.arange(Batch) != 1
    raw, rw = np.asarray(loss.array), np.asarray(w.array)
    m = np.array([1.0, 0.0, 1.0])[:, None]
    out = hax.nn.reduce_loss(loss, where=mask, weight=w)
    np.testing.assert_allclose(out.scalar(), (raw * rw * m).sum() / (rw * m).sum(), rtol=1e-5)
    per_batch = hax.nn.reduce_loss(loss, "sum", reduction_axis=Pos, weight=w)
    np.testing.assert_allclose(per_batch.array, (raw * rw).sum(1), rtol=1e-5)
    none = hax.nn.reduce_loss(loss, reduction_axis=())
    assert none is loss
    all_masked = hax.nn.reduce_loss(loss, where=hax.zeros((Batch,), dtype=bool))
    assert float(all_masked.scalar()) == 0.0


def test_cross_entropy_takes_haliax_positional_arguments_and_weights():
    Vocab = hax.Axis("vocab", 11)
    logits = hax.random.normal(jax.random.key(9), (Batch, Pos, Vocab))
    targets = hax.random.randint(jax.random.key(10), (Batch, Pos), 0, 11)
    w = hax.random.uniform(jax.random.key(11), (Batch, Pos))
    out = hax.nn.cross_entropy_loss(logits, Vocab, targets, hax.sum, None, w)
    lp = jax.nn.log_softmax(logits.array, -1)
    nll = -np.take_along_axis(np.asarray(lp), np.asarray(targets.array)[..., None], -1)[..., 0]
    np.testing.assert_allclose(out.scalar(), (nll * np.asarray(w.array)).sum(), rtol=1e-5)
    one_hot = hax.nn.one_hot(targets, Vocab)
    soft = hax.nn.cross_entropy_loss(logits, Vocab, one_hot, reduction_axis=Pos)
    np.testing.assert_allclose(soft.array, nll.mean(1), rtol=1e-5)
