"""The added hax.random distributions: shapes by name, parameters aligned by name, and sample
moments over 100k draws against the distributions' formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meltemi.haliax as hax

N = hax.Axis("n", 100_003)
A, B = hax.make_axes(a=3, b=5)
KEY = jax.random.key(0)


@pytest.mark.parametrize(
    "name,args,mean,var",
    [
        ("exponential", (), 1.0, 1.0),
        ("laplace", (), 0.0, 2.0),
        ("logistic", (), 0.0, np.pi**2 / 3),
        ("rademacher", (), 0.0, 1.0),
        ("gamma", (3.0,), 3.0, 3.0),
        ("beta", (2.0, 5.0), 2 / 7, 10 / (49 * 8)),
        ("t", (7.0,), 0.0, 7 / 5),
        ("pareto", (5.0,), 5 / 4, 5 / (16 * 3)),
        ("weibull_min", (1.0, 2.0), np.sqrt(np.pi) / 2, 1 - np.pi / 4),
        ("poisson", (3.5,), 3.5, 3.5),
    ],
)
def test_sample_moments_match_the_distribution(name, args, mean, var):
    x = np.asarray(getattr(hax.random, name)(KEY, N, *args).array, dtype=np.float64)
    assert abs(x.mean() - mean) < 5 * np.sqrt(var / N.size)
    assert abs(x.var() - var) / var < 0.05


def test_cauchy_median_and_loggamma_mean():
    c = np.asarray(hax.random.cauchy(KEY, N).array)
    assert abs(np.median(c)) < 0.02
    lg = np.asarray(hax.random.loggamma(KEY, N, 2.0).array)
    assert abs(lg.mean() - 0.42278) < 0.01  # digamma(2) = 1 - euler_gamma


def test_parameters_broadcast_by_name():
    lam = hax.named(jnp.array([1.0, 10.0, 100.0]), A)
    # One draw (each new shape compiles the sampler again): the sample axis first, `a` last.
    n = hax.Axis("n", 20_001)
    x = hax.random.poisson(KEY, (n, A), lam)
    assert x.axes == (n, A)
    np.testing.assert_allclose(np.asarray(x.array).mean(0), [1, 10, 100], rtol=0.03)


def test_ball_points_lie_in_the_unit_ball():
    D = hax.Axis("d", 3)
    x = hax.random.ball(KEY, (hax.Axis("n", 1001),), D)
    assert [a.name for a in x.axes] == ["n", "d"]
    assert (np.linalg.norm(np.asarray(x.array), axis=1) <= 1 + 1e-6).all()


def test_choice_draws_slices_with_probabilities():
    a = hax.broadcast_to(hax.arange(A), (A, B)) * 10 + hax.arange(B)
    p = hax.named(jnp.array([0.0, 0.25, 0.75]), A)
    out = hax.random.choice(KEY, hax.Axis("n", 20_001), a, "a", p=p)
    assert [x.name for x in out.axes] == ["n", "b"]
    rows = np.asarray(out.array)[:, 0] // 10
    assert (rows != 0).all() and abs((rows == 2).mean() - 0.75) < 0.01
    with pytest.raises(hax.AxisError, match="p must have exactly the axis 'a'"):
        hax.random.choice(KEY, N, a, "a", p=hax.ones(B))


def test_categorical_with_extra_sample_axes():
    logits = hax.named(jnp.log(jnp.array([0.2, 0.3, 0.5])), A)
    out = hax.random.categorical(KEY, logits, A, shape=(hax.Axis("n", 30_001),))
    assert [x.name for x in out.axes] == ["n"]
    np.testing.assert_allclose(
        np.bincount(np.asarray(out.array)) / 30_001, [0.2, 0.3, 0.5], atol=0.01
    )
    with pytest.raises(hax.AxisError, match="cannot be in shape"):
        hax.random.categorical(KEY, logits, A, shape=(A,))


def test_independent_permutation_shuffles_each_slice_separately():
    x = hax.arange(hax.Axis("b", 11)).broadcast_axis(A)
    out = hax.random.permutation(KEY, x, "b", independent=True)
    raw = np.asarray(out.rearrange(("a", "b")).array)
    assert all(sorted(r) == list(range(11)) for r in raw)
    assert len({tuple(r) for r in raw}) > 1
