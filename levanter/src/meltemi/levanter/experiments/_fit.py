"""Scaling-law fits: isoflop parabolas, power laws of the optimum, and their bootstrap.

Per budget `C`, the final loss is fitted as a parabola in `x = log10 N`; its vertex is
`(N_opt, L_opt)` and `D_opt` is read off the budget's own tokens-vs-N line (`D = C / flops
per token`, a straight line in log-log up to the attention term). Across budgets:
`N_opt = k_N C^a`, `D_opt = k_D C^b` (least squares in log-log) and `L_opt = E + A (C/C0)^-alpha`
(`scipy.optimize.curve_fit`, `C0` the geometric mean of the budgets; with fewer than 4
budgets `E` is fixed at 0). Intervals are a parametric bootstrap: every loss is redrawn as
its parabola's value plus Gaussian noise of the pooled residual standard deviation, and
everything is refitted; a prediction's interval adds one more draw of that noise, since the
run that checks it has its own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import optimize


class FitError(ValueError):
    """The data cannot be fitted (e.g. an isoflop curve that bends the wrong way)."""


@dataclasses.dataclass(frozen=True)
class Point:
    """One finished run as the fit sees it."""

    budget: float
    n: float
    tokens: float
    loss: float


@dataclasses.dataclass(frozen=True)
class Parabola:
    """`loss = a x^2 + b x + c` in `x = log10 N` at one budget, and its vertex."""

    budget: float
    a: float
    b: float
    c: float
    n_opt: float
    d_opt: float
    l_opt: float
    at_edge: bool
    rss: float
    dof: int

    def __call__(self, n: Any) -> Any:
        x = np.log10(n)
        return self.a * x**2 + self.b * x + self.c


@dataclasses.dataclass(frozen=True)
class PowerLaw:
    """`y = k C^exponent`."""

    k: float
    exponent: float

    def __call__(self, c: Any) -> Any:
        return self.k * np.asarray(c, dtype=float) ** self.exponent


@dataclasses.dataclass(frozen=True)
class LossLaw:
    """`L = E + A (C / c0)^-alpha`."""

    e: float
    a: float
    alpha: float
    c0: float
    e_fixed: bool

    def __call__(self, c: Any) -> Any:
        return self.e + self.a * (np.asarray(c, dtype=float) / self.c0) ** -self.alpha


@dataclasses.dataclass(frozen=True)
class Fit:
    """Everything fitted from one set of runs."""

    parabolas: tuple[Parabola, ...]
    n_law: PowerLaw
    d_law: PowerLaw
    loss_law: LossLaw
    sigma: float
    curvature: float
    excluded: tuple[str, ...] = ()

    def predict(self, budget: float) -> dict[str, float]:
        """N_opt, D_opt and L_opt at a budget."""
        return {
            "n_opt": float(self.n_law(budget)),
            "d_opt": float(self.d_law(budget)),
            "loss": float(self.loss_law(budget)),
        }

    def predict_model(self, budget: float, n: float) -> float:
        """The loss of a model of `n` at `budget`: L_opt plus the mean curvature's penalty."""
        off = math.log10(n / self.n_law(budget))
        return float(self.loss_law(budget) + self.curvature * off**2)


def fit_parabola(points: Sequence[Point]) -> Parabola:
    """The isoflop parabola of one budget's points (at least 3 sizes).

    Raises:
        FitError: fewer than 3 distinct sizes, or a curve with no minimum (a <= 0).

    Example:
        >>> pts = [Point(1e12, n, 1e12 / (6 * n), (math.log10(n) - 5) ** 2 + 1) for n in
        ...        (1e4, 1e5, 1e6)]
        >>> round(fit_parabola(pts).n_opt)
        100000
    """
    budget = points[0].budget
    x = np.log10([p.n for p in points])
    y = np.array([p.loss for p in points])
    if len(set(x.tolist())) < 3:
        raise FitError(f"budget {budget:.3g}: a parabola needs 3 sizes, got {len(set(x))}.")
    coef, rss, *_ = np.polyfit(x, y, 2, full=True)
    a, b, c = (float(v) for v in coef)
    if not a > 0:
        raise FitError(
            f"budget {budget:.3g}: the loss is not convex in log N (a={a:.3g}); the sweep has no "
            "minimum here (widen sweep.widths or add sizes)."
        )
    x_opt = -b / (2 * a)
    log_d = np.polyfit(x, np.log10([p.tokens for p in points]), 1)
    return Parabola(
        budget=float(budget),
        a=a,
        b=b,
        c=c,
        n_opt=float(10**x_opt),
        d_opt=float(10 ** np.polyval(log_d, x_opt)),
        l_opt=float(c - b * b / (4 * a)),
        at_edge=bool(x_opt < x.min() or x_opt > x.max()),
        rss=float(rss[0]) if len(rss) else 0.0,
        dof=len(x) - 3,
    )


