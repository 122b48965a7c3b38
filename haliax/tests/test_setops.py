"""unique / bincount / searchsorted / nonzero with static result axes, against numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meltemi.haliax as hax

Pos, Embed = hax.make_axes(pos=5, embed=7)


def _vals():
    raw = np.array(
        [
            [3, 1, 3, 2, 1, 9, 3],
            [2, 2, 5, 1, 0, 3, 3],
            [0, 9, 9, 1, 2, 3, 5],
            [1, 1, 1, 1, 1, 1, 1],
            [5, 3, 2, 0, 9, 9, 2],
        ]
    )
    return hax.named(jnp.asarray(raw), (Pos, Embed)), raw


def test_unique_values_of_all_elements():
    x, raw = _vals()
    u = np.unique(raw)
    out = hax.unique(x, hax.Axis("u", len(u)))
    assert out.axes == (hax.Axis("u", len(u)),)
    np.testing.assert_array_equal(out.array, u)


def test_unique_all_matches_numpy_and_inverse_rebuilds_the_input():
    x, raw = _vals()
    u, idx, inv, cnt = np.unique(raw, return_index=True, return_inverse=True, return_counts=True)
    U = hax.Axis("u", len(u))
    values, first, inverse, counts = hax.unique_all(x, U)
    np.testing.assert_array_equal(values.array, u)
    np.testing.assert_array_equal(first.array, idx)
    np.testing.assert_array_equal(counts.array, cnt)
    assert inverse.axes == (Pos, Embed)
    np.testing.assert_array_equal(values[{"u": inverse}].array, raw)
    v2, c2 = hax.unique_counts(x, U)
    np.testing.assert_array_equal(c2.array, cnt)
    v3, i3 = hax.unique_inverse(x, U)
    np.testing.assert_array_equal(i3.array, inv.reshape(raw.shape))
    np.testing.assert_array_equal(hax.unique_values(x, U).array, u)


def test_unique_pads_with_fill_value_when_the_axis_is_larger():
    x, raw = _vals()
    n = len(np.unique(raw))
    out = hax.unique(x, hax.Axis("u", n + 3), fill_value=-1)
    np.testing.assert_array_equal(out.array[n:], [-1, -1, -1])


def test_unique_slices_along_an_axis_replace_that_axis():
    raw = np.array([[1, 2], [3, 4], [1, 2], [0, 0], [3, 4]])
    x = hax.named(jnp.asarray(raw), (Pos, hax.Axis("c", 2)))
    U = hax.Axis("u", 3)
    vals, inv = hax.unique(x, U, axis="pos", return_inverse=True)
    assert vals.axes == (U, hax.Axis("c", 2))
    np.testing.assert_array_equal(vals.array, np.unique(raw, axis=0))
    assert inv.axes == (Pos,)
    np.testing.assert_array_equal(inv.array, np.unique(raw, axis=0, return_inverse=True)[1].ravel())


def test_bincount_with_named_weights():
    Seq = hax.Axis("seq", 11)
    ids = hax.named(jax.random.randint(jax.random.key(0), (11,), 0, 5), Seq)
    w = hax.random.uniform(jax.random.key(1), Seq)
    Bins = hax.Axis("bin", 7)
    out = hax.bincount(ids, Bins, weights=w)
    assert out.axes == (Bins,)
    ref = np.bincount(np.asarray(ids.array), np.asarray(w.array), minlength=7)
    np.testing.assert_allclose(out.array, ref, rtol=1e-6)


def test_bincount_of_two_axes_says_to_flatten():
    x, _ = _vals()
    with pytest.raises(hax.AxisError, match="ravel"):
        hax.bincount(x, hax.Axis("bin", 10))


def test_searchsorted_keeps_the_axes_of_v():
    a = hax.named(jnp.array([1.0, 3.0, 5.0, 7.0, 9.0]), Pos)
    v = hax.random.uniform(jax.random.key(2), (hax.Axis("q", 3), Embed), maxval=10.0)
    for side in ("left", "right"):
        out = hax.searchsorted(a, v, side=side)
        assert out.axes == v.axes
        np.testing.assert_array_equal(
            out.array, np.searchsorted(np.asarray(a.array), np.asarray(v.array), side=side)
        )
    assert hax.searchsorted(a, 4.0).axes == ()


def test_nonzero_returns_one_index_array_per_axis():
    x, raw = _vals()
    N = hax.Axis("n", 40)
    rows, cols = hax.nonzero(x > 2, size=N, fill_value=-1)
    r, c = np.nonzero(raw > 2)
    assert rows.axes == cols.axes == (N,)
    np.testing.assert_array_equal(rows.array[: len(r)], r)
    np.testing.assert_array_equal(cols.array[: len(c)], c)
    assert (np.asarray(rows.array[len(r) :]) == -1).all()


def test_set_ops_work_under_jit():
    x, raw = _vals()
    f = jax.jit(lambda x: hax.unique(x, hax.Axis("u", 6)))
    np.testing.assert_array_equal(f(x).array, np.unique(raw))
