"""Named polynomials against `jnp.poly*`; the coefficient axis keeps the input's name."""

import jax.numpy as jnp
import numpy as np
import pytest

import meltemi.haliax as hax

P = np.array([2.0, -3.0, 0.5, 7.0])  # 4 coefficients
Q = np.array([1.0, 5.0, -2.0])  # 3 coefficients


def _named(c, name="coef"):
    return hax.named(jnp.asarray(c), name)


@pytest.mark.parametrize("name", ["polyadd", "polysub", "polymul"])
def test_binary_poly_ops_match_jnp_and_keep_the_axis_name(name):
    out = getattr(hax, name)(_named(P), Q)
    ref = getattr(jnp, name)(P, Q)
    assert out.axes == (hax.Axis("coef", ref.shape[0]),)
    np.testing.assert_allclose(out.array, ref, rtol=1e-6)


def test_unnamed_inputs_get_the_degree_axis():
    out = hax.polymul(P, Q)
    assert out.axes[0].name == hax.DEFAULT_POLY_AXIS_NAME == "degree"


def test_polydiv_returns_quotient_and_remainder():
    q, r = hax.polydiv(_named(P), _named(Q))
    rq, rr = jnp.polydiv(P, Q)
    np.testing.assert_allclose(q.array, rq, rtol=1e-5)
    np.testing.assert_allclose(r.array, rr, rtol=1e-5, atol=1e-6)


def test_der_int_roots_poly_match_jnp():
    np.testing.assert_allclose(hax.polyder(_named(P), m=2).array, jnp.polyder(P, m=2))
    np.testing.assert_allclose(hax.polyint(_named(P), k=3.0).array, jnp.polyint(P, k=3.0))
    roots = hax.roots(_named(Q))
    np.testing.assert_allclose(
        np.sort_complex(roots.array), np.sort_complex(np.roots(Q)), rtol=1e-5
    )
    np.testing.assert_allclose(hax.poly(roots).array.real, Q / Q[0], rtol=1e-5, atol=1e-5)


def test_polyval_keeps_the_axes_of_x():
    X, Y = hax.make_axes(x=3, y=5)
    x = hax.arange(X).broadcast_axis(Y) * 0.5 + hax.arange(Y) * 0.1
    out = hax.polyval(_named(P), x)
    assert out.axes == x.axes
    np.testing.assert_allclose(out.array, np.polyval(P, np.asarray(x.array)), rtol=1e-5)
    assert float(hax.polyval(P, 2.0)) == pytest.approx(np.polyval(P, 2.0))


def test_polyfit_recovers_coefficients_and_names_the_covariance():
    x = hax.named(jnp.linspace(-1, 1, 11), "pts")
    y = hax.polyval(_named(Q), x)
    fit = hax.polyfit(x, y, 2)
    assert fit.axes == (hax.Axis("pts", 3),)
    np.testing.assert_allclose(fit.array, Q, atol=1e-4)
    _, cov = hax.polyfit(x, y + 0.01 * hax.sin(x * 9), 2, cov=True)
    assert [a.name for a in cov.axes] == ["pts", "pts_cov"]


def test_trim_zeros_and_vander():
    out = hax.trim_zeros(_named(np.array([0.0, 0.0, 1.0, 2.0, 0.0])))
    np.testing.assert_array_equal(out.array, [1.0, 2.0])
    x = _named(np.array([1.0, 2.0, 3.0, 5.0, 7.0]), "x")
    v = hax.vander(x, hax.Axis("deg", 3))
    assert [a.name for a in v.axes] == ["x", "deg"]
    np.testing.assert_allclose(v.array, np.vander(np.asarray(x.array), 3))
    assert hax.vander(x, "deg").shape == {"x": 5, "deg": 5}


def test_two_axis_coefficients_are_an_error():
    with pytest.raises(hax.AxisError, match="must have one axis"):
        hax.polyder(hax.ones(hax.make_axes(a=3, b=5)))
