"""Scaling-law experiments: isoflop sweeps, fitted laws and a preregistered prediction.

`Experiment(load_config("levanter/configs/isoflop.py"))` reads a trainer config with a
`sweep` section; `sweep_and_fit()` trains every (budget, model size) run with the ordinary
trainer as fray actors and fits parabolas and power laws; `predict(budget)` preregisters a
prediction (its SHA-256 printed and logged to W&B, outside the run directory); `verify()` does
all of it and trains the predicted-optimal model once the prediction's digest matches the one
recorded (`verify(expect_sha256=...)` for a prediction written by an earlier call). The fits are
plain functions of points (`fit`, `bootstrap`), usable on any data.

Example:
    >>> import math
    >>> from meltemi.levanter.experiments import Point, fit
    >>> pts = [Point(c, n, c / (6 * n), 0.3 * (math.log10(n) - 0.5 * math.log10(c)) ** 2
    ...              + 2 * c**-0.05) for c in (1e10, 1e12) for n in (
    ...              c**0.5 / 10, c**0.5, c**0.5 * 10)]
    >>> round(fit(pts).n_law.exponent, 6)
    0.5
"""

from meltemi.levanter.experiments._experiment import Experiment
from meltemi.levanter.experiments._fit import (
    Fit,
    FitError,
    LossLaw,
    Parabola,
    Point,
    PowerLaw,
    bootstrap,
    fit,
    fit_json,
    fit_loss_law,
    fit_parabola,
    fit_power_law,
    points_of,
)
from meltemi.levanter.experiments._ladder import (
    Ladder,
    RunPlan,
    Shape,
    config_digest,
    shape_of,
    with_values,
)
from meltemi.levanter.experiments._prereg import (
    check_prediction,
    load_prediction,
    parse_digest,
    payload_digest,
    preregistered_line,
    record_in_trackers,
)
from meltemi.levanter.experiments._runner import SweepWorker, make_cluster, read_result, run_all
from meltemi.levanter.experiments._spec import (
    FAMILIES,
    METRICS,
    SweepConfigError,
    SweepRunError,
    SweepSpec,
    sweep_section,
    sweep_spec,
)

__all__ = [
    "FAMILIES",
    "METRICS",
    "Experiment",
    "Fit",
    "FitError",
    "Ladder",
    "LossLaw",
    "Parabola",
    "Point",
    "PowerLaw",
    "RunPlan",
    "Shape",
    "SweepConfigError",
    "SweepRunError",
    "SweepSpec",
    "SweepWorker",
    "bootstrap",
    "check_prediction",
    "config_digest",
    "fit",
    "fit_json",
    "fit_loss_law",
    "fit_parabola",
    "fit_power_law",
    "load_prediction",
    "make_cluster",
    "parse_digest",
    "payload_digest",
    "points_of",
    "preregistered_line",
    "read_result",
    "record_in_trackers",
    "run_all",
    "shape_of",
    "sweep_section",
    "sweep_spec",
    "with_values",
]
