import re

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


def test_clip_roll_unbind_methods_are_the_functions(monkeypatch):
    """The methods delegate to `hax._ops` (one definition): a patched function is what they run."""
    x = _rand((Batch, Embed))
    lo = hax.full((Embed,), -0.25)
    np.testing.assert_array_equal(x.clip(lo, 0.5).array, hax.clip(x, lo, 0.5).array)
    np.testing.assert_array_equal(x.roll(2, "embed").array, hax.roll(x, 2, "embed").array)
    assert [u.axes for u in x.unbind("batch")] == [(Embed,)] * 3
    calls = []
    for name in ("clip", "roll", "unbind"):
        monkeypatch.setattr(hax._ops, name, lambda *a, _n=name, **k: calls.append(_n))
    x.clip(0, 1), x.roll(1, "embed"), x.unbind("batch")
    assert calls == ["clip", "roll", "unbind"]


def test_einsum_operand_spec_missing_axis_is_an_error():
    # Haliax's einsum (hax.einsum is `_einsum.einsum`, as in Haliax): ordered sides are positional
    with pytest.raises(ValueError, match=r"einsum 'batch -> batch': Mismatched number of axes"):
        hax.einsum("batch -> batch", _rand((Batch, Embed)))


def test_dot_out_axes_orders_result():
    x, w = _rand((Batch, Embed)), _rand((Mlp, Embed), 1)
    out = hax.dot(x, w, axis=Embed, out_axes=("mlp", ...))
    assert out.axes == (Mlp, Batch)


def test_tril_over_named_axes():
    x = hax.ones((Pos, Pos.alias("key_pos")))
    np.testing.assert_array_equal(hax.tril(x, ("pos", "key_pos")).array, np.tril(np.ones((5, 5))))


@pytest.mark.parametrize(
    "name",
    [
        "around",
        "conjugate",
        "copy",
        "degrees",
        "radians",
        "fabs",
        "i0",
        "sinc",
        "isneginf",
        "isposinf",
        "iscomplex",
        "isreal",
        "signbit",
        "cbrt",
        "expm1",
    ],
)
def test_more_elementwise_ops_match_jnp(name):
    x = _rand((Batch, Embed)) * 3
    x = x.at[{"batch": 0, "embed": 0}].set(-jnp.inf).at[{"batch": 1, "embed": 0}].set(jnp.inf)
    np.testing.assert_allclose(getattr(hax, name)(x).array, getattr(jnp, name)(x.array), rtol=1e-5)


def test_fix_rounds_towards_zero():
    x = hax.named(jnp.array([-2.5, -0.5, 0.5, 2.5, 3.9]), Pos)
    np.testing.assert_array_equal(hax.fix(x).array, [-2.0, -0.0, 0.0, 2.0, 3.0])


def test_divmod_and_frexp_return_named_pairs():
    x = _rand((Batch, Embed)) * 10
    y = hax.arange(Embed, start=1.0)
    q, r = hax.divmod(x, y)
    rq, rr = jnp.divmod(x.array, y.array[None, :])
    assert q.axes == r.axes == (Batch, Embed)
    np.testing.assert_allclose(q.array, rq)
    np.testing.assert_allclose(r.array, rr, rtol=1e-5, atol=1e-5)
    m, e = hax.frexp(x)
    np.testing.assert_allclose((m * 2.0**e).array, x.array, rtol=1e-6)
    assert hax.ndim(x) == 2


def test_array_equiv_broadcasts_by_name():
    a = hax.ones((Batch, Embed))
    assert hax.array_equiv(a, hax.ones(Embed))
    assert not hax.array_equiv(a, hax.zeros(Embed))
    assert not hax.array_equiv(a, hax.ones(Embed.resize(4)))


def test_isclose_equal_nan():
    x = hax.named(jnp.array([1.0, jnp.nan, 3.0, 4.0, 5.0]), Pos)
    assert not bool(hax.isclose(x, x).all().scalar())
    assert bool(hax.isclose(x, x, equal_nan=True).all().scalar())
    assert hax.allclose(x, x, equal_nan=True)


