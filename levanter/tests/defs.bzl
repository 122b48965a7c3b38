"""levanter_test: one pytest target per levanter/tests/<name>.py, with the shared test files."""

load("//tools/python:defs.bzl", "pytest_test")

def levanter_test(name, size = "medium", files = None, data = [], deps = [], **kwargs):
    """A pytest target for `tests/<name>.py` of //levanter (or for several test files).

    Every target gets the shipped configs (`:configs`), the tests' helper modules
    (`tests/_*.py`, `dashboard_testing.py`) and `conftest.py` (its compilation cache), so a
    test that starts using a helper needs no BUILD edit.

    Args:
        name: the test file's name without `.py` (also the target's name).
        size: Bazel's test size.
        files: the names of the test files under tests/ (without `.py`), run in one process,
            when they are not just `name`.
        data: runtime files besides the shared ones.
        deps: py_library deps besides `:levanter`.
        **kwargs: passed to pytest_test (shard_count, tags, ...).
    """
    pytest_test(
        name = name,
        size = size,
        srcs = ["tests/%s.py" % f for f in (files or [name])],
        data = [":configs"] + native.glob([
            "tests/_*.py",
            "tests/conftest.py",
            "tests/dashboard_testing.py",
        ]) + data,
        deps = [":levanter"] + deps,
        **kwargs
    )
