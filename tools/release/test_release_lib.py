"""Release steps, one by one and end to end on a scratch git copy of the six wheels' folders."""

from __future__ import annotations

import datetime
import pathlib
import shutil
import subprocess

import pytest

from tools.release import release
from tools.release import release_lib as rl

CHANGELOG = """# Changelog

## [Unreleased]

### Added

- A new thing.

## [0.1.0] - 2026-11-22

### Added

- First.
"""


def test_bump():
    assert rl.bump("0.1.3", "minor") == "0.2.0"
    assert rl.bump("0.1.3", "patch") == "0.1.4"
    assert rl.bump("0.1.3", "major") == "1.0.0"
    with pytest.raises(rl.ReleaseError, match="--bump='mini' is not one of major, minor, patch"):
        rl.bump("0.1.0", "mini")
    with pytest.raises(rl.ReleaseError, match="not a plain X.Y.Z"):
        rl.bump("0.1.0rc1", "minor")


def test_changelog_moves_unreleased_under_the_version():
    out = rl.release_changelog(CHANGELOG, "0.2.0", datetime.date(2026, 11, 23))
    assert out.index("## [Unreleased]") < out.index("## [0.2.0] - 2026-11-23")
    assert out.index("- A new thing.") > out.index("## [0.2.0]")
    assert out.index("- A new thing.") < out.index("## [0.1.0]")
    unreleased = out.split("## [Unreleased]")[1].split("## [0.2.0]")[0]
    assert unreleased.strip() == ""  # empty again
    with pytest.raises(rl.ReleaseError, match="nothing to release"):
        rl.release_changelog(out, "0.3.0", datetime.date(2026, 11, 24), "data/CHANGELOG.md")
    with pytest.raises(rl.ReleaseError, match="already has a section for 0.1.0"):
        rl.release_changelog(CHANGELOG, "0.1.0", datetime.date(2026, 11, 24))


def test_versions_and_bounds_are_rewritten_exactly():
    pyproject = 'name = "x"\nversion = "0.1.0"\ndependencies = [\n    "meltemi-data>=0.1.0",\n]\n'
    assert 'version = "0.2.0"' in rl.set_version(pyproject, "0.2.0")
    raised = rl.raise_lower_bound(pyproject, "meltemi-data", "0.2.0")
    assert '"meltemi-data>=0.2.0"' in raised and "0.1.0" in raised  # the version line stays
    init = '"""Doc.\n\n>>> m.__version__\n\'0.1.0\'\n"""\n\n__version__ = "0.1.0"\n'
    out = rl.set_init_version(init, "0.1.0", "0.2.0")
    assert "0.1.0" not in out and out.count("0.2.0") == 2


def _git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path):
    """The package files of every wheel in a scratch git repository with one commit."""
    here = pathlib.Path.cwd()
    root = tmp_path / "repo"
    for lib in rl.LIBRARIES:
        shutil.copytree(here / lib, root / lib, ignore=shutil.ignore_patterns("__pycache__"))
    _git(root, "init", "-q")
    _git(root, "-c", "user.email=ci@meltemi", "-c", "user.name=ci", "add", "-A")
    _git(root, "-c", "user.email=ci@meltemi", "-c", "user.name=ci", "commit", "-qm", "base")
    return root


def test_only_dependents_that_changed_get_a_raised_bound(repo):
    # levanter changes after the previous release; models (also above haliax) does not.
    init = repo / "levanter" / "src" / "meltemi" / "levanter" / "__init__.py"
    init.write_text(init.read_text() + "\n# uses something new\n")
    p = rl.plan(repo, "haliax", "minor")
    assert (p.old, p.new, p.tag) == ("0.1.0", "0.2.0", "meltemi-haliax-v0.2.0")
    assert p.raised == ("levanter",)
    assert "models" in p.kept
    rl.apply(repo, p, datetime.date(2026, 11, 23))
    assert '"meltemi-haliax>=0.2.0"' in (repo / "levanter" / "pyproject.toml").read_text()
    assert '"meltemi-haliax>=0.1.0"' in (repo / "models" / "pyproject.toml").read_text()
    assert 'version = "0.2.0"' in (repo / "haliax" / "pyproject.toml").read_text()
    assert "## [0.2.0] - 2026-11-23" in (repo / "haliax" / "CHANGELOG.md").read_text()
    haliax_init = (repo / "haliax" / "src" / "meltemi" / "haliax" / "__init__.py").read_text()
    assert '__version__ = "0.2.0"' in haliax_init and "'0.2.0'" in haliax_init


