"""How paths are shown to the user."""

from __future__ import annotations

import os
import pathlib


def display_path(path: pathlib.Path, cwd: str | os.PathLike | None = None) -> str:
    """`path` relative to the directory the command ran from, or absolute when outside it.

    Example:
        >>> display_path(pathlib.Path("/home/me/runs/a"), cwd="/home/me")
        'runs/a'
        >>> display_path(pathlib.Path("/tmp/runs/a"), cwd="/home/me")
        '/tmp/runs/a'
    """
    if "://" in os.fspath(path):  # gs://bucket/run: shown as it is
        return os.fspath(path)
    if cwd is None:
        cwd = os.environ.get("BUILD_WORKING_DIRECTORY") or os.getcwd()
    try:
        return str(pathlib.Path(path).relative_to(pathlib.Path(cwd)))
    except ValueError:
        return str(path)
