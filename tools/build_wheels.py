"""Builds the wheel and sdist of every Meltemi library (and the opt-in hook wheel) into dist/.

./bazelw run //tools:build_wheels            # -> dist/meltemi_<lib>-<version>-py3-none-any.whl
./bazelw run //tools:build_wheels -- --out=/tmp/wheels haliax fray lm-eval
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile

from tools.wheels import wheel_lib as wl


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("libraries", nargs="*", default=list(wl.WHEELS))
    parser.add_argument("--out", default="dist", help="output folder (relative to your cwd)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.libraries) - set(wl.WHEELS))
    if unknown:
        parser.error(f"unknown libraries {unknown}; choose from {list(wl.WHEELS)}")
    cwd = pathlib.Path(os.environ.get("BUILD_WORKING_DIRECTORY", "."))
    out = (cwd / args.out).resolve()
    runfiles = pathlib.Path.cwd()
    with tempfile.TemporaryDirectory() as tmp:
        for lib in args.libraries:
            src = wl.copy_library(runfiles / lib, pathlib.Path(tmp) / lib)
            wheel = wl.build(src, out)
            print(f"{lib}: {wheel.name} (+ sdist)")
    print(f"wrote {len(args.libraries)} wheels and sdists to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
