"""Bazel macros shared by every Meltemi library.

* `pytest_test`: a native py_test that runs its sources under pytest.
* `meltemi_library_checks`: the checks every library folder carries: its wheel builds and
  installs alone (with only its declared dependencies), its sources pass lint, and the examples
  in its public docstrings run.
"""

def pytest_test(name, srcs, deps = [], args = [], data = [], **kwargs):
    """py_test that runs `srcs` under pytest.

    Args:
        name: target name.
        srcs: test files (test_*.py); conftest.py files can go in srcs or data.
        deps: py_library deps (third-party packages come from the venv toolchain).
        args: extra pytest args.
        data: runtime data.
        **kwargs: passed to py_test (size, shard_count, tags, env, ...).
    """
    native.py_test(
        name = name,
        srcs = srcs + ["//tools/python:pytest_main.py"],
        main = "//tools/python:pytest_main.py",
        # $(rootpath) is relative to the runfiles root of this workspace == the test's cwd.
        args = ["$(rootpath %s)" % s for s in srcs if s.endswith(".py") and s.split("/")[-1].startswith("test")] + args,
        data = data,
        deps = deps + ["//tools/python:test_env"],
        python_version = "PY3",
        srcs_version = "PY3",
        **kwargs
    )

def meltemi_library_checks(name, lib, meltemi_deps = [], doctest = True):
    """Declares the standard checks and file groups of the library folder `//<lib>`.

    Args:
        name: a name for the group of checks (targets are :wheel_test, :lint_test, :doctest).
        lib: the library folder name (haliax, data, fray, models, levanter, or a hook wheel's).
        meltemi_deps: the Meltemi libraries its wheel depends on, directly or through another
            (their wheels are built and installed beside it in the wheel test).
        doctest: whether to declare :doctest over `meltemi.<lib>` (False for a start-up hook
            wheel, which has no `meltemi.*` package).
    """
    native.filegroup(
        name = "package_files",
        srcs = native.glob(["pyproject.toml", "README.md", "CHANGELOG.md", "LICENSE", "src/**"], exclude = ["**/__pycache__/**"]),
        visibility = ["//visibility:public"],
    )

    # What the documentation site links to besides the README: figures, bench results.
    native.filegroup(
        name = "doc_files",
        srcs = native.glob(["*.json", "*.png", "docs/**"], exclude = ["**/__pycache__/**"]),
        visibility = ["//visibility:public"],
    )
    native.filegroup(
        name = "lint_files",
        srcs = native.glob(["**/*.py", "**/*.bzl"], exclude = ["**/__pycache__/**"]) + ["BUILD"],
        visibility = ["//visibility:public"],
    )
    dep_files = ["//%s:package_files" % d for d in meltemi_deps]
    native.py_test(
        name = "wheel_test",
        size = "medium",
        srcs = ["//tools/wheels:check_wheel.py"],
        main = "//tools/wheels:check_wheel.py",
        args = [lib] + meltemi_deps,
        data = [":package_files", "//tools/wheels:layers.json"] + dep_files,
        deps = ["//tools/wheels:wheels", "//tools/python:test_env"],
        python_version = "PY3",
    )
    native.py_test(
        name = "lint_test",
        size = "small",
        srcs = ["//tools/lint:lint.py"],
        main = "//tools/lint:lint.py",
        args = ["$(rootpaths :lint_files)"],
        data = [":lint_files", "//:ruff_config"],
        python_version = "PY3",
    )
    if not doctest:
        return
    native.py_test(
        name = "doctest",
        size = "medium",
        srcs = ["//tools/python:doctest_main.py"],
        main = "//tools/python:doctest_main.py",
        args = ["meltemi." + lib],
        deps = [":" + lib, "//tools/python:test_env"],
        python_version = "PY3",
    )

def lint_filegroup(name = "lint_files"):
    """The package's Python, Starlark and BUILD files, for the root //:lint_test."""
    native.filegroup(
        name = name,
        srcs = native.glob(["*.py", "*.bzl"]) + ["BUILD"],
        visibility = ["//:__pkg__"],
    )
