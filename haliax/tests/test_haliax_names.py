"""Every public name of Haliax is either provided by `meltemi.haliax` or listed as not provided.

The names come from `data/haliax_names.json` (derived from the marin-haliax wheel named in it).
`data/haliax_not_provided.json` is the one place that lists the names we do not provide, each with
its status: "pending" (not written yet) or "difference" (deliberately left out; the README's
"Differences from Haliax" section must name it and say why).
"""

import importlib
import json
import pathlib
import re

import pytest

_DATA = pathlib.Path(__file__).resolve().parent / "data"
_NAMES = json.loads((_DATA / "haliax_names.json").read_text())
_NOT_PROVIDED = json.loads((_DATA / "haliax_not_provided.json").read_text())
_README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def _ours(module: str):
    try:
        return importlib.import_module(module.replace("haliax", "meltemi.haliax", 1))
    except ImportError:
        return None


def _all_names() -> list[str]:
    return [f"{m}.{n}" for m, v in _NAMES["modules"].items() for n in v["names"]]


def _provided(qualified: str) -> bool:
    module, _, name = qualified.rpartition(".")
    mod = _ours(module)
    return mod is not None and hasattr(mod, name)


def test_name_list_records_its_source_version():
    assert _NAMES["package"] == "marin-haliax"
    assert _NAMES["version"].startswith("0.2.20")
    assert len(_NAMES["modules"]["haliax"]["names"]) == 253  # 254 in __all__, "random" twice


def test_every_haliax_name_is_provided_or_listed():
    unexplained = [q for q in _all_names() if not _provided(q) and q not in _NOT_PROVIDED]
    assert not unexplained, f"Haliax names neither provided nor listed: {unexplained}"


def test_listed_names_are_really_missing():
    stale = [q for q in _NOT_PROVIDED if _provided(q)]
    assert not stale, f"provided now; remove from haliax_not_provided.json: {stale}"
    unknown = [q for q in _NOT_PROVIDED if q not in set(_all_names())]
    assert not unknown, f"not Haliax names: {unknown}"


def test_listed_entries_have_a_known_status_and_reason():
    for q, entry in _NOT_PROVIDED.items():
        assert entry["status"] in ("pending", "difference"), q
        assert entry["why"].strip(), q


def _differences_section() -> str:
    text = _README.read_text()
    m = re.search(r"^## Differences from Haliax\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    return m.group(1) if m else ""


@pytest.mark.parametrize(
    "qualified", sorted(q for q, e in _NOT_PROVIDED.items() if e["status"] == "difference")
)
def test_each_difference_is_explained_in_the_readme(qualified):
    name = qualified.rpartition(".")[2]
    assert f"`{name}`" in _differences_section() or f"`{qualified}`" in _differences_section()


def test_pending_count_is_reported():
    pending = sorted(q for q, e in _NOT_PROVIDED.items() if e["status"] == "pending")
    print(f"{len(pending)} Haliax names pending: {pending}")
