"""The static import rules of the wheel check catch what they claim to catch."""

import pathlib

import pytest

from tools.wheels import wheel_lib as wl

LAYERS = {"haliax": [], "fray": [], "models": ["haliax"], "levanter": ["haliax", "models"]}


def _library(tmp_path: pathlib.Path, lib: str, deps: list[str], source: str) -> pathlib.Path:
    root = tmp_path / lib
    (root / "src" / "meltemi" / lib).mkdir(parents=True)
    listed = ", ".join(f'"{d}"' for d in deps)
    (root / "pyproject.toml").write_text(
        f'[project]\nname = "meltemi-{lib}"\nversion = "0.1.0"\ndependencies = [{listed}]\n'
        '[project.optional-dependencies]\nextra = ["pytest"]\n'
    )
    (root / "src" / "meltemi" / lib / "__init__.py").write_text(source)
    return root


def test_declared_imports_pass(tmp_path):
    src = "import os\nimport packaging\nimport pytest\nimport meltemi.haliax\n"
    root = _library(tmp_path, "models", ["meltemi-haliax", "packaging"], src)
    wl.check_static_imports("models", root, LAYERS)


def test_undeclared_third_party_import_is_named(tmp_path):
    root = _library(tmp_path, "fray", ["packaging"], "import packaging\nimport numpy\n")
    with pytest.raises(wl.WheelCheckError, match=r"__init__.py:2 imports 'numpy'"):
        wl.check_static_imports("fray", root, LAYERS)


def test_higher_layer_import_is_refused(tmp_path):
    root = _library(tmp_path, "haliax", [], "from meltemi.levanter import optim\n")
    with pytest.raises(wl.WheelCheckError, match=r"imports meltemi.levanter \(a higher layer\)"):
        wl.check_static_imports("haliax", root, LAYERS)


def test_declaring_a_higher_layer_is_refused(tmp_path):
    root = _library(tmp_path, "models", ["meltemi-levanter"], "")
    with pytest.raises(wl.WheelCheckError, match="models may only depend on"):
        wl.check_static_imports("models", root, LAYERS)


def test_closure_follows_transitive_requirements():
    from packaging.requirements import Requirement

    dists = wl.closure([Requirement("pytest")])
    assert {"pytest", "pluggy", "iniconfig", "packaging"} <= dists
