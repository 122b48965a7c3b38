"""Isoflop sweeps (`//levanter:isoflop` directories): points, fitted curves, prediction.

The curves are evaluated from the fit `isoflop.json` records (the parabolas in log10 N, the
power laws and the loss law), the same formulas `meltemi.levanter.experiments` plots.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from meltemi.levanter.dashboard._metrics import json_values
from meltemi.levanter.dashboard._root import NotFoundError, RunsRoot
from meltemi.levanter.dashboard._runs import SWEEP_FILE, Runs


def sweep_list(runs: Runs) -> dict[str, Any]:
    """Every sweep under the folder with its runs (see B_api.md)."""
    run_ids, sweep_ids = runs.scan()
    out = []
    for sweep_id in sweep_ids:
        iso = runs.read_json(sweep_id, SWEEP_FILE)
        if not isinstance(iso, dict):
            continue
        prefix = f"{sweep_id}/" if sweep_id else ""
        out.append(
            {
                "id": sweep_id,
                "name": sweep_id.rsplit("/", 1)[-1] or runs.root.url,
                "metric": iso.get("metric"),
                "runs": [r for r in run_ids if r.startswith(prefix) and r != sweep_id],
                "budgets": sorted({p["budget"] for p in iso.get("fit", {}).get("parabolas", [])}),
                "has_prediction": runs.read_json(sweep_id, "prediction.json") is not None,
                "has_verification": runs.read_json(sweep_id, "verification.json") is not None,
            }
        )
    return {"sweeps": out}


def sweep_detail(runs: Runs, sweep_id: str) -> dict[str, Any]:
    """Points, per-budget parabolas, the laws and the prediction of one sweep."""
    iso = runs.read_json(sweep_id, SWEEP_FILE)
    if not isinstance(iso, dict):
        raise NotFoundError(f"sweep {sweep_id!r}: no readable isoflop.json there.")
    metric = iso.get("metric", "loss")
    records = [r for r in iso.get("runs", []) if isinstance(r, dict)]
    points = [
        {
            "run": _run_id(runs.root, sweep_id, r.get("run_dir")),
            "budget": r.get("budget"),
            "n_params": r.get("n_params"),
            "tokens": r.get("tokens"),
            "loss": r.get(metric),
        }
        for r in records
    ]
    fit = iso.get("fit") or {}
    fits = []
    for p in fit.get("parabolas", []):
        ns = [r["n_params"] for r in records if r.get("budget") == p["budget"]] or [p["n_opt"]]
        grid = np.geomspace(min(ns) / 1.3, max(ns) * 1.3, 60)
        x = np.log10(grid)
        loss = p["a"] * x**2 + p["b"] * x + p["c"]
        fits.append(
            {
                **{k: p.get(k) for k in ("budget", "n_opt", "d_opt", "l_opt", "at_edge")},
                "curve": {"n": grid.tolist(), "loss": json_values(loss)},
            }
        )
    prediction = runs.read_json(sweep_id, "prediction.json")
    verification = runs.read_json(sweep_id, "verification.json")
    return {
        "id": sweep_id,
        "metric": metric,
        "points": points,
        "fits": fits,
        "laws": _laws(fit, [p["budget"] for p in fit.get("parabolas", [])], prediction),
        "prediction": _prediction(prediction),
        "verification": _verification(verification),
    }


def _run_id(root: RunsRoot, sweep_id: str, run_dir: Any) -> str | None:
    if not isinstance(run_dir, str) or not run_dir:
        return None
    name = run_dir.rstrip("/").rsplit("/", 1)[-1]
    return "/".join(p for p in (sweep_id, "runs", name) if p)


def _laws(fit: Mapping[str, Any], budgets: Sequence[float], prediction: Any) -> dict | None:
    n_law, d_law, loss_law = fit.get("n_opt_law"), fit.get("d_opt_law"), fit.get("loss_law")
    if not (n_law and d_law and loss_law and budgets):
        return None
    span = list(budgets)
    if isinstance(prediction, dict) and prediction.get("budget"):
        span.append(prediction["budget"])
    c = np.geomspace(min(span) / 1.5, max(span) * 1.5, 50)
    loss = loss_law["E"] + loss_law["A"] * (c / loss_law["C0"]) ** -loss_law["alpha"]
    return {
        "n_opt": {"k": n_law["k"], "a": n_law["a"]},
        "d_opt": {"k": d_law["k"], "b": d_law["b"]},
        "loss": {k: loss_law[k] for k in ("E", "A", "alpha", "C0")},
        "curve": {
            "budget": c.tolist(),
            "n_opt": json_values(n_law["k"] * c ** n_law["a"]),
            "d_opt": json_values(d_law["k"] * c ** d_law["b"]),
            "loss": json_values(loss),
        },
    }


def _prediction(p: Any) -> dict | None:
    if not isinstance(p, dict):
        return None
    predicted, model = p.get("predicted") or {}, p.get("model") or {}
    return {
        "budget": p.get("budget"),
        "n_opt": predicted.get("n_opt"),
        "d_opt": predicted.get("d_opt"),
        "loss": model.get("loss", predicted.get("loss")),
        "interval": model.get("interval") or (predicted.get("interval") or {}).get("loss"),
        "sha256": p.get("sha256"),
    }


def _verification(v: Any) -> dict | None:
    if not isinstance(v, dict):
        return None
    keys = ("budget", "predicted", "interval", "actual", "relative_error", "inside_interval")
    return {k: v.get(k) for k in keys}
