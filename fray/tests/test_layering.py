"""The module graph of meltemi.fray: no cycles, the handle apart from the supervisor and API.

Read from the source with `ast`, so imports under `if TYPE_CHECKING:` and inside functions
count too (a cycle hidden in either is still a cycle).
"""

from __future__ import annotations

import ast
import os

import meltemi.fray

_PACKAGE = "meltemi.fray"
_SRC = os.path.dirname(meltemi.fray.__file__)


def _modules() -> dict[str, ast.Module]:
    out = {}
    for name in sorted(os.listdir(_SRC)):
        if name.endswith(".py"):
            with open(os.path.join(_SRC, name)) as f:
                out[name[:-3]] = ast.parse(f.read(), name)
    return out


def _fray_imports(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if name.startswith(_PACKAGE + "."):
                found.add(name[len(_PACKAGE) + 1 :].split(".")[0])
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _fray_imports(tree) & set(modules) - {m} for m, tree in modules.items()}


def test_fray_modules_import_each_other_without_cycles():
    graph = _graph()
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                cycle = path[path.index(dep) :] + [dep] if dep in path else [module, dep]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if dep not in state:
                visit(dep, path + [dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_the_handle_depends_on_neither_the_cluster_nor_the_supervisor():
    graph = _graph()
    assert graph["_handle"].isdisjoint({"_cluster", "_supervisor"}), graph["_handle"]
    assert "_cluster" not in graph["_supervisor"], graph["_supervisor"]


def test_fray_modules_import_each_other_only_at_module_level():
    local = []
    for module, tree in _modules().items():
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if _fray_imports(fn):
                    local.append(f"{module}.{fn.name}")
    assert local == [], f"function-local imports of fray modules: {local}"


def test_fray_never_imports_jax():
    users = [m for m, tree in _modules().items() if "jax" in _top_level_imports(tree)]
    assert users == []


def _top_level_imports(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names
