"""The floors inside levanter: no upward import, no reach into another subpackage's privates.

`tools/wheels/layers.json` (`_levanter_floors`) lists levanter's subpackages bottom up. Every
module's imports are read with `ast` (module-level and function-level alike: a function-level
import hides a cycle from Python, not from this test). Tests are not checked: they test the
private pieces of the package they are about.
"""

import ast
import json
import os
import pathlib
import subprocess
import sys

import pytest

import meltemi.levanter

_ROOT = pathlib.Path(__file__).resolve().parents[2]
_SRC = pathlib.Path(meltemi.levanter.__file__).resolve().parent
_PKG = "meltemi.levanter"


def _floors() -> dict[str, int]:
    layers = json.loads((_ROOT / "tools" / "wheels" / "layers.json").read_text())
    return {unit: i for i, floor in enumerate(layers["_levanter_floors"]) for unit in floor}


def _unit_of(module: str) -> str | None:
    """`trainer` for `meltemi.levanter.trainer._loop`, `_exit` for `meltemi.levanter._exit`."""
    parts = module.split(".")
    if parts[:2] != ["meltemi", "levanter"] or len(parts) < 3:
        return None
    return parts[2]


def _imports(tree: ast.AST, module: str) -> list[tuple[int, str]]:
    """`(line, imported module or module.name)` of every levanter import, at any depth."""
    package = module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith(_PKG)]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base == "meltemi":
                base_names = [f"meltemi.{a.name}" for a in node.names]
                out += [(node.lineno, n) for n in base_names if n.startswith(_PKG)]
            elif base.startswith(_PKG):
                out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out


def violations(source: str, module: str, floors: dict[str, int]) -> list[str]:
    """What `source` (the text of `module`) imports against the floors: one line each."""
    own = _unit_of(module)
    found = []
    for line, target in _imports(ast.parse(source), module):
        unit = _unit_of(target)
        if unit is None or unit == own or own is None:
            continue
        if unit not in floors:
            found.append(f"{module}:{line}: imports {target}: {unit} is on no floor")
            continue
        if floors[unit] >= floors[own]:
            found.append(
                f"{module}:{line}: imports {target} ({unit}, floor {floors[unit]}) from floor "
                f"{floors[own]} ({own}): an import up or sideways; move the shared piece down"
            )
        private = [p for p in target.split(".")[3:] if p.startswith("_") and not p.startswith("__")]
        if private:
            found.append(
                f"{module}:{line}: imports {target}: {private[0]} is private to {unit}; "
                f"export it from meltemi.levanter.{unit} (its __init__) and import that"
            )
    return found


def _modules() -> list[tuple[str, pathlib.Path]]:
    out = []
    for path in sorted(_SRC.rglob("*.py")):
        rel = path.relative_to(_SRC).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        out.append((".".join([_PKG, *parts]) if parts else _PKG + ".__init__", path))
    return out


def test_every_subpackage_is_on_a_floor():
    floors = _floors()
    units = {_unit_of(m) for m, _ in _modules()} - {"__init__", None}
    assert units, f"no modules under {_SRC}"
    assert not units - set(floors), f"add to _levanter_floors: {sorted(units - set(floors))}"
    assert not set(floors) - units, f"floors name no such module: {sorted(set(floors) - units)}"


def test_no_module_imports_up_or_into_another_subpackages_privates():
    floors = _floors()
    found = []
    for module, path in _modules():
        found += violations(path.read_text(), module, floors)
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("module", "line", "expect"),
    [
        # A function-level upward import (what hid the evaluation <-> trainer cycle).
        ("meltemi.levanter.evaluation._load",
         "def f():\n    from meltemi.levanter.trainer import Trainer\n",
         r"trainer, floor \d+\) from floor \d+ \(evaluation\): an import up"),
        ("meltemi.levanter.runtime._arrays", "from meltemi.levanter import harness\n",
         r"harness, floor \d+\) from floor \d+ \(runtime\)"),
        ("meltemi.levanter.trainer._loop", "import meltemi.levanter.multislice\n",
         r"multislice, floor \d+\) from floor \d+ \(trainer\)"),
        # Sideways: two subpackages of one floor must not import each other.
        ("meltemi.levanter.tracking._plot", "from meltemi.levanter import _exit\n",
         r"\(_exit, floor 3\) from floor 3 \(tracking\)"),
        # Down, but into another subpackage's private module.
        ("meltemi.levanter.evaluation._sets",
         "from meltemi.levanter.config._paths import default_cache_dir\n",
         r"_paths is private to config"),
        ("meltemi.levanter.trainer._eval", "from .._exit import mark\n", None),
        ("meltemi.levanter.trainer._eval", "from meltemi.levanter.trainer._plan import Plan\n",
         None),
    ],
)  # fmt: skip
def test_the_check_sees_an_upward_or_private_import(module, line, expect):
    found = violations(line, module, _floors())
    if expect is None:
        assert found == []
    else:
        assert len(found) == 1 and __import__("re").search(expect, found[0]), found


def test_importing_evaluation_loads_no_trainer_multislice_or_extra_fray():
    """`meltemi.levanter.evaluation` stands below the trainer: importing it (in a fresh process)
    loads no trainer or multislice module, and no fray module beyond what `meltemi.data`
    itself imports (its parallel store builds run on fray)."""
    probe = (
        "import sys, {mod}; "
        "print(sorted(m for m in sys.modules if m.startswith(('meltemi.fray', "
        "'meltemi.levanter.trainer', 'meltemi.levanter.multislice', 'meltemi.levanter.harness'))))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def loaded(mod):
        out = subprocess.run([sys.executable, "-c", probe.format(mod=mod)], env=env,
                             capture_output=True, text=True, check=True)  # fmt: skip
        return set(eval(out.stdout.strip().splitlines()[-1]))

    by_evaluation, by_data = loaded("meltemi.levanter.evaluation"), loaded("meltemi.data")
    assert not {m for m in by_evaluation if not m.startswith("meltemi.fray")}, by_evaluation
    assert by_evaluation == by_data


def test_reading_a_jobs_status_imports_neither_jax_nor_the_trainer():
    """`//levanter:status` reads `status.json` through `meltemi.levanter.status` (bottom floor,
    standard library only), so it starts at once even where the launcher would load JAX."""
    probe = (
        "import sys, meltemi.levanter.main.status; "
        "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith(('meltemi.levanter."
        "trainer', 'meltemi.levanter.multislice', 'meltemi.models'))))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
