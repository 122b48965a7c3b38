"""Runs Haliax's own tests against `meltemi.haliax`: `import haliax` resolves to it.

An import hook aliases `haliax` and every `haliax.<sub>` module to `meltemi.haliax` and
`meltemi.haliax.<sub>`: the alias is the very same module object, so `haliax.nn.Linear is
meltemi.haliax.nn.Linear`, and a module that does not exist under `meltemi.haliax` fails to import
exactly as it would for a user porting Haliax code. Tests that need several devices get 8 fake
CPU devices, as Haliax's CI gives them (before jax is imported).

`deselected.txt` beside this file lists the upstream tests that are deliberate differences, one
`file::test  # reason` per line; they are deselected here and listed in the haliax README.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import pathlib
import sys
import types

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

_ALIAS = "haliax"
_TARGET = "meltemi.haliax"


class _AliasLoader(importlib.abc.Loader):
    """Hands back the already imported `meltemi.haliax` module for its `haliax` alias."""

    def __init__(self, module: types.ModuleType):
        self._module = module
        self._spec = module.__spec__

    def create_module(self, spec):
        return self._module

    def exec_module(self, module):
        # The import system stamps the alias spec on the module; keep the real one so that
        # `importlib.reload` and pickling by module name keep working on `meltemi.haliax`.
        module.__spec__ = self._spec


class HaliaxAliasFinder(importlib.abc.MetaPathFinder):
    """Meta path finder mapping `haliax[.x]` to `meltemi.haliax[.x]`."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _ALIAS and not fullname.startswith(_ALIAS + "."):
            return None
        real_name = _TARGET + fullname[len(_ALIAS) :]
        try:
            module = importlib.import_module(real_name)
        except ModuleNotFoundError as e:
            if e.name is not None and (real_name == e.name or real_name.startswith(e.name + ".")):
                return None  # the submodule does not exist: a plain ModuleNotFoundError follows
            raise
        return importlib.machinery.ModuleSpec(
            fullname, _AliasLoader(module), is_package=hasattr(module, "__path__")
        )


def install_alias() -> None:
    """Puts the alias hook first on `sys.meta_path` (idempotent)."""
    if not any(isinstance(f, HaliaxAliasFinder) for f in sys.meta_path):
        for name in [m for m in sys.modules if m == _ALIAS or m.startswith(_ALIAS + ".")]:
            del sys.modules[name]  # a real `haliax` imported earlier must not shadow the alias
        sys.meta_path.insert(0, HaliaxAliasFinder())


install_alias()

_DESELECTED = pathlib.Path(__file__).with_name("deselected.txt")


def _deselected_ids() -> set[str]:
    if not _DESELECTED.is_file():
        return set()
    ids = set()
    for line in _DESELECTED.read_text().splitlines():
        entry = line.split("#", 1)[0].strip()
        if entry:
            ids.add(entry)
    return ids


def pytest_collection_modifyitems(config, items):
    ids = _deselected_ids()
    if not ids:
        return
    here = pathlib.Path(__file__).parent
    keep, drop = [], []
    for item in items:
        rel = pathlib.Path(item.fspath).resolve()
        try:
            rel_name = rel.relative_to(here.resolve()).as_posix()
        except ValueError:
            rel_name = rel.name
        node = (
            rel_name + "::" + item.nodeid.split("::", 1)[1] if "::" in item.nodeid else item.nodeid
        )
        base = node.split("[", 1)[0]
        (drop if node in ids or base in ids else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
