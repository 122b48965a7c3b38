import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meltemi.haliax as hax

Batch, Pos, Embed, Mlp = (
    hax.Axis("batch", 3),
    hax.Axis("pos", 5),
    hax.Axis("embed", 7),
    hax.Axis("mlp", 11),
)


def _rand(axes, seed=0):
    return hax.random.normal(jax.random.key(seed), axes)


def test_elementwise_ops_match_jnp():
    x = _rand((Batch, Embed))
    for name in ("exp", "tanh", "abs", "sin", "square"):
        np.testing.assert_allclose(
            getattr(hax, name)(x).array, getattr(jnp, name)(x.array), rtol=1e-6
        )
    np.testing.assert_allclose(hax.maximum(x, 0.0).array, np.maximum(x.array, 0.0))


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "prod", "std", "var"])
def test_reductions_over_named_axis_match_numpy(name):
    x = _rand((Batch, Pos, Embed))
    out = getattr(hax, name)(x, axis=("batch", "embed"))
    assert out.axes == (Pos,)
    np.testing.assert_allclose(
        out.array, getattr(np, name)(np.asarray(x.array), axis=(0, 2)), rtol=1e-5, atol=1e-6
    )


def test_reduction_over_everything_gives_scalar_named_array():
    x = _rand((Batch, Embed))
    assert hax.sum(x).axes == ()
    np.testing.assert_allclose(hax.sum(x).scalar(), np.sum(x.array), rtol=1e-5)


def test_mean_with_where_ignores_masked():
    x = hax.arange(Pos).astype(jnp.float32)
    m = hax.arange(Pos) < 2
    assert float(hax.mean(x, where=m).scalar()) == 0.5


def test_logsumexp_argmax_any_all():
    x = _rand((Batch, Embed))
    np.testing.assert_allclose(
        hax.logsumexp(x, "embed").array, jax.nn.logsumexp(x.array, axis=1), rtol=1e-6
    )
    np.testing.assert_array_equal(hax.argmax(x, "embed").array, np.argmax(x.array, axis=1))
    np.testing.assert_array_equal(hax.argmin(x, "batch").array, np.argmin(x.array, axis=0))
    assert bool(hax.any(x > 0).scalar()) and not bool(hax.all(x > 100).scalar())


def test_dot_contracts_by_name_regardless_of_order():
    x, w = _rand((Batch, Embed)), _rand((Mlp, Embed), 1)
    out = hax.dot(x.rearrange(("embed", "batch")), w, axis=Embed)
    assert out.axes == (Batch, Mlp)
    np.testing.assert_allclose(out.array, x.array @ w.array.T, rtol=1e-5, atol=1e-5)


def test_dot_shared_uncontracted_axis_is_batch_axis():
    a, b = _rand((Batch, Pos, Embed)), _rand((Batch, Embed), 1)
    out = hax.dot(a, b, axis="embed")
    np.testing.assert_allclose(out.array, np.einsum("bpe,be->bp", a.array, b.array), rtol=1e-5)


def test_dot_unknown_axis_lists_operand_axes():
    with pytest.raises(hax.AxisNotFoundError, match=r"'heads' not found.*batch=3, embed=7"):
        hax.dot(_rand((Batch, Embed)), _rand((Embed,)), axis="heads")


def test_einsum_forms_agree():
    x, w = _rand((Batch, Embed)), _rand((Embed, Mlp), 1)
    ref = x.array @ w.array
    np.testing.assert_allclose(
        hax.einsum("batch embed, embed mlp -> batch mlp", x, w).array, ref, rtol=1e-5
    )
    np.testing.assert_allclose(
        hax.einsum("... embed, embed mlp -> ... mlp", x, w).array, ref, rtol=1e-5
    )
    np.testing.assert_allclose(hax.einsum("-> batch mlp", x, w).array, ref, rtol=1e-5)
    np.testing.assert_allclose(hax.einsum("{embed} -> batch mlp", x, w).array, ref, rtol=1e-5)
    np.testing.assert_allclose(
        hax.einsum("b e, e m -> m b", x, w, b="batch", e="embed", m="mlp").array, ref.T, rtol=1e-5
    )


def test_where_and_clip_align_by_name():
    x = _rand((Batch, Embed))
    cond = hax.arange(Embed) < 3
    out = hax.where(cond, x, 0.0)
    np.testing.assert_array_equal(out.array, np.where(np.arange(7) < 3, x.array, 0.0))
    np.testing.assert_array_equal(hax.clip(x, -0.5, 0.5).array, np.clip(x.array, -0.5, 0.5))


def test_concatenate_and_stack():
    a, b = hax.ones((Batch, Embed)), hax.zeros((Embed, Batch.resize(2)))
    c = hax.concatenate("batch", [a, b])
    assert c.shape == {"batch": 5, "embed": 7}
    np.testing.assert_array_equal(c.array[:3], 1.0)
    s = hax.stack("layers", [a, a * 2])
    assert s.axes[0] == hax.Axis("layers", 2)
    np.testing.assert_array_equal(s.array[1], 2.0)


def test_top_k_cumsum_sort_roll():
    x = _rand((Batch, Embed))
    vals, idx = hax.top_k(x, "embed", 2)
    np.testing.assert_allclose(vals.array, -np.sort(-np.asarray(x.array), axis=1)[:, :2])
    assert idx.axes == (Batch, Embed.resize(2))
    np.testing.assert_allclose(hax.cumsum(x, "embed").array, np.cumsum(x.array, axis=1), rtol=1e-5)
    np.testing.assert_array_equal(hax.sort(x, "batch").array, np.sort(x.array, axis=0))
    np.testing.assert_array_equal(hax.roll(x, 2, "embed").array, np.roll(x.array, 2, axis=1))


def test_einsum_operand_spec_missing_axis_is_an_error():
    with pytest.raises(hax.AxisError, match=r"does not name every axis.*add '...'"):
        hax.einsum("batch -> batch", _rand((Batch, Embed)))


def test_dot_out_axes_orders_result():
    x, w = _rand((Batch, Embed)), _rand((Mlp, Embed), 1)
    out = hax.dot(x, w, axis=Embed, out_axes=("mlp", ...))
    assert out.axes == (Mlp, Batch)


def test_tril_over_named_axes():
    x = hax.ones((Pos, Pos.alias("key_pos")))
    np.testing.assert_array_equal(hax.tril(x, ("pos", "key_pos")).array, np.tril(np.ones((5, 5))))
