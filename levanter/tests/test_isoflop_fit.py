"""The scaling-law fits against synthetic data whose exponents are known."""

import math

import numpy as np
import pytest

from meltemi.levanter.experiments import (
    FitError,
    Point,
    bootstrap,
    fit,
    fit_loss_law,
    fit_parabola,
    fit_power_law,
)

BUDGETS = (1e9, 3e9, 1e10, 3e10, 1e11)
A_TRUE, K_TRUE = 0.43, 0.7  # N_opt = K C^a
E_TRUE, AMP_TRUE, ALPHA_TRUE = 1.3, 0.9, 0.17  # L_opt = E + AMP (C / 1e10)^-alpha
CURVATURE = 0.35


def _n_opt(c):
    return K_TRUE * c**A_TRUE


def _l_opt(c):
    return E_TRUE + AMP_TRUE * (c / 1e10) ** -ALPHA_TRUE


def parabolic_points(noise=0.0, seed=0, sizes=(-0.45, -0.15, 0.2, 0.5)):
    """Isoflop curves that are exact parabolas in log10 N with a known vertex per budget."""
    rng = np.random.default_rng(seed)
    out = []
    for c in BUDGETS:
        for off in sizes:
            n = _n_opt(c) * 10**off
            loss = _l_opt(c) + CURVATURE * off**2 + rng.normal(0, noise)
            out.append(Point(c, n, c / (6 * n), float(loss)))
    return out


def test_exact_parabolas_recover_every_exponent():
    f = fit(parabolic_points())
    assert f.n_law.exponent == pytest.approx(A_TRUE, abs=1e-9)
    # D = C / 6N, so D_opt = C^(1 - a) / (6K).
    assert f.d_law.exponent == pytest.approx(1 - A_TRUE, abs=1e-9)
    assert f.d_law.k == pytest.approx(1 / (6 * K_TRUE), rel=1e-6)
    for p in f.parabolas:
        assert p.n_opt == pytest.approx(_n_opt(p.budget), rel=1e-9)
        assert p.l_opt == pytest.approx(_l_opt(p.budget), abs=1e-9)
        assert p.a == pytest.approx(CURVATURE, rel=1e-9)
        assert not p.at_edge
    law = f.loss_law
    assert not law.e_fixed
    assert law.e == pytest.approx(E_TRUE, abs=1e-4)
    assert law.alpha == pytest.approx(ALPHA_TRUE, abs=1e-4)
    assert f.sigma == pytest.approx(0.0, abs=1e-9)


def test_prediction_extrapolates_the_true_laws():
    f = fit(parabolic_points())
    target = 3 * max(BUDGETS)
    pred = f.predict(target)
    assert pred["n_opt"] == pytest.approx(_n_opt(target), rel=1e-6)
    assert pred["loss"] == pytest.approx(_l_opt(target), abs=1e-4)
    # A model 0.1 decade off the optimum pays the curvature's penalty.
    off = f.predict_model(target, _n_opt(target) * 10**0.1) - pred["loss"]
    assert off == pytest.approx(CURVATURE * 0.01, rel=1e-6)


def test_chinchilla_loss_surface_gives_its_analytic_exponents():
    # L(N, D) = E + A / N^alpha + B / D^beta with D = C / 6N: the compute-optimal N grows as
    # C^(beta / (alpha + beta)) and D as C^(alpha / (alpha + beta)) (Hoffmann et al. 2022).
    e, a, alpha, b, beta = 1.69, 406.4, 0.34, 410.7, 0.28
    points = []
    for c in (1e18, 1e19, 1e20, 1e21):
        guess = (alpha * a / (beta * b)) ** (1 / (alpha + beta)) * (c / 6) ** (
            beta / (alpha + beta)
        )
        for off in np.linspace(-0.3, 0.3, 7):
            n = guess * 10**off
            d = c / (6 * n)
            points.append(Point(c, n, d, e + a / n**alpha + b / d**beta))
    f = fit(points)
    assert f.n_law.exponent == pytest.approx(beta / (alpha + beta), abs=0.01)
    assert f.d_law.exponent == pytest.approx(alpha / (alpha + beta), abs=0.01)


def test_bootstrap_intervals_cover_the_truth_over_many_draws():
    # A 90% interval must contain the true exponent and the true extrapolated loss in most
    # of 12 independent noisy sweeps (each estimates its own noise from 25 residual dof;
    # everything is seeded, so the count is the same on every run).
    sizes = tuple(np.linspace(-0.5, 0.5, 8))
    covered_a = covered_loss = 0
    for seed in range(12):
        points = parabolic_points(noise=0.01, seed=seed, sizes=sizes)
        boot = bootstrap(
            points, fit(points), samples=40, confidence=0.9, seed=seed, predict_at=[3e11]
        )
        lo, hi = boot["intervals"]["a"]
        covered_a += lo < A_TRUE < hi
        lo, hi = boot["intervals"]["predict@3e+11/loss"]
        covered_loss += lo < _l_opt(3e11) < hi
    assert covered_a >= 9 and covered_loss >= 9, (covered_a, covered_loss)


