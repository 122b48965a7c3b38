"""lint_test: ruff (check + format check) on Python files, buildifier on Bazel files.

Usage: lint.py FILE... (paths relative to the runfiles root; the ruff config is //:ruff.toml)
The tools come from the workspace venv that runs this script (.venv/bin/ruff and the
npm-installed buildifier under .venv/node), so nothing is downloaded.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

VENV = pathlib.Path(sys.prefix)
RUFF = VENV / "bin" / "ruff"
BUILDIFIER = VENV / "node" / "node_modules" / ".bin" / "buildifier"
BAZEL_NAMES = {"BUILD", "BUILD.bazel", "WORKSPACE"}


def _run(cmd: list[str]) -> bool:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"$ {' '.join(cmd[:4])} ... ({len(cmd)} args) failed:")
        print(proc.stdout + proc.stderr)
    return proc.returncode == 0


def main(paths: list[str]) -> int:
    files = [p for arg in paths for p in arg.split()]
    python = [f for f in files if f.endswith(".py")]
    bazel = [f for f in files if pathlib.Path(f).name in BAZEL_NAMES or f.endswith(".bzl")]
    config = ["--config", "ruff.toml"]
    ok = True
    if python:
        ok &= _run([str(RUFF), "check", "--no-cache", *config, *python])
        ok &= _run([str(RUFF), "format", "--check", "--no-cache", *config, *python])
    if bazel:
        if not BUILDIFIER.exists():
            print(f"buildifier missing at {BUILDIFIER}: run ./bazelw (it installs it)")
            return 1
        ok &= _run(
            [str(BUILDIFIER), "--mode=check", "--lint=warn", "--warnings=-native-py", *bazel]
        )
    print(f"lint: {len(python)} Python and {len(bazel)} Bazel files, {'OK' if ok else 'FAILED'}")
    if not ok:
        print("fix with: .venv/bin/ruff format . && .venv/bin/ruff check --fix . && buildifier")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
