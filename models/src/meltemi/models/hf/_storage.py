"""Checkpoint locations: local directories, or object storage (`gs://`, `s3://`) via fsspec.

`as_path(directory)` gives a `pathlib.Path` for a local directory and an `etils.epath.Path`
(fsspec underneath: `gcsfs` for `gs://`, `s3fs` for `s3://`) for a URL; both offer the same
`/`, `exists`, `read_text`, `write_text`, `open` and `mkdir`. `read_range` reads a byte range
of one object, so a checkpoint on object storage is read slice by slice, never whole.
"""

from __future__ import annotations

import os
import pathlib
import re
from typing import Any

import fsspec
from etils import epath

_URL = re.compile(r"^[a-z][a-z0-9+.-]*://")


class StorageError(OSError):
    """An object-storage path cannot be reached (e.g. its fsspec filesystem is missing)."""


StorageError.__module__ = "meltemi.models"


def is_url(path: Any) -> bool:
    return bool(_URL.match(str(path)))


def as_path(directory: str | os.PathLike) -> Any:
    """`pathlib.Path` for a local path, `epath.Path` for `gs://...`, `s3://...`."""
    if isinstance(directory, epath.Path) and is_url(directory):
        return directory
    text = os.fspath(directory) if not isinstance(directory, str) else directory
    if is_url(text):
        _filesystem(text)  # fail early, naming the package to install
        return epath.Path(text)
    return pathlib.Path(text)


def _filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as e:
        scheme = url.split("://", 1)[0]
        package = {"gs": "gcsfs", "gcs": "gcsfs", "s3": "s3fs"}.get(scheme, f"an fsspec {scheme}")
        raise StorageError(
            f"{url}: no filesystem for {scheme}:// ({e}); install {package} "
            f"(pip install {package}) or use a local or mounted path"
        ) from None


def read_range(path: Any, start: int, stop: int) -> bytes:
    """Bytes `[start, stop)` of a file (a ranged GET on object storage)."""
    if stop <= start:
        return b""
    if is_url(path):
        fs, inner = _filesystem(str(path))
        return fs.cat_file(inner, start=start, end=stop)
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(stop - start)
