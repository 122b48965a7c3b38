"""Counts how much of Haliax's own test suite passes on marin-haliax and on `meltemi.haliax`.

Runs the `tests/` folder of stanford-crfm/haliax twice, each in a pytest subprocess writing a
JUnit XML report: once against marin-haliax (the reference, from a site directory holding it),
once against `meltemi.haliax` with `haliax` aliased to it by `haliax/tests/upstream/conftest.py`.
Both runs get 8 fake CPU devices (as Haliax's CI) and the test suite's fast-compile XLA flags.
Nothing is deselected: every upstream test counts. Prints JSON:

    {"marin_passed": N, "meltemi_passed": M, "both_passed": B,
     "meltemi_over_marin": B / N,  # of the tests passing on marin-haliax, the share on ours
     "failing": {"test_ops.py": ["test_ops.py::test_tile", ...], ...},  # pass on marin, not ours
     ...}

Usage (from the repository root):

    .venv/bin/python haliax/tools/upstream_compat.py --marin-site /tmp/mh_site \\
        [--upstream-repo /work/.mirror/stanford-crfm+haliax/repo | --tests-dir DIR] \\
        [--files test_ops.py test_axis.py] [--out result.json]

marin-haliax into a site directory (it imports aqt, which imports flax and jmp):
    pip download --no-deps marin-haliax==0.2.20.dev202606180959 aqtp jmp flax -d /tmp/mh
    pip install --no-deps --target /tmp/mh_site /tmp/mh/*.whl
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

_REPO = pathlib.Path(__file__).resolve().parents[2]
_ALIAS_CONFTEST = _REPO / "haliax" / "tests" / "upstream" / "conftest.py"
_DEFAULT_MIRROR = pathlib.Path("/work/.mirror/stanford-crfm+haliax/repo")

# The same flags `tools/python/test_env.compile_fast` sets under Bazel (both runs alike).
_FAST_COMPILE = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
    "--xla_cpu_use_fusion_emitters=false",
)

_DEVICE_CONFTEST = '''"""Haliax's CI runs its tests with 8 fake CPU devices."""
import os
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
'''


def export_upstream(repo: pathlib.Path, dest: pathlib.Path, rev: str = "HEAD") -> str:
    """Exports `tests/` and LICENSE of the Haliax git dir at `rev` to `dest`; returns the commit."""
    commit = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", rev], check=True, capture_output=True, text=True
    ).stdout.strip()
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", commit, "tests", "LICENSE"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return commit


def _stage(tests_dir: pathlib.Path, dest: pathlib.Path, conftest: str, files: list[str]) -> None:
    dest.mkdir(parents=True)
    for f in sorted(tests_dir.glob("*.py")):
        if f.name == "conftest.py":
            continue
        if files and f.name.startswith("test") and f.name not in files:
            continue
        shutil.copy(f, dest / f.name)
    (dest / "conftest.py").write_text(conftest)
    (dest / "pytest.ini").write_text("[pytest]\n")


def _run(dest: pathlib.Path, pythonpath: list[str], timeout: float) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(dest), *pythonpath])
    flags = env.get("XLA_FLAGS", "").split()
    env["XLA_FLAGS"] = " ".join(flags + [f for f in _FAST_COMPILE if f not in flags])
    env.setdefault("JAX_PLATFORMS", "cpu")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--continue-on-collection-errors",
        "-c",
        str(dest / "pytest.ini"),
        "--rootdir",
        str(dest),
        "--junitxml",
        str(dest / "junit.xml"),
        str(dest),
    ]
    log = open(dest / "pytest.log", "w")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(cmd, cwd=dest, env=env, stdout=log, stderr=subprocess.STDOUT)


def parse_junit(path: pathlib.Path) -> dict[str, str]:
    """Maps `file.py::test_name[param]` to passed/failed/error/skipped from a JUnit XML report.

    A file that fails to import shows up as one error entry named after the file.
    """
    outcomes: dict[str, str] = {}
    if not path.is_file():
        return outcomes
    for case in ET.parse(path).getroot().iter("testcase"):
        classname = case.get("classname", "")
        name = case.get("name", "")
        parts = classname.split(".") if classname else []
        if parts:
            # classname is `module[.Class]` (rootdir-relative, dots for slashes)
            file = parts[0] + ".py"
            test_id = "::".join([file, *parts[1:], name])
        else:
            test_id = name  # collection error: name is the module path
        if case.find("failure") is not None:
            outcome = "failed"
        elif case.find("error") is not None:
            outcome = "error"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        outcomes[test_id] = outcome
    return outcomes


def summarize(marin: dict[str, str], ours: dict[str, str]) -> dict:
    """The counts and the failing ids (passing on marin-haliax, not on ours) per file."""
    marin_ok = {t for t, o in marin.items() if o == "passed"}
    ours_ok = {t for t, o in ours.items() if o == "passed"}
    both = marin_ok & ours_ok
    failing: dict[str, list[str]] = {}
    for t in sorted(marin_ok - ours_ok):
        failing.setdefault(t.split("::", 1)[0], []).append(t)
    collection_errors = sorted(t for t, o in ours.items() if "::" not in t and o != "passed")
    per_file: dict[str, dict[str, int]] = {}
    for t in marin_ok:
        f = t.split("::", 1)[0]
        d = per_file.setdefault(f, {"marin": 0, "both": 0})
        d["marin"] += 1
        d["both"] += t in ours_ok
    return {
        "marin_passed": len(marin_ok),
        "meltemi_passed": len(ours_ok),
        "both_passed": len(both),
        "meltemi_over_marin": round(len(both) / len(marin_ok), 4) if marin_ok else None,
        "meltemi_only": sorted(ours_ok - marin_ok),
        "per_file": dict(sorted(per_file.items())),
        "collection_errors_meltemi": collection_errors,
        "failing": failing,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--marin-site", required=True, help="site dir holding marin-haliax (+aqt)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--upstream-repo", type=pathlib.Path, default=_DEFAULT_MIRROR)
    src.add_argument("--tests-dir", type=pathlib.Path, help="an exported Haliax tests/ folder")
    p.add_argument("--rev", default="HEAD", help="upstream commit to export (with --upstream-repo)")
    p.add_argument("--files", nargs="*", default=[], help="only these test files (file names)")
    p.add_argument("--workdir", type=pathlib.Path, help="keep the runs here (default: a temp dir)")
    p.add_argument("--out", type=pathlib.Path, help="also write the JSON here")
    p.add_argument("--sequential", action="store_true", help="one run after the other")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    args = p.parse_args(argv)

    work = args.workdir or pathlib.Path(tempfile.mkdtemp(prefix="haliax_upstream_"))
    work.mkdir(parents=True, exist_ok=True)
    commit = None
    tests_dir = args.tests_dir
    if tests_dir is None:
        commit = export_upstream(args.upstream_repo, work / "upstream", args.rev)
        tests_dir = work / "upstream" / "tests"

    marin_dir, ours_dir = work / "marin", work / "meltemi"
    for d in (marin_dir, ours_dir):
        if d.exists():
            shutil.rmtree(d)
    _stage(tests_dir, marin_dir, _DEVICE_CONFTEST, args.files)
    # The alias conftest without the deselect list: every upstream test counts here.
    _stage(tests_dir, ours_dir, _ALIAS_CONFTEST.read_text(), args.files)

    ours_path = [str(_REPO / "haliax" / "src")]
    t0 = time.time()
    runs = []
    for d, path in (
        (marin_dir, [str(pathlib.Path(args.marin_site).resolve())]),
        (ours_dir, ours_path),
    ):
        proc = _run(d, path, args.timeout)
        if args.sequential:
            proc.wait(timeout=args.timeout)
        runs.append(proc)
    for proc in runs:
        try:
            proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    marin = parse_junit(marin_dir / "junit.xml")
    ours = parse_junit(ours_dir / "junit.xml")
    result = {
        "upstream_commit": commit,
        "tests_dir": str(tests_dir),
        "workdir": str(work),
        "seconds": round(time.time() - t0, 1),
        **summarize(marin, ours),
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
