"""Redraws a run's loss curve: `./bazelw run //levanter:plot -- --run_dir=runs/default`."""

from __future__ import annotations

import os
import pathlib
import sys

from absl import app, flags

from meltemi.levanter.tracking import plot_loss_curve


def main(argv: list[str]) -> int:
    run_dir = pathlib.Path(flags.FLAGS.run_dir).expanduser()
    if not run_dir.is_absolute():
        run_dir = pathlib.Path(os.environ.get("BUILD_WORKING_DIRECTORY") or os.getcwd()) / run_dir
    try:
        out = plot_loss_curve(run_dir, flags.FLAGS.out or None)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0


def run() -> None:
    """Entry point."""
    flags.DEFINE_string("run_dir", None, "A run directory holding metrics.jsonl.", required=True)
    flags.DEFINE_string("out", "", "The PNG to write (default: run_dir/loss.png).")
    app.run(lambda argv: sys.exit(main(argv)))


if __name__ == "__main__":
    run()
