"""Builds Meltemi wheels and checks that each installs and imports alone.

The check a library's `wheel_test` runs:

1. static: every `import` in the library's sources names the standard library, the library
   itself, a Meltemi library it declares (and that sits below it in `layers.json`), or a
   third-party distribution it declares (as a dependency or an extra);
2. dynamic: its wheel (plus the wheels of the Meltemi libraries it declares) is installed into
   a fresh virtualenv that holds nothing but its declared third-party dependencies and their own
   dependencies (linked from the build venv, so nothing is downloaded), and every module of the
   library is imported there: once without extras (skipping the modules listed under
   `[tool.meltemi] extra_modules`), once with every extra.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv

from packaging.requirements import Requirement

LIBRARIES = ("haliax", "fray", "data", "models", "levanter")


class WheelCheckError(Exception):
    """A library's packaging or imports break the rules above."""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def load_layers(path: pathlib.Path) -> dict[str, list[str]]:
    layers = json.loads(path.read_text())
    return {k: v for k, v in layers.items() if not k.startswith("_")}


def read_pyproject(lib_dir: pathlib.Path) -> dict:
    return tomllib.loads((lib_dir / "pyproject.toml").read_text())


def copy_library(src: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """Copies a library folder (following Bazel's runfiles symlinks) to `dest`."""
    shutil.copytree(src, dest, symlinks=False, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def build(lib_dir: pathlib.Path, outdir: pathlib.Path, sdist: bool = True) -> pathlib.Path:
    """Builds the wheel (and sdist) of `lib_dir` into `outdir` and returns the wheel's path."""
    outdir.mkdir(parents=True, exist_ok=True)
    kinds = ["--wheel", "--sdist"] if sdist else ["--wheel"]
    cmd = [sys.executable, "-m", "build", "--no-isolation", *kinds, "--outdir", str(outdir)]
    proc = subprocess.run([*cmd, str(lib_dir)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise WheelCheckError(f"building {lib_dir.name} failed:\n{proc.stdout}\n{proc.stderr}")
    name = normalize(read_pyproject(lib_dir)["project"]["name"]).replace("-", "_")
    wheels = sorted(outdir.glob(f"{name}-*.whl"))
    if not wheels:
        raise WheelCheckError(f"no wheel for {name} in {outdir}")
    return wheels[-1]


def split_requirements(project: dict) -> tuple[list[str], list[Requirement], dict]:
    """Returns (meltemi library deps, third-party requirements, extras)."""
    meltemi, third_party = [], []
    for spec in project.get("dependencies", []):
        req = Requirement(spec)
        if normalize(req.name).startswith("meltemi-"):
            meltemi.append(normalize(req.name).removeprefix("meltemi-"))
        else:
            third_party.append(req)
    extras = {
        k: [Requirement(s) for s in v] for k, v in project.get("optional-dependencies", {}).items()
    }
    return meltemi, third_party, extras


def closure(requirements: list[Requirement]) -> set[str]:
    """Every installed distribution that `requirements` pull in (normalised names)."""
    seen: set[str] = set()
    todo = [(r, frozenset(r.extras)) for r in requirements]
    while todo:
        req, extras = todo.pop()
        name = normalize(req.name)
        key = name + "[" + ",".join(sorted(extras)) + "]"
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError as e:
            raise WheelCheckError(f"{name} is required but not in the lock's venv") from e
        for spec in dist.requires or []:
            sub = Requirement(spec)
            if sub.marker is None or any(
                sub.marker.evaluate({"extra": e}) for e in (extras or {""})
            ):
                todo.append((sub, frozenset(sub.extras)))
    return {k.split("[")[0] for k in seen}


def top_level_entries(dist_name: str) -> set[str]:
    """The site-packages entries (packages, modules, .dist-info, .pth) of a distribution."""
    dist = md.distribution(dist_name)
    entries = set()
    for f in dist.files or []:
        first = f.parts[0]
        if first != ".." and first != "__pycache__":
            entries.add(first)
    return entries


def import_names(dist_names: set[str]) -> set[str]:
    """Top-level import names provided by the given distributions."""
    names = set()
    for top, dists in md.packages_distributions().items():
        if any(normalize(d) in dist_names for d in dists):
            names.add(top)
    return names


def _imports_of(path: pathlib.Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, node.lineno))
    return found


def check_static_imports(lib: str, lib_dir: pathlib.Path, layers: dict[str, list[str]]) -> None:
    """Raises WheelCheckError listing every import the library does not declare."""
    project = read_pyproject(lib_dir)["project"]
    meltemi_deps, third_party, extras = split_requirements(project)
    problems = []
    for dep in meltemi_deps:
        if dep not in layers[lib]:
            problems.append(
                f"pyproject.toml declares meltemi-{dep}, but {lib} may only depend on "
                f"{layers[lib] or 'no other Meltemi library'} (tools/wheels/layers.json)"
            )
    allowed_dists = {normalize(r.name) for r in third_party}
    allowed_dists |= {normalize(r.name) for reqs in extras.values() for r in reqs}
    allowed_names = import_names(allowed_dists)
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for path in sorted((lib_dir / "src").rglob("*.py")):
        rel = path.relative_to(lib_dir)
        for module, line in _imports_of(path):
            parts = module.split(".")
            top = parts[0]
            if top == "meltemi":
                other = parts[1] if len(parts) > 1 else None
                if other is not None and other != lib and other not in meltemi_deps:
                    why = (
                        "a higher layer"
                        if other not in layers[lib]
                        else "not declared in pyproject.toml"
                    )
                    problems.append(f"{rel}:{line} imports meltemi.{other} ({why})")
            elif top not in stdlib and top not in allowed_names:
                problems.append(
                    f"{rel}:{line} imports {top!r}, which no declared dependency provides: "
                    f"add its distribution to [project.dependencies] (or an extra) in "
                    f"{lib}/pyproject.toml"
                )
    if problems:
        raise WheelCheckError(f"meltemi-{lib}:\n  " + "\n  ".join(problems))


def make_env(root: pathlib.Path, wheels: list[pathlib.Path], dists: set[str]) -> pathlib.Path:
    """A fresh venv holding `wheels` plus links to the given installed distributions."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    python = root / "bin" / "python"
    site = pathlib.Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    outer_site = pathlib.Path(sysconfig.get_paths()["purelib"])
    for dist in sorted(dists):
        for entry in top_level_entries(dist):
            target = site / entry
            if not target.exists() and (outer_site / entry).exists():
                target.symlink_to(outer_site / entry)
    if not wheels:
        return python
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", str(python)]
    proc = subprocess.run(
        [*pip, "install", "-q", "--no-deps", "--no-index", *map(str, wheels)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise WheelCheckError(f"installing {[w.name for w in wheels]} failed:\n{proc.stderr}")
    return python


_IMPORT_ALL = """
import importlib, pkgutil, sys, traceback
lib, skip = sys.argv[1], set(sys.argv[2:])
import meltemi
assert getattr(meltemi, "__file__", None) is None, "meltemi must be a PEP 420 namespace"
pkg = importlib.import_module("meltemi." + lib)
failures = []
names = [pkg.__name__] + [
    m.name for m in pkgutil.walk_packages(pkg.__path__, prefix=pkg.__name__ + ".")
]
for name in names:
    if name in skip:
        continue
    try:
        importlib.import_module(name)
    except Exception:
        failures.append(name + ":\\n" + traceback.format_exc(limit=3))
print("imported", len(names) - len(skip & set(names)), "modules")
if failures:
    print("\\n".join(failures))
    sys.exit(1)
"""


def import_all(python: pathlib.Path, lib: str, skip: list[str]) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [str(python), "-I", "-c", _IMPORT_ALL, lib, *skip],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
    )
    if proc.returncode != 0:
        raise WheelCheckError(
            f"meltemi-{lib} does not import with only its declared dependencies:\n"
            f"{proc.stdout}\n{proc.stderr}"
        )
    return proc.stdout.strip()
