"""Runs the examples in the public docstrings of a package and all its modules.

Usage: doctest_main.py meltemi.haliax [more packages...]

Private modules (a path component starting with `_`) are run too when the public package
re-exports from them: their docstrings are what users read through `help()`. Modules whose
import needs an optional extra that is not installed are reported and skipped.
"""

from __future__ import annotations

import doctest
import importlib
import os
import pkgutil
import sys

from tools.python import test_env


def _modules(package_name: str):
    package = importlib.import_module(package_name)
    yield package
    for info in pkgutil.walk_packages(package.__path__, prefix=package_name + "."):
        if ".tests" in info.name or info.name.endswith("__main__"):
            continue
        try:
            yield importlib.import_module(info.name)
        except ModuleNotFoundError as e:
            print(f"doctest: skipping {info.name}: optional dependency {e.name!r} missing")


def main(argv: list[str]) -> int:
    test_env.isolate_home()
    test_env.compile_fast()
    test_env.private_compile_cache()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    failed = attempted = 0
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    for package_name in argv:
        for module in _modules(package_name):
            result = doctest.testmod(module, optionflags=flags, verbose=False)
            failed += result.failed
            attempted += result.attempted
    print(f"doctest: {attempted} examples, {failed} failed")
    if attempted == 0:
        print("doctest: no examples found; public docstrings should carry runnable examples")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
