"""Prints a multislice job's status: `./bazelw run //levanter:status -- --run_dir=DIR`.

The job state and one row per slice (index, state, pid, restarts, last exit, start time,
duration, peak memory), from `run_dir/status.json`, which the launcher rewrites as the job
changes. `--watch` redraws it every `--interval` seconds until interrupted.
"""

from __future__ import annotations

import os
import pathlib
import sys
import time

from absl import app, flags

from meltemi.levanter.status import format_status, read_status


def _run_dir(text: str) -> pathlib.Path:
    path = pathlib.Path(text).expanduser()
    if not path.is_absolute():
        path = pathlib.Path(os.environ.get("BUILD_WORKING_DIRECTORY") or os.getcwd()) / path
    return path


def main(argv: list[str]) -> int:
    run_dir = _run_dir(flags.FLAGS.run_dir)
    watch, interval = flags.FLAGS.watch, flags.FLAGS.interval
    if interval <= 0:
        print(f"error: --interval={interval}: must be > 0 seconds, e.g. --interval=2",
              file=sys.stderr)  # fmt: skip
        return 2
    while True:
        try:
            text = format_status(read_status(run_dir))
        except FileNotFoundError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        if watch:
            sys.stdout.write("\x1b[H\x1b[2J")  # clear the terminal, then redraw
        print(text, flush=True)
        if not watch:
            return 0
        try:
            time.sleep(interval)
        except KeyboardInterrupt:
            return 0


def run() -> None:
    """Entry point."""
    flags.DEFINE_string("run_dir", None, "A multislice run directory.", required=True)
    flags.DEFINE_bool("watch", False, "Redraw the status every --interval seconds.")
    flags.DEFINE_float("interval", 2.0, "Seconds between redraws with --watch.")
    app.run(lambda argv: sys.exit(main(argv)))


if __name__ == "__main__":
    run()
