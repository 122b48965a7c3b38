"""The durable bookkeeping shared by build_store and the pipeline: atomic JSON writes, the
exclusive lock, JSON-lines ledgers; and the driver imports no other module's private names."""

from __future__ import annotations

import ast
import fcntl
import json
import os
import pathlib

import pytest

import meltemi.data
from meltemi.data._ledger import (
    StageLedger,
    append_json_line,
    exclusive_lock,
    read_json_lines,
    write_json,
)

_SRC = pathlib.Path(meltemi.data.__file__).parent


def test_write_json_writes_sorted_indented_json_and_leaves_no_temporary(tmp_path):
    obj = {"b": [1, 2], "a": {"z": 1, "y": None}}
    write_json(tmp_path / "x.json", obj)
    text = (tmp_path / "x.json").read_text()
    assert text == json.dumps(obj, indent=1, sort_keys=True)
    assert os.listdir(tmp_path) == ["x.json"]


def test_a_failed_write_json_keeps_the_old_file_and_removes_its_temporary(tmp_path):
    write_json(tmp_path / "x.json", {"old": 1})
    with pytest.raises(TypeError, match="not JSON serializable"):
        write_json(tmp_path / "x.json", {"new": object()})  # fails halfway through the dump
    assert json.loads((tmp_path / "x.json").read_text()) == {"old": 1}
    assert os.listdir(tmp_path) == ["x.json"]


def test_exclusive_lock_raises_the_given_error_while_another_holder_has_it(tmp_path):
    lock = tmp_path / ".x.lock"
    with open(lock, "a+") as held:  # its own file description, like another process
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(RuntimeError, match="busy: wait") as info:
            with exclusive_lock(lock, RuntimeError("busy: wait")):
                pass
        assert isinstance(info.value.__cause__, BlockingIOError)
    with exclusive_lock(lock, RuntimeError("busy")):  # released: taken at once
        with pytest.raises(RuntimeError, match="held"):
            with exclusive_lock(lock, RuntimeError("held")):  # and exclusive while held
                pass


def test_read_json_lines_skips_torn_and_blank_lines_and_a_missing_file(tmp_path):
    path = tmp_path / "l.jsonl"
    assert list(read_json_lines(path)) == []
    with open(path, "w") as fh:
        append_json_line(fh, {"shard": 0, "b": 1, "a": 2})
        fh.write("\n")
        append_json_line(fh, {"shard": 1}, sync=False)
        fh.write('{"shard": 2, "tor')  # a kill in the middle of a line
    assert path.read_text().splitlines()[0] == '{"a": 2, "b": 1, "shard": 0}'
    assert list(read_json_lines(path)) == [{"a": 2, "b": 1, "shard": 0}, {"shard": 1}]


def test_the_stage_ledger_forgets_a_line_whose_output_is_gone_but_keeps_quarantines(tmp_path):
    kept, gone = tmp_path / "kept.npy", tmp_path / "gone.npy"
    kept.write_bytes(b"x")
    ledger = StageLedger(str(tmp_path))
    ledger.add({"stage": "a", "shard": 0, "output": str(kept)})
    ledger.add({"stage": "a", "shard": 1, "output": str(gone)}, sync=False)
    ledger.add({"stage": "a", "shard": 2, "output": str(gone), "quarantined": True})
    ledger.add({"stage": "a", "plan": {"bands": 11}})
    ledger.sync()
    assert ledger.done("a", 1) is not None  # in this run, the entry counts as written
    again = StageLedger(str(tmp_path))
    assert sorted(again.entries) == [("a", 0), ("a", 2)]
    assert again.done("a", 1) is None and again.plans == {"a": {"bands": 11}}


# Every module of the library: the build and pipeline driver imported `_build._plan`,
# `_sources._file_stat` and `_runner._inline` (now `plan_shards`, `file_stat`, `run_inline`),
# and others `_sources._local`, `_clean._IS_SPACE`, `_minhash._components` (now public names).
_MODULES = sorted(str(p.relative_to(_SRC)) for p in _SRC.rglob("*.py"))


def _private_imports() -> set[tuple[str, str, str]]:
    found = set()
    assert "pipeline/_pipeline.py" in _MODULES
    for name in _MODULES:
        path = _SRC / name
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("meltemi."):
                for alias in node.names:
                    if alias.name.startswith("_"):
                        found.add((name, node.module, alias.name))
    return found


def test_no_module_imports_another_modules_private_names():
    found = _private_imports()
    assert not found, (
        f"private names imported from another module: {sorted(found)}; give each a public "
        f"name in its (private) module and import that"
    )
