"""wheel_test: builds one library's wheel and checks it installs and imports alone.

Usage (from a Bazel runfiles root): check_wheel.py LIB [MELTEMI_DEP ...]
"""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile

from tools.python import test_env
from tools.wheels import wheel_lib as wl


def main(argv: list[str]) -> int:
    test_env.isolate_home()
    test_env.compile_fast()
    lib, build_deps = argv[0], argv[1:]
    here = pathlib.Path.cwd()
    layers = wl.load_layers(here / "tools" / "wheels" / "layers.json")
    pyproject = wl.read_pyproject(here / lib)
    project = pyproject["project"]
    meltemi_deps, third_party, extras = wl.split_requirements(project)
    if sorted(meltemi_deps) != sorted(build_deps):
        raise wl.WheelCheckError(
            f"{lib}/pyproject.toml declares Meltemi deps {sorted(meltemi_deps)} but "
            f"{lib}/BUILD's meltemi_library_checks(meltemi_deps=...) says {sorted(build_deps)}"
        )
    wl.check_static_imports(lib, here / lib, layers)

    tmp = pathlib.Path(os.environ.get("TEST_TMPDIR", tempfile.mkdtemp()))
    wheels = []
    for name in [lib, *meltemi_deps]:
        src = wl.copy_library(here / name, tmp / "src" / name)
        wheels.append(wl.build(src, tmp / "dist", sdist=name == lib))
    sdists = list((tmp / "dist").glob("meltemi_" + lib + "-*.tar.gz"))
    if not sdists:
        raise wl.WheelCheckError(f"no sdist built for {lib}")

    # The Meltemi deps' own third-party requirements come along, as pip would install them.
    requirements = list(third_party)
    for dep in meltemi_deps:
        requirements += wl.split_requirements(wl.read_pyproject(here / dep)["project"])[1]
    tool = pyproject.get("tool", {}).get("meltemi", {})
    extra_modules = sorted({m for ms in tool.get("extra_modules", {}).values() for m in ms})

    base = wl.make_env(tmp / "venv-base", wheels, wl.closure(requirements))
    print(f"meltemi-{lib} (no extras):", wl.import_all(base, lib, extra_modules))
    if extras:
        everything = requirements + [r for rs in extras.values() for r in rs]
        full = wl.make_env(tmp / "venv-extras", wheels, wl.closure(everything))
        print(f"meltemi-{lib}[{','.join(extras)}]:", wl.import_all(full, lib, []))
    print(f"meltemi-{lib}: wheel and sdist build, install alone, import OK")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