def test_a_levanter_release_raises_the_hook_wheels_bound_and_keeps_its_extra(repo):
    hook = repo / "lm-eval" / "src" / "_meltemi_lm_eval.py"
    hook.write_text(hook.read_text() + "\n# uses something new\n")
    p = rl.plan(repo, "levanter", "minor")
    assert p.raised == ("lm-eval",)
    rl.apply(repo, p, datetime.date(2026, 11, 23))
    text = (repo / "lm-eval" / "pyproject.toml").read_text()
    assert '"meltemi-levanter[harness]>=0.2.0"' in text and 'version = "0.1.0"' in text


def test_the_hook_wheel_releases_alone(repo, capsys, monkeypatch):
    monkeypatch.setenv("BUILD_WORKSPACE_DIRECTORY", str(repo))
    code = release.main(["--lib=lm-eval", "--bump=patch", "--date=2026-11-23", "--publish=idx"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "meltemi-lm-eval: 0.1.0 -> 0.1.1" in out and "tag: meltemi-lm-eval-v0.1.1" in out
    assert (repo / "dist" / "meltemi_lm_eval-0.1.1-py3-none-any.whl").exists()
    assert (repo / "dist" / "meltemi_lm_eval-0.1.1.tar.gz").exists()
    assert (
        "meltemi_lm_eval-0.1.1.tar.gz#sha256="
        in (repo / "idx" / "meltemi-lm-eval" / "index.html").read_text()
    )
    assert "## [0.1.1] - 2026-11-23" in (repo / "lm-eval" / "CHANGELOG.md").read_text()
    # Its dependency on levanter is not a release of levanter: levanter's files are untouched.
    assert 'version = "0.1.0"' in (repo / "levanter" / "pyproject.toml").read_text()


def test_raising_a_bound_keeps_extras_and_markers():
    text = "    \"meltemi-levanter[harness]>=0.1.0,<1; python_version >= '3.11'\",\n"
    out = rl.raise_lower_bound(text, "meltemi-levanter", "0.2.0")
    assert out == "    \"meltemi-levanter[harness]>=0.2.0,<1; python_version >= '3.11'\",\n"


def test_a_tag_marks_the_previous_release(repo):
    init = repo / "models" / "src" / "meltemi" / "models" / "__init__.py"
    init.write_text(init.read_text() + "\n# changed before the tag\n")
    _git(repo, "-c", "user.email=ci@meltemi", "-c", "user.name=ci", "commit", "-qam", "models")
    _git(repo, "tag", "meltemi-haliax-v0.1.0")  # released after models changed
    p = rl.plan(repo, "haliax", "patch")
    assert p.raised == () and set(p.kept) >= {"models", "levanter"}


def test_release_command_builds_checked_artifacts_and_prints_the_tag(repo, capsys, monkeypatch):
    monkeypatch.setenv("BUILD_WORKSPACE_DIRECTORY", str(repo))
    code = release.main(["--lib=fray", "--bump=minor", "--date=2026-11-23", "--publish=idx"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "meltemi-fray: 0.1.0 -> 0.2.0" in out
    assert "PASSED" in out  # twine check --strict, once per artifact
    assert "tag: meltemi-fray-v0.2.0" in out
    dist = repo / "dist"
    assert (dist / "meltemi_fray-0.2.0-py3-none-any.whl").exists()
    assert (dist / "meltemi_fray-0.2.0.tar.gz").exists()
    page = (repo / "idx" / "meltemi-fray" / "index.html").read_text()
    assert "meltemi_fray-0.2.0-py3-none-any.whl#sha256=" in page
    assert "meltemi_fray-0.2.0.tar.gz#sha256=" in page
    # fray's Unreleased section is now empty: a second release has nothing to release.
    code = release.main(["--lib=fray", "--bump=patch"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: nothing to release")


def test_bad_arguments_are_one_error_line(repo, capsys, monkeypatch):
    monkeypatch.setenv("BUILD_WORKSPACE_DIRECTORY", str(repo))
    assert release.main(["--lib=dta", "--bump=minor"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --lib='dta' is not one of haliax, fray, data, models, levanter, lm-eval\n"
