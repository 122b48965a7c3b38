"""Linear (affine) vs Feistel shuffles of sorted data: `bazel run //data:shuffle_report`.

Sorted data (value i / n at index i: think documents ordered by source, date or length) is read
in the order each permutation gives, in batches. An affine shuffle puts consecutive reads a
constant stride apart, so batch statistics move in phases; Feistel looks like a random
permutation. Writes a PNG (default data/docs/shuffle_report.png in the workspace) and prints the
statistics of meltemi.data.shuffle_stats as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from meltemi.data import FeistelPermutation, LinearPermutation
from meltemi.data.shuffle_stats import shuffle_statistics


def _default_output() -> str:
    root = os.environ.get("BUILD_WORKSPACE_DIRECTORY", ".")
    return os.path.join(root, "data", "docs", "shuffle_report.png")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--output", default=None, help="PNG path")
    p.add_argument("--n", type=int, default=200_003, help="number of sorted values")
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    n, b = args.n, args.batch_size
    orders = {
        "linear (a*x+b mod n)": LinearPermutation(n, args.seed)(np.arange(n)),
        "Feistel": FeistelPermutation(n, args.seed)(np.arange(n)),
        "numpy random": np.random.default_rng(args.seed).permutation(n),
    }
    stats = {name: shuffle_statistics(pos, b) for name, pos in orders.items()}
    print(json.dumps({"n": n, "batch_size": b, "seed": args.seed, "statistics": stats}, indent=1))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), dpi=72)
    colors = {"linear (a*x+b mod n)": "tab:red", "Feistel": "tab:blue", "numpy random": "0.6"}
    batches = n // b
    for name, pos in orders.items():
        means = (pos[: batches * b] / n).reshape(batches, b).mean(axis=1)
        axes[0].plot(means[:200], color=colors[name], lw=1, label=name)
    axes[0].set(title=f"batch mean of sorted values (batch {b})", xlabel="step")
    axes[0].legend(fontsize=7)
    for name in ("linear (a*x+b mod n)", "Feistel"):
        pos = orders[name]
        axes[1].scatter(np.arange(1500), pos[:1500] / n, s=1, color=colors[name], label=name)
    axes[1].set(title="read order: value vs position read", xlabel="read position")
    axes[1].legend(fontsize=7, markerscale=6)
    grid = np.linspace(0, 1, 41)
    for name, pos in orders.items():
        gaps = np.abs(np.diff(pos / n))
        axes[2].hist(gaps, bins=grid, density=True, histtype="step", color=colors[name], label=name)
    axes[2].plot(grid, 2 * (1 - grid), "k--", lw=1, label="random: 2(1-x)")
    axes[2].set(title="gap between consecutive reads", xlabel="|v[i+1] - v[i]|", ylim=(0, 4))
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    out = args.output or _default_output()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    import io

    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    # A 32-colour palette keeps the committed PNG small.
    Image.open(buf).convert("RGB").quantize(colors=32).save(out, optimize=True)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
