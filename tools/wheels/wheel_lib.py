"""Builds Meltemi wheels and checks that each installs and imports alone.

The check a library's `wheel_test` runs:

1. static: every `import` in the library's sources names the standard library, the library
   itself, a Meltemi library it declares (and that sits below it in `layers.json`), or a
   third-party distribution it declares (as a dependency or an extra);
2. dynamic: its wheel (plus the wheels of the Meltemi libraries it declares) is installed into
   a fresh virtualenv that holds nothing but its declared third-party dependencies and their own
   dependencies (linked from the build venv, so nothing is downloaded), and every module of the
   library is imported there: once without extras (skipping the modules listed under
   `[tool.meltemi] extra_modules`), once with every extra;
3. contents: a library's wheel installs only `meltemi/<lib>/` (no `.pth`, no top-level module:
   whatever a `.pth` names runs at the start of every Python process of everyone who installs
   the wheel). A start-up hook is its own opt-in wheel (`HOOKS`, `[tool.meltemi] startup_hook`):
   it installs exactly its `.pth` and the one module that line imports, and start-up in an
   environment holding it imports that module and nothing else.
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
import zipfile

from packaging.requirements import Requirement

# The libraries, lowest layer first: folder `<lib>/`, wheel `meltemi-<lib>`, package meltemi.<lib>.
LIBRARIES = ("haliax", "fray", "data", "models", "levanter")
# Opt-in wheels that install a start-up hook (`<name>/`, wheel `meltemi-<name>`), no package.
HOOKS = ("lm-eval",)
# Every wheel the repository builds and releases, in dependency order.
WHEELS = LIBRARIES + HOOKS


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


def meltemi_closure(root: pathlib.Path, lib: str) -> tuple[list[str], list[Requirement]]:
    """`lib` and every Meltemi wheel it needs, directly or through another (folder names, `lib`
    first), and the third-party requirements of them all, with the extras that each Meltemi
    requirement asks for (`meltemi-levanter[harness]` brings levanter's `harness` extra)."""
    order: list[str] = []
    requirements: list[Requirement] = []
    seen: set[tuple[str, str]] = set()
    todo = [(lib, "")]
    while todo:
        name, extra = todo.pop(0)
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        if not (root / name / "pyproject.toml").is_file():
            raise WheelCheckError(f"meltemi-{name} is required but {root / name} has no pyproject")
        project = read_pyproject(root / name)["project"]
        if name not in order:
            order.append(name)
        _, third_party, extras = split_requirements(project)
        if extra and extra not in extras:
            raise WheelCheckError(
                f"meltemi-{name}[{extra}] is required but {name}/pyproject.toml has no extra "
                f"{extra!r} (it has {sorted(extras)})"
            )
        requirements += extras[extra] if extra else third_party
        if extra:
            continue  # the extra adds requirements; the library's own deps come with ""
        for spec in project.get("dependencies", []):
            req = Requirement(spec)
            dist = normalize(req.name)
            if dist.startswith("meltemi-"):
                dep = dist.removeprefix("meltemi-")
                todo += [(dep, "")] + [(dep, e) for e in sorted(req.extras)]
    return order, requirements


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


def startup_hook(pyproject: dict) -> dict | None:
    """A hook wheel's `[tool.meltemi] startup_hook` (`{pth = "x.pth", module = "_x"}`) or None."""
    return pyproject.get("tool", {}).get("meltemi", {}).get("startup_hook")


def check_wheel_contents(wheel: pathlib.Path, lib: str, pyproject: dict) -> list[str]:
    """Raises WheelCheckError unless the wheel installs only what its kind may (see the module
    docstring); returns the files it installs (besides its .dist-info)."""
    with zipfile.ZipFile(wheel) as zf:
        files = sorted(n for n in zf.namelist() if not n.split("/")[0].endswith(".dist-info"))
        hook = startup_hook(pyproject)
        if hook is None:
            problems = []
            for name in files:
                if name.endswith(".pth"):
                    problems.append(
                        f"installs {name}: a .pth runs at the start of every Python process of "
                        f"everyone who installs meltemi-{lib}; put a start-up hook in its own "
                        "opt-in wheel with [tool.meltemi] startup_hook (as lm-eval/ does)"
                    )
                elif not name.startswith(f"meltemi/{lib}/"):
                    problems.append(
                        f"installs {name} outside meltemi/{lib}/: ship only the package "
                        '(packages = ["src/meltemi"] in [tool.hatch.build.targets.wheel])'
                    )
        else:
            pth, module = hook["pth"], hook["module"]
            expected = sorted([pth, f"{module}.py"])
            problems = [] if files == expected else [
                f"installs {files}, but a start-up hook wheel must install exactly {expected} "
                "([tool.meltemi] startup_hook and [tool.hatch.build.targets.wheel] only-include)"
            ]  # fmt: skip
            if pth in files and zf.read(pth).decode().strip() != f"import {module}":
                problems.append(f"{pth} must hold the one line `import {module}`")
    if problems:
        raise WheelCheckError(f"{wheel.name}:\n  " + "\n  ".join(problems))
    return files


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


def run_isolated(python: pathlib.Path, program: str, *args: str) -> subprocess.CompletedProcess:
    """`python -I -c program args` from `/`, without this process's PYTHONPATH, JAX on the CPU."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    env["JAX_PLATFORMS"] = "cpu"
    return subprocess.run(
        [str(python), "-I", "-c", program, *args], capture_output=True, text=True, env=env, cwd="/"
    )


def import_all(python: pathlib.Path, lib: str, skip: list[str]) -> str:
    proc = run_isolated(python, _IMPORT_ALL, lib, *skip)
    if proc.returncode != 0:
        raise WheelCheckError(
            f"meltemi-{lib} does not import with only its declared dependencies:\n"
            f"{proc.stdout}\n{proc.stderr}"
        )
    return proc.stdout.strip()


_STARTUP_MODULES = "import sys; print(' '.join(sorted(sys.modules)))"


def startup_modules(python: pathlib.Path) -> set[str]:
    """The modules an interpreter of `python`'s environment has imported when it starts."""
    proc = run_isolated(python, _STARTUP_MODULES)
    if proc.returncode != 0:
        raise WheelCheckError(f"{python} does not start:\n{proc.stderr}")
    return set(proc.stdout.split())


def check_hook(without: pathlib.Path, with_hook: pathlib.Path, module: str) -> str:
    """Checks a hook wheel in two environments that differ only by it: start-up imports exactly
    `module` more, and the hook's registered `module.TARGET` ("pkg.mod:Name") imports."""
    added = startup_modules(with_hook) - startup_modules(without)
    if module not in added:
        raise WheelCheckError(
            f"start-up with the hook wheel does not import {module!r}: its .pth did not run "
            f"(is it installed at the top of site-packages, holding `import {module}`?)"
        )
    also = sorted({m.split(".")[0] for m in added} - {module})
    if also:
        raise WheelCheckError(
            f"start-up with the hook wheel imports {also} besides {module!r} (an environment "
            f"without it does not): its .pth must import only {module!r}, and {module} nothing "
            "at start-up (defer the work to a sys.meta_path finder)"
        )
    program = (
        "import importlib, sys; m = importlib.import_module(sys.argv[1]); "
        "mod, _, name = m.TARGET.partition(':'); getattr(importlib.import_module(mod), name); "
        "print(m.TARGET)"
    )
    proc = run_isolated(with_hook, program, module)
    if proc.returncode != 0:
        raise WheelCheckError(
            f"the hook's target does not import with only the declared dependencies:\n"
            f"{proc.stdout}\n{proc.stderr}"
        )
    return f"start-up imports only {module}; its target {proc.stdout.strip()} imports"
