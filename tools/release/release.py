"""Releases one Meltemi library (or the opt-in hook wheel, `--lib=lm-eval`).

    ./bazelw run //tools:release -- --lib=data --bump=minor [--out=dist] [--publish=DIR] [--dry_run]

Bumps the version, moves the changelog's Unreleased entries under it, raises the lower bound
on the new version in the dependents that need it (and only those), builds the wheel and sdist
into --out, checks them with `twine check --strict`, optionally publishes them into a local
PEP 503 index directory (--publish; `pip install --index-url file://DIR meltemi-data`), and
prints the tag to push. It edits the
work tree and commits nothing: review the diff, commit, then create the printed tag.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import sys
import tempfile

from tools.release import release_lib as rl
from tools.wheels import wheel_lib as wl


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", required=True, help=f"one of {', '.join(rl.LIBRARIES)}")
    parser.add_argument("--bump", required=True, help=f"one of {', '.join(rl.BUMPS)}")
    parser.add_argument("--out", default="dist", help="artifact folder (relative to the root)")
    parser.add_argument("--date", default=None, help="release date, YYYY-MM-DD (default: today)")
    parser.add_argument("--publish", default=None, help="also copy into this PEP 503 index dir")
    parser.add_argument("--dry_run", action="store_true", help="print the plan, change nothing")
    args = parser.parse_args(argv)
    root = pathlib.Path(os.environ.get("BUILD_WORKSPACE_DIRECTORY", ".")).resolve()
    try:
        date = datetime.date.fromisoformat(args.date) if args.date else datetime.date.today()
    except ValueError:
        print(f"error: --date={args.date!r} is not YYYY-MM-DD", file=sys.stderr)
        return 2
    try:
        p = rl.plan(root, args.lib, args.bump)
        print(f"meltemi-{p.lib}: {p.old} -> {p.new}")
        for dep in p.raised:
            print(f"  {dep}: requires meltemi-{p.lib}>={p.new} (changed since {p.old})")
        for dep in p.kept:
            print(f"  {dep}: bound kept (unchanged since {p.old})")
        if args.dry_run:
            return 0
        for path in rl.apply(root, p, date):
            print(f"  wrote {path.relative_to(root)}")
        out = (root / args.out).resolve()
        with tempfile.TemporaryDirectory() as tmp:
            src = wl.copy_library(root / p.lib, pathlib.Path(tmp) / p.lib)
            wheel = wl.build(src, out)
        dist_name = wheel.name.split("-")[0]
        sdist = out / f"{dist_name}-{p.new}.tar.gz"
        print(rl.twine_check([wheel, sdist]).strip())
        if args.publish:
            simple = (root / args.publish).resolve()
            for artifact in (wheel, sdist):
                rl.publish(artifact, simple)
            print(f"published to {simple} (pip install --index-url {simple.as_uri()} ...)")
        print(f"built {wheel.relative_to(root) if wheel.is_relative_to(root) else wheel}")
        print(f"tag: {p.tag}")
        print(f"next: git commit -am 'Release {p.tag}' && git tag -a {p.tag} -m {p.tag}")
    except (rl.ReleaseError, wl.WheelCheckError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
