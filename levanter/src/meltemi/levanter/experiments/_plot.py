"""The figures: isoflop curves with the fitted frontier, and loss against batch size."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from meltemi.levanter.experiments._fit import Fit


def _pyplot():
    import matplotlib  # noqa: PLC0415 (only the binary draws)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def plot_isoflop(
    path: pathlib.Path,
    records: Sequence[Mapping[str, Any]],
    f: Fit,
    *,
    metric: str,
    prediction: Mapping[str, Any] | None = None,
    verification: Mapping[str, Any] | None = None,
) -> pathlib.Path:
    """Three panels: loss vs N per budget (parabolas, minima), N_opt/D_opt vs C, L_opt vs C.

    Args:
        path: the PNG to write.
        records: finished isoflop runs (`budget`, `n_params`, metric).
        f: their fit.
        metric: the fitted key of each record.
        prediction: `prediction.json`, drawn as the extrapolated point with its interval.
        verification: `verification.json`, drawn as the measured point.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), dpi=70)
    budgets = [p.budget for p in f.parabolas]
    colors = plt.cm.viridis(np.linspace(0.1, 0.9, len(budgets)))
    ax = axes[0]
    for p, color in zip(f.parabolas, colors, strict=True):
        pts = [r for r in records if r["budget"] == p.budget]
        n = np.array([r["n_params"] for r in pts])
        ax.scatter(n, [r[metric] for r in pts], color=color, s=18, zorder=3)
        grid = np.geomspace(n.min() / 1.3, n.max() * 1.3, 60)
        ax.plot(grid, p(grid), color=color, lw=1.2, label=f"C={p.budget:.2g}")
        ax.scatter([p.n_opt], [p.l_opt], color=color, marker="*", s=90, edgecolor="k", zorder=4)
    ax.plot([p.n_opt for p in f.parabolas], [p.l_opt for p in f.parabolas], "k--", lw=0.8)
    ax.set(
        xscale="log",
        xlabel="N (non-embedding params + head)",
        ylabel=f"final eval {metric}",
        title="isoflop curves",
    )
    ax.legend(fontsize=7)
    span = list(budgets)
    if prediction is not None:
        span.append(prediction["budget"])
    grid = np.geomspace(min(span) / 1.5, max(span) * 1.5, 50)
    ax = axes[1]
    ax.scatter(budgets, [p.n_opt for p in f.parabolas], color="C0", label="N_opt")
    ax.scatter(budgets, [p.d_opt for p in f.parabolas], color="C1", label="D_opt")
    ax.plot(grid, f.n_law(grid), "C0-", lw=1, label=f"N ~ C^{f.n_law.exponent:.2f}")
    ax.plot(grid, f.d_law(grid), "C1-", lw=1, label=f"D ~ C^{f.d_law.exponent:.2f}")
    ax = axes[2]
    ax.scatter(budgets, [p.l_opt for p in f.parabolas], color="k", label="L_opt (parabola min)")
    law = f.loss_law
    ax.plot(grid, law(grid), "k-", lw=1, label=f"{law.e:.2f} + {law.a:.2f}(C/C0)^-{law.alpha:.2f}")
    if prediction is not None:
        c = prediction["budget"]
        pred = prediction["predicted"]
        axes[1].errorbar(
            [c],
            [pred["n_opt"]],
            yerr=_err(pred["n_opt"], pred["interval"]["n_opt"]),
            fmt="C0D",
            mfc="none",
            capsize=3,
        )
        axes[1].errorbar(
            [c],
            [pred["d_opt"]],
            yerr=_err(pred["d_opt"], pred["interval"]["d_opt"]),
            fmt="C1D",
            mfc="none",
            capsize=3,
        )
        model = prediction["model"]
        ax.errorbar(
            [c],
            [model["loss"]],
            yerr=_err(model["loss"], model["interval"]),
            fmt="rD",
            mfc="none",
            capsize=3,
            label="prediction",
        )
    if verification is not None:
        ax.scatter(
            [verification["budget"]],
            [verification["actual"]],
            color="r",
            marker="o",
            s=30,
            zorder=5,
            label=f"verified ({verification['relative_error']:.1%})",
        )
    axes[1].set(xscale="log", yscale="log", xlabel="C (FLOPs)", title="compute-optimal N, D")
    axes[1].legend(fontsize=7)
    ax.set(xscale="log", xlabel="C (FLOPs)", ylabel=f"L_opt ({metric})", title="loss frontier")
    ax.legend(fontsize=7)
    for a in axes[1:]:  # minor tick labels of a short log axis overlap
        a.xaxis.set_minor_formatter(plt.NullFormatter())
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _err(value: float, interval: Sequence[float]) -> list[list[float]]:
    return [[max(value - interval[0], 0.0)], [max(interval[1] - value, 0.0)]]


def plot_batch(path: pathlib.Path, curves: Mapping[str, Any], *, metric: str) -> pathlib.Path:
    """Loss against batch size, one line per budget, the critical batch size marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4), dpi=70)
    for curve in curves["budgets"]:
        sizes = [p["batch_size"] for p in curve["points"]]
        ax.plot(
            sizes,
            [p[metric] for p in curve["points"]],
            "o-",
            label=f"C={curve['budget']:.2g} (critical {curve['critical_batch_size']})",
        )
        ax.axvline(curve["critical_batch_size"], color=ax.lines[-1].get_color(), ls=":", lw=0.8)
    ax.set(
        xscale="log",
        xlabel="batch size (rows)",
        ylabel=f"final eval {metric}",
        title="loss vs batch size at fixed compute",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
