"""The loss-curve PNG of a run."""

from __future__ import annotations

import os
import pathlib

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from meltemi.levanter.tracking._jsonl import read_metrics


def plot_loss_curve(
    run_dir: str | os.PathLike, out: str | os.PathLike | None = None
) -> pathlib.Path:
    """Draws train loss (and eval loss, per validation set) against step from metrics.jsonl.

    Args:
        run_dir: a run directory holding `metrics.jsonl`.
        out: the PNG to write; default `run_dir/loss.png`.

    Returns:
        The path of the PNG.

    Raises:
        FileNotFoundError: `run_dir` has no metrics.jsonl, or it holds no train loss.
    """
    run_dir = pathlib.Path(run_dir)
    records = read_metrics(run_dir / "metrics.jsonl")
    train = [
        (r["step"], r["train/loss"]) for r in records if isinstance(r.get("train/loss"), float)
    ]
    if not train:
        raise FileNotFoundError(
            f"{run_dir / 'metrics.jsonl'} holds no `train/loss` records; pass the run_dir of a "
            "run that trained at least one step."
        )
    out = pathlib.Path(out) if out else run_dir / "loss.png"
    # A Figure on the Agg canvas: no pyplot, so no global backend state is touched.
    fig = Figure(figsize=(7, 4), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.plot(*zip(*train), label="train", linewidth=1)
    eval_keys = sorted(
        {k for r in records for k in r if k.startswith("eval/") and k.endswith("/loss")}
    )
    for key in eval_keys:
        points = [(r["step"], r[key]) for r in records if key in r]
        ax.plot(*zip(*points), "o-", label=key.removesuffix("/loss"), markersize=4)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(run_dir.name)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    return out
