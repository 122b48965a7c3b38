"""//docs:site_test: the documentation site builds in strict mode from a clean checkout."""

from __future__ import annotations

import os
import pathlib
import re

import pytest

from docs import griffe_doctests, site


def test_links_are_rewritten_to_pages_and_files(tmp_path):
    root = tmp_path / "repo"
    (root / "data" / "docs").mkdir(parents=True)
    (root / "data" / "docs" / "plot.png").write_bytes(b"png")
    mapping = {"README.md": "index.md", "data/README.md": "libraries/data.md",
               "docs/design/data.md": "design/data.md"}  # fmt: skip
    docs = tmp_path / "docs"
    text = (
        "[design](../docs/design/data.md#stages) ![plot](docs/plot.png) "
        "[home](../README.md) [web](https://example.com) [here](#top)"
    )
    out = site.rewrite_links(text, "data/README.md", "libraries/data.md", mapping, root, docs)
    assert "[design](../design/data.md#stages)" in out
    assert "![plot](../files/data/docs/plot.png)" in out
    assert (docs / "files" / "data" / "docs" / "plot.png").read_bytes() == b"png"
    assert "[home](../index.md)" in out
    assert "[web](https://example.com)" in out and "[here](#top)" in out
    with pytest.raises(site.SiteError, match=r"data/README.md: link to 'gone.md'"):
        site.rewrite_links(
            "[x](gone.md)", "data/README.md", "libraries/data.md", mapping, root, docs
        )


def test_doctests_become_code_blocks():
    text = "Adds.\n\n>>> 1 + 1\n2\n>>> [[0, 1]]\n[[0, 1]]\n\nMore text.\n"
    out = griffe_doctests.fence_doctests(text)
    assert out.splitlines()[2:9] == [
        "```pycon",
        ">>> 1 + 1",
        "2",
        ">>> [[0, 1]]",
        "[[0, 1]]",
        "```",
        "",
    ]
    fenced = "```python\n>>> x\n```"
    assert griffe_doctests.fence_doctests(fenced) == fenced  # already code: untouched


def test_site_builds_strictly(tmp_path):
    root = pathlib.Path.cwd()
    out = tmp_path / "site"
    proc = site.build(root, out, strict=True)
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert (out / "index.html").exists()
    for lib in site.LIBRARIES:
        assert (out / "libraries" / lib / "index.html").exists()
        assert (out / "changelog" / lib / "index.html").exists()
        api = (out / "api" / lib / "index.html").read_text()
        # Every module listed for the API page rendered with members (not an empty page).
        assert len(re.findall(r'class="doc doc-heading"', api)) >= 10, lib
    for wheel in set(site.WHEELS) - set(site.LIBRARIES):  # the hook wheel: no API page
        assert (out / "libraries" / wheel / "index.html").exists()
        assert (out / "changelog" / wheel / "index.html").exists()
    for note in (root / "docs" / "design").glob("*.md"):
        assert (out / "design" / note.stem / "index.html").exists()
    for nb in (root / "docs" / "tutorials").glob("*.ipynb"):
        assert (out / "tutorials" / nb.stem / "index.html").exists()
    haliax_api = (out / "api" / "haliax" / "index.html").read_text()
    assert "named_jit" in haliax_api and "axis_mapping" in haliax_api
    assert os.path.getsize(out / "search" / "search_index.json") > 100_000