def fit_power_law(budgets: Sequence[float], values: Sequence[float]) -> PowerLaw:
    """`values = k budgets^exponent` by least squares in log-log.

    Example:
        >>> law = fit_power_law([1e10, 1e12], [1e3, 1e4])
        >>> round(law.exponent, 6)
        0.5
    """
    bad = [v for v in values if not (math.isfinite(v) and v > 0)]
    if bad:
        raise FitError(
            f"a power law of the optimum needs finite positive values, got {bad[0]!r} among "
            f"{len(values)}: an isoflop parabola this flat has no usable minimum (add sizes or "
            "budgets)."
        )
    slope, intercept = np.polyfit(np.log(budgets), np.log(values), 1)
    if not (math.isfinite(slope) and math.isfinite(intercept) and intercept < 700):
        raise FitError(
            f"a power law of the optimum is out of range (log k={intercept:.3g}, exponent "
            f"{slope:.3g}): the minima {list(values)} are not a law (add sizes or budgets)."
        )
    return PowerLaw(float(math.exp(intercept)), float(slope))


def fit_loss_law(
    budgets: Sequence[float], losses: Sequence[float], start: LossLaw | None = None
) -> LossLaw:
    """`L = E + A (C/c0)^-alpha`; `E` fixed at 0 with fewer than 4 budgets.

    `start` (e.g. the law of the data a bootstrap sample was drawn from) is where the
    least-squares search begins; by default a guess from a pure power law.

    Raises:
        FitError: the losses do not fall with compute.
    """
    c = np.asarray(budgets, dtype=float)
    y = np.asarray(losses, dtype=float)
    c0 = float(np.exp(np.mean(np.log(c))))
    if len(c) < 4:
        law = fit_power_law(c / c0, y)
        if law.exponent >= 0:
            raise FitError(f"L_opt does not fall with compute: {y.tolist()} at {c.tolist()}.")
        return LossLaw(0.0, law.k, -law.exponent, c0, True)

    def f(cc, e, a, alpha):
        return e + a * (cc / c0) ** -alpha

    def jac(cc, e, a, alpha):
        u = cc / c0
        power = u**-alpha
        return np.stack([np.ones_like(u), power, -a * power * np.log(u)], axis=1)

    lo = float(y.min())
    pure = fit_power_law(c / c0, y)
    p0 = [0.5 * lo, max(float(pure.k) - 0.5 * lo, 1e-3), max(-pure.exponent * 2, 0.05)]
    if start is not None and not start.e_fixed:
        p0 = [min(start.e, 0.99 * lo), start.a, min(max(start.alpha, 1e-3), 4.9)]
    try:
        (e, a, alpha), _ = optimize.curve_fit(
            f, c, y, p0=p0, jac=jac, bounds=([0.0, 1e-9, 1e-4], [lo, np.inf, 5.0]), maxfev=20000
        )
    except (RuntimeError, ValueError) as err:
        raise FitError(f"L_opt(C) = E + A C^-alpha did not converge: {err}") from None
    return LossLaw(float(e), float(a), float(alpha), c0, False)


def fit(points: Sequence[Point], *, strict: bool = True, start: LossLaw | None = None) -> Fit:
    """Parabolas per budget, then the three laws across budgets.

    Args:
        points: the runs.
        strict: a budget without a minimum is an error; otherwise it is left out of the
            laws and named in `Fit.excluded` (while at least 2 budgets remain).
        start: where the loss law's search begins (see `fit_loss_law`).

    Raises:
        FitError: fewer than 2 (usable) budgets, or a budget without a minimum when strict.
    """
    by_budget: dict[float, list[Point]] = {}
    for p in points:
        by_budget.setdefault(p.budget, []).append(p)
    parabolas_list, excluded = [], []
    for c in sorted(by_budget):
        try:
            parabolas_list.append(fit_parabola(by_budget[c]))
        except FitError as e:
            if strict:
                raise
            excluded.append(str(e))
    if len(parabolas_list) < 2:
        detail = f" ({'; '.join(excluded)})" if excluded else ""
        raise FitError(
            f"the laws need at least 2 budgets with a minimum, got {len(parabolas_list)}{detail}."
        )
    parabolas = tuple(parabolas_list)
    budgets = [p.budget for p in parabolas]
    dof = sum(p.dof for p in parabolas)
    sigma = math.sqrt(sum(p.rss for p in parabolas) / dof) if dof else 0.0
    return Fit(
        parabolas=parabolas,
        n_law=fit_power_law(budgets, [p.n_opt for p in parabolas]),
        d_law=fit_power_law(budgets, [p.d_opt for p in parabolas]),
        loss_law=fit_loss_law(budgets, [p.l_opt for p in parabolas], start),
        sigma=sigma,
        curvature=float(np.mean([p.a for p in parabolas])),
        excluded=tuple(excluded),
    )