def test_bootstrap_interval_width_scales_with_the_noise():
    widths = {}
    for noise in (0.02, 0.002):
        points = parabolic_points(noise=noise, seed=1)
        f = fit(points)
        boot = bootstrap(points, f, samples=60, confidence=0.9, seed=0)
        lo, hi = boot["intervals"]["a"]
        widths[noise] = hi - lo
    # Ten times the noise, about ten times the interval (not a fixed width).
    assert 4 < widths[0.02] / widths[0.002] < 25, widths


def test_bootstrap_without_noise_is_a_point():
    points = parabolic_points()
    boot = bootstrap(points, fit(points), samples=20, confidence=0.9)
    lo, hi = boot["intervals"]["a"]
    assert hi - lo == pytest.approx(0.0, abs=1e-9)
    assert boot["samples"] == 20 and boot["failed"] == 0


def test_a_curve_without_minimum_is_an_error_naming_the_budget():
    points = [Point(1e10, n, 1e10 / (6 * n), -((math.log10(n) - 4) ** 2)) for n in (1e3, 1e4, 1e5)]
    with pytest.raises(FitError, match=r"budget 1e\+10: the loss is not convex in log N"):
        fit_parabola(points)


def test_a_minimum_outside_the_sizes_is_flagged():
    points = [Point(1e10, n, 1e10 / (6 * n), (math.log10(n) - 6) ** 2) for n in (1e3, 1e4, 1e5)]
    assert fit_parabola(points).at_edge


def test_few_budgets_fix_the_irreducible_loss_at_zero():
    c = np.array([1e9, 1e10, 1e11])
    law = fit_loss_law(c, 2.0 * (c / 1e10) ** -0.1)
    assert law.e_fixed and law.e == 0.0
    assert law.alpha == pytest.approx(0.1, abs=1e-9)
    assert law(1e12) == pytest.approx(2.0 * 100**-0.1, rel=1e-9)


def test_a_budget_without_minimum_is_left_out_when_not_strict():
    points = parabolic_points()
    bad = [Point(5e11, n, 5e11 / (6 * n), -((math.log10(n) - 5) ** 2)) for n in (1e4, 1e5, 1e6)]
    with pytest.raises(FitError, match=r"budget 5e\+11"):
        fit(points + bad)
    f = fit(points + bad, strict=False)
    assert len(f.parabolas) == len(BUDGETS)
    assert len(f.excluded) == 1 and "5e+11" in f.excluded[0]
    assert f.n_law.exponent == pytest.approx(A_TRUE, abs=1e-9)


def test_a_power_law_of_an_unbounded_optimum_is_a_fit_error():
    with pytest.raises(FitError, match=r"needs finite positive values, got inf among 2: an "
                       r"isoflop parabola this flat has no usable minimum"):  # fmt: skip
        fit_power_law([1e10, 1e12], [1e3, math.inf])
    with pytest.raises(FitError, match=r"out of range \(log k="):
        fit_power_law([1e10, 1e12], [1e300, 1e3])


def test_a_bootstrap_draw_with_a_flat_parabola_is_dropped_not_fatal():
    # The losses of the 4-size micro sweep (2026-11-26): at 3e9 the minimum lies below the
    # smallest size, so with the run noise some redrawn parabolas are nearly flat and put
    # N_opt past any float; those draws are counted as failed (they raised OverflowError).
    n = {4: 1.3e3, 8: 2.9e3, 16: 7.5e3, 32: 2.3e4}
    losses = {
        3e9: {4: 2.7042, 8: 2.7186, 16: 2.7713, 32: 2.8154},
        1e10: {4: 2.6898, 8: 2.5436, 16: 2.5329, 32: 2.5698},
    }
    pts = [Point(c, n[w], c / (6 * n[w]), loss) for c, row in losses.items()
           for w, loss in row.items()]  # fmt: skip
    f = fit(pts, strict=False)
    out = bootstrap(pts, f, samples=50, confidence=0.95, seed=0, predict_at=[3e10])
    assert out["failed"] > 0 and out["samples"] + out["failed"] == 50
    lo, hi = out["intervals"]["predict@3e+10/loss"]
    assert math.isfinite(lo) and math.isfinite(hi) and lo < hi
