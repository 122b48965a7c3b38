"""//docs:tutorials_test: every tutorial runs top to bottom, and its committed .ipynb is current.

Each tutorial is a jupytext percent-format `.py` (the reviewed source). The test executes it
as a notebook with nbclient on this repository's kernel, offline: any error, including a
failed `assert` that states a cell's result, fails the test. The rendered `.ipynb` beside it
(with outputs, for the site) must hold the same cells as the `.py`; regenerate it with
`./bazelw run //docs:render_tutorials`.
"""

from __future__ import annotations

import pathlib

import pytest

from docs import tutorials

TUTORIALS = tutorials.sources(pathlib.Path.cwd())


def test_there_are_tutorials():
    assert len(TUTORIALS) >= 1


@pytest.mark.parametrize("source", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_runs(source, tmp_path):
    executed = tutorials.execute(source, workdir=tmp_path)
    errors = [o for c in executed.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors


@pytest.mark.parametrize("source", TUTORIALS, ids=lambda p: p.stem)
def test_rendered_notebook_matches_its_source(source):
    rendered = source.with_suffix(".ipynb")
    assert rendered.exists(), f"{rendered.name} missing: ./bazelw run //docs:render_tutorials"
    assert tutorials.cell_sources(tutorials.read(rendered)) == tutorials.cell_sources(
        tutorials.read(source)
    ), f"{rendered.name} is stale: ./bazelw run //docs:render_tutorials"
