"""Releasing one Meltemi library: version bump, changelog, dependents' bounds, artifacts.

A release of `meltemi-<lib>` (see `release.py` for the command):

1. bumps `version` in `<lib>/pyproject.toml` and `__version__` in its `__init__.py` (and the
   doctest that shows it; a start-up hook wheel such as `lm-eval` has only the first);
2. moves the `## [Unreleased]` entries of `<lib>/CHANGELOG.md` (Keep a Changelog) under a new
   `## [X.Y.Z] - DATE` heading, leaving an empty Unreleased section; an empty Unreleased section
   is an error (nothing to release);
3. raises `meltemi-<lib>>=X.Y.Z` in the dependents that need the new version, and only those:
   a dependent needs it when its sources changed since `<lib>`'s previous release (the commit
   tagged `meltemi-<lib>-v<old>`, else the last commit that changed `<lib>`'s version line),
   because only then may it use what the new release added. A dependent that did not change
   still works with the old release, so its bound stays and its users are not forced to upgrade;
4. builds the wheel and sdist and checks their metadata with `twine check`;
5. names the tag, `meltemi-<lib>-vX.Y.Z`.
"""

from __future__ import annotations

import dataclasses
import datetime
import pathlib
import re
import subprocess
import sys

from packaging.requirements import Requirement
from packaging.version import Version

from tools.wheels import wheel_lib as wl

# Every wheel released from this repository: the libraries and the opt-in hook wheels.
LIBRARIES = wl.WHEELS
BUMPS = ("major", "minor", "patch")
UNRELEASED = "## [Unreleased]"


class ReleaseError(Exception):
    """A release cannot proceed; the message says why and what to do."""


def bump(version: str, part: str) -> str:
    """`bump("0.1.3", "minor") == "0.2.0"`; `part` is one of major, minor, patch."""
    if part not in BUMPS:
        raise ReleaseError(f"--bump={part!r} is not one of {', '.join(BUMPS)}")
    v = Version(version)
    if v.pre or v.post or v.dev or v.local:
        raise ReleaseError(f"version {version!r} is not a plain X.Y.Z release; fix it by hand")
    major, minor, patch = (list(v.release) + [0, 0])[:3]
    if part == "major":
        return f"{major + 1}.0.0"
    if part == "minor":
        return f"{major}.{minor + 1}.0"
    return f"{major}.{minor}.{patch + 1}"


_VERSION_LINE = re.compile(r'^version = "([^"]+)"$', re.MULTILINE)


def read_version(pyproject_text: str) -> str:
    found = _VERSION_LINE.findall(pyproject_text)
    if len(found) != 1:
        raise ReleaseError('pyproject.toml must have exactly one line `version = "X.Y.Z"`')
    return found[0]


def set_version(pyproject_text: str, new: str) -> str:
    read_version(pyproject_text)
    return _VERSION_LINE.sub(f'version = "{new}"', pyproject_text, count=1)


def set_init_version(init_text: str, old: str, new: str) -> str:
    """Updates `__version__ = "old"` and a doctest line `'old'` after `>>> ...__version__`."""
    line = f'__version__ = "{old}"'
    if init_text.count(line) != 1:
        raise ReleaseError(f"__init__.py must contain exactly one line {line}")
    text = init_text.replace(line, f'__version__ = "{new}"')
    return re.sub(
        rf"(>>> [^\n]*__version__\n\s*)'{re.escape(old)}'",
        rf"\g<1>'{new}'",
        text,
    )


def release_changelog(text: str, version: str, date: datetime.date, path: str = "") -> str:
    """Moves the Unreleased entries under `## [version] - date`; errors if there are none."""
    where = path or "CHANGELOG.md"
    if text.count(UNRELEASED) != 1:
        raise ReleaseError(f"{where} must have exactly one `{UNRELEASED}` heading")
    if f"## [{version}]" in text:
        raise ReleaseError(f"{where} already has a section for {version}")
    head, rest = text.split(UNRELEASED, 1)
    nxt = re.search(r"^## \[", rest, re.MULTILINE)
    body, tail = (rest[: nxt.start()], rest[nxt.start() :]) if nxt else (rest, "")
    entries = body.strip()
    if not re.search(r"^\s*[-*] ", entries, re.MULTILINE):
        raise ReleaseError(
            f"nothing to release: the {UNRELEASED} section of {where} has no entries; "
            "add them under ### Added / ### Changed / ### Fixed first"
        )
    return (
        f"{head}{UNRELEASED}\n\n## [{version}] - {date.isoformat()}\n\n{entries}\n\n{tail}"
    ).rstrip() + "\n"


def dependents(root: pathlib.Path, lib: str) -> list[str]:
    """The libraries whose pyproject.toml depends on meltemi-<lib>."""
    out = []
    for other in LIBRARIES:
        if other == lib:
            continue
        text = (root / other / "pyproject.toml").read_text()
        if _find_requirement(text, f"meltemi-{lib}") is not None:
            out.append(other)
    return out


def _find_requirement(pyproject_text: str, dist: str) -> str | None:
    for spec in re.findall(r'^\s*"([^"]+)",?\s*$', pyproject_text, re.MULTILINE):
        try:
            if Requirement(spec).name.replace("_", "-").lower() == dist:
                return spec
        except Exception:  # not a requirement line
            continue
    return None


