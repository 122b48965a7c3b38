"""wheel_test: builds one library's wheel and checks it installs and imports alone.

Usage (from a Bazel runfiles root): check_wheel.py LIB [MELTEMI_DEP ...]

MELTEMI_DEP lists every Meltemi wheel LIB needs, directly or through another (BUILD's
`meltemi_library_checks(meltemi_deps=...)`); a hook wheel (`[tool.meltemi] startup_hook`) is
checked for what start-up imports instead of for importing `meltemi.<lib>`.
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
    _, _, extras = wl.split_requirements(project)
    # Every Meltemi wheel it needs, directly or through another, and all their requirements.
    names, requirements = wl.meltemi_closure(here, lib)
    meltemi_deps = names[1:]
    if sorted(meltemi_deps) != sorted(build_deps):
        raise wl.WheelCheckError(
            f"{lib}/pyproject.toml needs Meltemi deps {sorted(meltemi_deps)} (directly or "
            f"through them) but {lib}/BUILD's meltemi_library_checks(meltemi_deps=...) says "
            f"{sorted(build_deps)}"
        )
    wl.check_static_imports(lib, here / lib, layers)

    tmp = pathlib.Path(os.environ.get("TEST_TMPDIR", tempfile.mkdtemp()))
    wheels = []
    for name in names:
        src = wl.copy_library(here / name, tmp / "src" / name)
        wheels.append(wl.build(src, tmp / "dist", sdist=name == lib))
    stem = wl.normalize(project["name"]).replace("-", "_")
    if not list((tmp / "dist").glob(f"{stem}-*.tar.gz")):
        raise wl.WheelCheckError(f"no sdist built for {lib}")
    installs = wl.check_wheel_contents(wheels[0], lib, pyproject)
    hook = wl.startup_hook(pyproject)
    where = f"exactly {installs}" if hook else f"{len(installs)} files, all in meltemi/{lib}/"
    print(f"{wheels[0].name} installs {where}")

    if hook is not None:
        # Two environments that differ only by the hook wheel.
        dists = wl.closure(requirements)
        without = wl.make_env(tmp / "venv-without", wheels[1:], dists)
        with_hook = wl.make_env(tmp / "venv-with", wheels, dists)
        print(f"meltemi-{lib}:", wl.check_hook(without, with_hook, hook["module"]))
        print(f"meltemi-{lib}: wheel and sdist build, install with their deps, hook OK")
        return 0

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
