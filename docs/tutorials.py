"""Tutorials: jupytext percent-format sources executed as notebooks with nbclient.

./bazelw run //docs:render_tutorials            # executes each docs/tutorials/*.py and
                                                # writes the .ipynb beside it, with outputs
./bazelw run //docs:render_tutorials -- 02      # only tutorials whose name contains "02"
"""

from __future__ import annotations

import os
import pathlib
import sys

import jupytext
import nbclient
import nbformat

TIMEOUT_S = 900  # per cell: the training tutorials run real (small) jobs


def sources(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted((root / "docs" / "tutorials").glob("[0-9][0-9]_*.py"))


def read(path: pathlib.Path) -> nbformat.NotebookNode:
    if path.suffix == ".ipynb":
        return nbformat.read(path, as_version=4)
    return jupytext.read(path)


def cell_sources(nb: nbformat.NotebookNode) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


def execute(source: pathlib.Path, workdir: pathlib.Path) -> nbformat.NotebookNode:
    """Runs the tutorial in a fresh kernel with `workdir` as its working directory.

    The kernel inherits this process's environment (PYTHONPATH with the libraries, the
    isolated HOME of tests); a cell that raises stops the run with `CellExecutionError`.
    """
    nb = read(source)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [env.get("PYTHONPATH", ""), *sys.path] if p)
    client = nbclient.NotebookClient(
        nb,
        timeout=TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(workdir)}},
    )
    with _environ(env):
        client.execute()
    return nb


class _environ:
    def __init__(self, env: dict[str, str]):
        self.env, self.saved = env, None

    def __enter__(self):
        self.saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(self.env)

    def __exit__(self, *exc):
        os.environ.clear()
        os.environ.update(self.saved)


def main(argv: list[str]) -> int:
    import tempfile

    root = pathlib.Path(os.environ.get("BUILD_WORKSPACE_DIRECTORY", ".")).resolve()
    chosen = [s for s in sources(root) if not argv or any(a in s.name for a in argv)]
    for source in chosen:
        with tempfile.TemporaryDirectory() as tmp:
            nb = execute(source, pathlib.Path(tmp))
        for cell in nb.cells:  # reproducible files: no per-run ids or timings
            cell.get("metadata", {}).pop("execution", None)
        out = source.with_suffix(".ipynb")
        nbformat.write(nb, out)
        print(f"wrote {out.relative_to(root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
