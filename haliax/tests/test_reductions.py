"""Reductions added for Haliax parity (nan*, amax/amin/ptp/product, trace, nanarg*, nancum*),
compared with numpy on odd, distinct axis sizes (batch 3, pos 5, embed 7)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meltemi.haliax as hax

Batch, Pos, Embed = hax.make_axes(batch=3, pos=5, embed=7)


def _with_nans(seed=0):
    x = np.array(jax.random.normal(jax.random.key(seed), (3, 5, 7)))
    x[0, 1, 2] = np.nan
    x[2, 4, 0] = np.nan
    return hax.named(jnp.asarray(x), (Batch, Pos, Embed)), x


@pytest.mark.parametrize(
    "name", ["nansum", "nanmean", "nanmax", "nanmin", "nanprod", "nanstd", "nanvar"]
)
def test_nan_reductions_skip_nans_like_numpy(name):
    x, raw = _with_nans()
    out = getattr(hax, name)(x, axis=(Batch, "embed"))
    assert out.axes == (Pos,)
    np.testing.assert_allclose(out.array, getattr(np, name)(raw, axis=(0, 2)), rtol=1e-5)


@pytest.mark.parametrize("name,ref", [("amax", np.max), ("amin", np.min), ("product", np.prod)])
def test_haliax_reduction_aliases_match_numpy(name, ref):
    x, raw = _with_nans(1)
    x = hax.nan_to_num(x)
    raw = np.nan_to_num(raw)
    np.testing.assert_allclose(getattr(hax, name)(x, "pos").array, ref(raw, axis=1), rtol=1e-5)


def test_ptp_is_max_minus_min_and_respects_where():
    x, raw = _with_nans(2)
    x, raw = hax.nan_to_num(x), np.nan_to_num(raw)
    np.testing.assert_allclose(hax.ptp(x, "embed").array, np.ptp(raw, axis=2), rtol=1e-6)
    keep = hax.arange(Embed) < 4
    masked = hax.ptp(x, "embed", where=keep)
    np.testing.assert_allclose(masked.array, np.ptp(raw[:, :, :4], axis=2), rtol=1e-6)


def test_reduction_over_all_axes_returns_a_0d_named_array():
    x, raw = _with_nans(3)
    out = hax.nansum(x)
    assert out.axes == ()
    np.testing.assert_allclose(out.scalar(), np.nansum(raw), rtol=1e-5)


@pytest.mark.parametrize("name", ["nanargmax", "nanargmin"])
def test_nanargs_ignore_nans_and_remove_the_axis(name):
    x, raw = _with_nans(4)
    out = getattr(hax, name)(x, "pos")
    assert out.axes == (Batch, Embed)
    np.testing.assert_array_equal(out.array, getattr(np, name)(raw, axis=1))


@pytest.mark.parametrize("name", ["nancumsum", "nancumprod"])
def test_nan_cumulative_ops_along_named_axis(name):
    x, raw = _with_nans(5)
    out = getattr(hax, name)(x, "embed")
    assert out.axes == x.axes
    np.testing.assert_allclose(out.array, getattr(np, name)(raw, axis=2), rtol=1e-5)


def test_trace_sums_the_diagonal_of_two_named_axes_in_any_order():
    Row, Col = hax.make_axes(row=5, col=7)
    x = hax.random.normal(jax.random.key(6), (Row, Batch, Col))
    out = hax.trace(x, "col", "row", offset=1)
    assert out.axes == (Batch,)
    raw = np.asarray(x.array)
    np.testing.assert_allclose(out.array, np.trace(raw, offset=1, axis1=2, axis2=0), rtol=1e-5)


def test_trace_of_one_axis_twice_is_an_error():
    x = hax.ones((Batch, Pos))
    with pytest.raises(hax.DuplicateAxisError, match="'pos'"):
        hax.trace(x, "pos", Pos)