def _fitted(f: Fit, points: Sequence[Point]) -> np.ndarray:
    by_budget = {p.budget: p for p in f.parabolas}
    return np.array([float(by_budget[p.budget](p.n)) for p in points])


def bootstrap(
    points: Sequence[Point],
    f: Fit,
    *,
    samples: int,
    confidence: float,
    seed: int = 0,
    predict_at: Sequence[float] = (),
) -> dict[str, Any]:
    """Percentile intervals of every fitted quantity (parametric bootstrap, see the module).

    Args:
        points: the runs that were fitted.
        f: their fit.
        samples: bootstrap draws (refits that fail, a parabola without a minimum, are
            dropped and counted).
        confidence: e.g. 0.95 for the 2.5th and 97.5th percentiles.
        seed: the draws' seed.
        predict_at: budgets at which to give prediction intervals (N_opt, D_opt, loss).

    Returns:
        `{"samples": used, "failed": dropped, "intervals": {name: [lo, hi]}}`, names `a`, `b`,
        `alpha`, `E`, `A`, `n_opt@C`, `d_opt@C`, `l_opt@C` per budget, and `predict@C`
        entries `n_opt`, `d_opt`, `loss` (the loss with one run's noise added).
    """
    rng = np.random.default_rng(seed)
    used = {p.budget for p in f.parabolas}
    points = [p for p in points if p.budget in used]
    base = _fitted(f, points)
    draws: dict[str, list[float]] = {}
    failed = 0

    def add(name: str, value: float) -> None:
        draws.setdefault(name, []).append(float(value))

    for _ in range(samples):
        noisy = base + rng.normal(0.0, f.sigma, size=len(points))
        resampled = [
            dataclasses.replace(p, loss=float(y)) for p, y in zip(points, noisy, strict=True)
        ]
        try:
            g = fit(resampled, start=f.loss_law)
        except FitError:
            failed += 1
            continue
        add("a", g.n_law.exponent)
        add("b", g.d_law.exponent)
        add("alpha", g.loss_law.alpha)
        add("E", g.loss_law.e)
        add("A", g.loss_law.a)
        for p in g.parabolas:
            add(f"n_opt@{p.budget:.6g}", p.n_opt)
            add(f"d_opt@{p.budget:.6g}", p.d_opt)
            add(f"l_opt@{p.budget:.6g}", p.l_opt)
        for c in predict_at:
            pred = g.predict(c)
            add(f"predict@{c:.6g}/n_opt", pred["n_opt"])
            add(f"predict@{c:.6g}/d_opt", pred["d_opt"])
            add(f"predict@{c:.6g}/loss", pred["loss"] + rng.normal(0.0, f.sigma))
    tail = 100 * (1 - confidence) / 2
    intervals = {
        k: [float(np.percentile(v, tail)), float(np.percentile(v, 100 - tail))]
        for k, v in draws.items()
    }
    return {"samples": samples - failed, "failed": failed, "intervals": intervals}


def fit_json(f: Fit) -> dict[str, Any]:
    """The fit as plain JSON values."""
    return {
        "parabolas": [dataclasses.asdict(p) for p in f.parabolas],
        "n_opt_law": {"k": f.n_law.k, "a": f.n_law.exponent, "form": "N_opt = k * C^a"},
        "d_opt_law": {"k": f.d_law.k, "b": f.d_law.exponent, "form": "D_opt = k * C^b"},
        "loss_law": {
            "E": f.loss_law.e,
            "A": f.loss_law.a,
            "alpha": f.loss_law.alpha,
            "C0": f.loss_law.c0,
            "E_fixed": f.loss_law.e_fixed,
            "form": "L_opt = E + A * (C / C0)^-alpha",
        },
        "sigma": f.sigma,
        "curvature": f.curvature,
        "excluded": list(f.excluded),
    }


def points_of(records: Sequence[Mapping[str, Any]], metric: str) -> list[Point]:
    """Fit points from finished-run records (`budget`, `n_params`, `tokens`, the metric)."""
    return [Point(r["budget"], r["n_params"], r["tokens"], r[metric]) for r in records]
