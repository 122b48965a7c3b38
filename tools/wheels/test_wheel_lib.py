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


def _wheel(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    import zipfile

    path = tmp_path / "meltemi_x-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("meltemi_x-0.1.0.dist-info/METADATA", "Name: meltemi-x\n")
        for name, text in files.items():
            zf.writestr(name, text)
    return path


LIBRARY = {"project": {"name": "meltemi-levanter"}}
HOOK = {"tool": {"meltemi": {"startup_hook": {"pth": "x.pth", "module": "_x"}}}}


def test_a_library_wheel_installs_only_its_package(tmp_path):
    ok = _wheel(tmp_path, {"meltemi/levanter/__init__.py": ""})
    assert wl.check_wheel_contents(ok, "levanter", LIBRARY) == ["meltemi/levanter/__init__.py"]


def test_a_pth_in_a_library_wheel_is_refused(tmp_path):
    wheel = _wheel(tmp_path, {"meltemi/levanter/__init__.py": "", "hook.pth": "import _hook\n"})
    pattern = r"installs hook.pth: a .pth runs at the start of every Python process of everyone "
    with pytest.raises(wl.WheelCheckError, match=pattern + "who installs meltemi-levanter"):
        wl.check_wheel_contents(wheel, "levanter", LIBRARY)


def test_a_top_level_module_in_a_library_wheel_is_refused(tmp_path):
    wheel = _wheel(tmp_path, {"meltemi/levanter/__init__.py": "", "_hook.py": ""})
    with pytest.raises(wl.WheelCheckError, match=r"installs _hook.py outside meltemi/levanter/"):
        wl.check_wheel_contents(wheel, "levanter", LIBRARY)


def test_a_hook_wheel_installs_exactly_its_pth_and_module(tmp_path):
    ok = _wheel(tmp_path, {"x.pth": "import _x\n", "_x.py": ""})
    assert wl.check_wheel_contents(ok, "lm-eval", HOOK) == ["_x.py", "x.pth"]
    extra = _wheel(tmp_path, {"x.pth": "import _x\n", "_x.py": "", "meltemi/x/__init__.py": ""})
    with pytest.raises(wl.WheelCheckError, match=r"must install exactly \['_x.py', 'x.pth'\]"):
        wl.check_wheel_contents(extra, "lm-eval", HOOK)
    more = _wheel(tmp_path, {"x.pth": "import _x; import jax\n", "_x.py": ""})
    with pytest.raises(wl.WheelCheckError, match=r"x.pth must hold the one line `import _x`"):
        wl.check_wheel_contents(more, "lm-eval", HOOK)


def _project(root: pathlib.Path, name: str, deps: list[str], extras: str = "") -> None:
    (root / name).mkdir(parents=True)
    listed = ", ".join(f'"{d}"' for d in deps)
    (root / name / "pyproject.toml").write_text(
        f'[project]\nname = "meltemi-{name}"\nversion = "0.1.0"\ndependencies = [{listed}]\n'
        f"[project.optional-dependencies]\n{extras}"
    )


def test_meltemi_closure_follows_dependencies_and_the_extras_they_ask_for(tmp_path):
    _project(tmp_path, "hook", ["meltemi-top[harness]>=0.1"])
    _project(tmp_path, "top", ["meltemi-low", "numpy"], 'harness = ["pytest"]\ngcs = ["fsspec"]\n')
    _project(tmp_path, "low", ["packaging"])
    order, requirements = wl.meltemi_closure(tmp_path, "hook")
    assert order == ["hook", "top", "low"]
    assert sorted(r.name for r in requirements) == ["numpy", "packaging", "pytest"]
    _project(tmp_path, "bad", ["meltemi-top[harnes]"])
    pattern = r"meltemi-top\[harnes\] is required but top/pyproject.toml has no extra 'harnes' "
    with pytest.raises(wl.WheelCheckError, match=pattern + r"\(it has \['gcs', 'harness'\]\)"):
        wl.meltemi_closure(tmp_path, "bad")


def _hooked_env(root: pathlib.Path, hook_source: str | None) -> pathlib.Path:
    python = wl.make_env(root, [], set())
    if hook_source is not None:
        (site,) = root.glob("lib/python*/site-packages")
        (site / "_x.py").write_text(hook_source)
        (site / "x.pth").write_text("import _x\n")
    return python


def test_a_hook_that_imports_only_itself_at_start_up_passes(tmp_path):
    without = _hooked_env(tmp_path / "without", None)
    with_hook = _hooked_env(tmp_path / "with", 'TARGET = "json:dumps"\n')
    assert wl.check_hook(without, with_hook, "_x") == (
        "start-up imports only _x; its target json:dumps imports"
    )


def test_a_hook_that_imports_more_at_start_up_is_refused(tmp_path):
    without = _hooked_env(tmp_path / "without", None)
    with_hook = _hooked_env(tmp_path / "with", 'import json\nTARGET = "json:dumps"\n')
    pattern = r"start-up with the hook wheel imports \[.*'json'.*\] besides '_x' "
    with pytest.raises(
        wl.WheelCheckError, match=pattern + r"\(an environment without it does not\)"
    ):
        wl.check_hook(without, with_hook, "_x")


def test_a_hook_whose_pth_does_not_run_is_refused(tmp_path):
    without = _hooked_env(tmp_path / "without", None)
    with_hook = _hooked_env(tmp_path / "with", 'TARGET = "json:dumps"\n')
    for pth in (tmp_path / "with").glob("lib/python*/site-packages/x.pth"):
        pth.write_text("import os\n")
    with pytest.raises(wl.WheelCheckError, match=r"does not import '_x': .*`import _x`"):
        wl.check_hook(without, with_hook, "_x")


def test_a_hook_whose_target_does_not_import_is_refused(tmp_path):
    without = _hooked_env(tmp_path / "without", None)
    with_hook = _hooked_env(tmp_path / "with", 'TARGET = "no_such_module:Model"\n')
    with pytest.raises(wl.WheelCheckError, match=r"(?s)target does not import.*no_such_module"):
        wl.check_hook(without, with_hook, "_x")