def test_tril_takes_two_axes_as_in_haliax_and_the_pair_form():
    Row, Col = hax.make_axes(row=5, col=7)
    x = _rand((Batch, Row, Col))
    ref = np.tril(np.asarray(x.array), k=1)
    np.testing.assert_array_equal(hax.tril(x, Row, Col, k=1).array, ref)
    np.testing.assert_array_equal(hax.tril(x, ("row", "col"), 1).array, ref)
    out = hax.triu(x, "col", "row")  # rows are `col` now: the transposed triangle
    assert [a.name for a in out.axes] == ["batch", "col", "row"]  # Haliax: (row, col) axes last
    np.testing.assert_array_equal(out.array, np.triu(np.swapaxes(np.asarray(x.array), 1, 2)))


def test_pad_by_axis_name_grows_only_those_axes():
    x = _rand((Batch, Pos, Embed))
    out = hax.pad(x, {"pos": (1, 2), Embed: (0, 3)}, constant_values=-1.0)
    assert out.shape == {"batch": 3, "pos": 8, "embed": 10}
    ref = np.pad(np.asarray(x.array), [(0, 0), (1, 2), (0, 3)], constant_values=-1.0)
    np.testing.assert_array_equal(out.array, ref)
    refl = hax.pad(x, {"embed": (2, 2)}, mode="reflect")
    np.testing.assert_array_equal(
        refl.array, np.pad(np.asarray(x.array), [(0, 0), (0, 0), (2, 2)], mode="reflect")
    )


def test_pad_left_fills_the_front_and_renames():
    x = _rand((Batch, Pos))
    New = hax.Axis("padded", 11)
    out = hax.pad_left(x, Pos, New, value=9.0)
    assert out.axes == (Batch, New)
    np.testing.assert_array_equal(out.array[:, :6], 9.0)
    np.testing.assert_array_equal(out.array[:, 6:], x.array)
    with pytest.raises(hax.AxisError, match="cannot pad axis 'pos' of size 5 down to 3"):
        hax.pad_left(x, Pos, hax.Axis("p", 3))


def test_ravel_and_flatten_merge_all_axes_in_order():
    x = _rand((Batch, Pos, Embed))
    out = hax.ravel(x, "flat")
    assert out.axes == (hax.Axis("flat", 105),)
    np.testing.assert_array_equal(out.array, np.ravel(np.asarray(x.array)))
    assert hax.flatten(x, hax.Axis("flat", 105)).axes == out.axes


def test_arange_over_several_axes_numbers_row_major_and_takes_a_traced_start():
    out = hax.arange((Batch, Pos), start=2, step=3)
    assert out.axes == (Batch, Pos)
    np.testing.assert_array_equal(out.array, (np.arange(15) * 3 + 2).reshape(3, 5))
    traced = jax.jit(lambda s: hax.arange(Embed, start=s).array)(jnp.int32(4))
    np.testing.assert_array_equal(traced, np.arange(4, 11))


def test_constructors_and_random_accept_haliax_shape_dicts():
    assert hax.zeros({"batch": 3, "pos": 5}).axes == (Batch, Pos)
    assert hax.random.normal(jax.random.key(0), {"embed": 7}).axes == (Embed,)
    assert hax.linspace("t", start=0.0, stop=1.0).shape == {"t": 50}


_NOT_SUBSET = {
    "where": lambda a, b: hax.where(a > 0, a, b),
    "clip": lambda a, b: hax.clip(a, b, 2.0),
    "isclose": lambda a, b: hax.isclose(a, b),
    "maximum": lambda a, b: hax.maximum(a, b),
    "divmod": lambda a, b: hax.divmod(a, b),
    "hax.sum where=": lambda a, b: hax.sum(a, where=b > 0),
}


@pytest.mark.parametrize("name", sorted(_NOT_SUBSET))
def test_ops_need_one_operand_with_all_axes(name):
    a, b = hax.ones((Batch, Embed)), hax.ones((Pos, Embed))
    with pytest.raises(
        hax.AxisError, match=re.escape(name) + r": cannot broadcast .*broadcast_axis"
    ):
        _NOT_SUBSET[name](a, b)


def test_where_one_argument_form_gives_indices_as_jnp():
    x = hax.random.uniform(jax.random.key(3), (Batch, Pos))
    N = hax.Axis("n", Batch.size * Pos.size)  # noqa: N806
    got = hax.where(x > 0.5, fill_value=-1, new_axis=N)
    want = jnp.where(x.array > 0.5, size=N.size, fill_value=-1)
    assert len(got) == 2 and all(g.axes == (N,) for g in got)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.array, w)