def raise_lower_bound(pyproject_text: str, dist: str, new: str) -> str:
    spec = _find_requirement(pyproject_text, dist)
    if spec is None:
        raise ReleaseError(f"no requirement on {dist} to raise")
    req = Requirement(spec)
    others = [str(s) for s in req.specifier if s.operator not in (">=", "==", "~=")]
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""  # e.g. [harness]
    updated = f"{dist}{extras}>={new}" + ("," + ",".join(others) if others else "")
    if req.marker is not None:  # in a TOML "..." string: single quotes
        updated += "; " + str(req.marker).replace('"', "'")
    return pyproject_text.replace(f'"{spec}"', f'"{updated}"', 1)


def _git(root: pathlib.Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ReleaseError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def previous_release(root: pathlib.Path, lib: str, old: str) -> str:
    """The commit of `lib`'s previous release: its tag, else the last change of its version."""
    tag = f"meltemi-{lib}-v{old}"
    if _git(root, "tag", "--list", tag):
        return _git(root, "rev-list", "-n", "1", tag)
    commit = _git(root, "log", "-n", "1", "--format=%H", "-G", r'^version = "', "--",
                  f"{lib}/pyproject.toml")  # fmt: skip
    if not commit:
        raise ReleaseError(f"cannot find {lib}'s previous release: no tag {tag} and no commit")
    return commit


def changed_since(root: pathlib.Path, lib: str, commit: str) -> bool:
    """Whether `lib`'s sources differ between `commit` and the work tree."""
    return bool(_git(root, "diff", "--name-only", commit, "--", f"{lib}/src"))


@dataclasses.dataclass(frozen=True)
class Plan:
    lib: str
    old: str
    new: str
    tag: str
    raised: tuple[str, ...]  # dependents whose bound is raised
    kept: tuple[str, ...]  # dependents left alone (unchanged since the previous release)


def plan(root: pathlib.Path, lib: str, part: str) -> Plan:
    if lib not in LIBRARIES:
        raise ReleaseError(f"--lib={lib!r} is not one of {', '.join(LIBRARIES)}")
    old = read_version((root / lib / "pyproject.toml").read_text())
    new = bump(old, part)
    since = previous_release(root, lib, old)
    raised, kept = [], []
    for dep in dependents(root, lib):
        (raised if changed_since(root, dep, since) else kept).append(dep)
    return Plan(lib, old, new, f"meltemi-{lib}-v{new}", tuple(raised), tuple(kept))


def apply(root: pathlib.Path, p: Plan, date: datetime.date) -> list[pathlib.Path]:
    """Writes the version, changelog and bounds of plan `p`; returns the files changed."""
    lib_dir = root / p.lib
    changelog = lib_dir / "CHANGELOG.md"
    if not changelog.exists():
        raise ReleaseError(f"{p.lib}/CHANGELOG.md is missing (Keep a Changelog format)")
    edits = {
        lib_dir / "pyproject.toml": set_version((lib_dir / "pyproject.toml").read_text(), p.new),
        changelog: release_changelog(changelog.read_text(), p.new, date, f"{p.lib}/CHANGELOG.md"),
    }
    if p.lib not in wl.HOOKS:  # a hook wheel has no meltemi.<lib> package
        init = lib_dir / "src" / "meltemi" / p.lib / "__init__.py"
        edits[init] = set_init_version(init.read_text(), p.old, p.new)
    for dep in p.raised:
        path = root / dep / "pyproject.toml"
        edits[path] = raise_lower_bound(path.read_text(), f"meltemi-{p.lib}", p.new)
    for path, text in edits.items():  # every edit computed first: a failure writes nothing
        path.write_text(text)
    return list(edits)


def twine_check(files: list[pathlib.Path]) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, files)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise ReleaseError(f"twine check failed:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def publish(artifact: pathlib.Path, simple: pathlib.Path) -> pathlib.Path:
    """Copies a wheel or sdist into a PEP 503 "simple" index directory and rewrites its pages.

    The directory can then be served as is, or used directly with
    `pip install --index-url file://<simple> meltemi-<lib>`.
    """
    import hashlib
    import html

    dist = re.sub(r"[-_.]+", "-", artifact.name.split("-")[0]).lower()
    project = simple / dist
    project.mkdir(parents=True, exist_ok=True)
    target = project / artifact.name
    target.write_bytes(artifact.read_bytes())

    def page(title: str, links: list[tuple[str, str]]) -> str:
        anchors = "\n".join(
            f'    <a href="{html.escape(h)}">{html.escape(t)}</a><br/>' for h, t in links
        )
        return (
            f"<!DOCTYPE html>\n<html>\n  <head><title>{html.escape(title)}</title></head>\n"
            f"  <body>\n{anchors}\n  </body>\n</html>\n"
        )

    files = sorted(p for p in project.iterdir() if p.name != "index.html")
    links = [
        (f"{p.name}#sha256={hashlib.sha256(p.read_bytes()).hexdigest()}", p.name) for p in files
    ]
    (project / "index.html").write_text(page(f"Links for {dist}", links))
    projects = sorted(p.name for p in simple.iterdir() if p.is_dir())
    (simple / "index.html").write_text(page("Simple index", [(f"{n}/", n) for n in projects]))
    return target
