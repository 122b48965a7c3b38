"""The runs folder the dashboard serves: a local directory or a bucket path, never outside it.

Every path the server touches is a run id (a path relative to the folder, slash-separated)
checked here: `..` parts, absolute paths and symlinks resolving outside the folder raise
`OutsideRootError` (403); the scan never follows a symlink.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import posixpath
from collections.abc import Iterator

import fsspec

#: Subdirectories of a run that never hold runs (and can be large): the scan skips them.
SKIP_DIRS = frozenset(
    {"checkpoints", "hf", "tensorboard", "profile", "compile_cache", "wandb", "__pycache__"}
)
MAX_DEPTH = 6


class DashboardError(Exception):
    """A request the dashboard refuses; `status` is the HTTP status it is sent with."""

    status = 400


class OutsideRootError(DashboardError):
    """A path that leaves the runs folder (`..`, absolute, or a symlink pointing out)."""

    status = 403


class NotFoundError(DashboardError):
    """No such run, sweep or file."""

    status = 404


@dataclasses.dataclass(frozen=True)
class Stat:
    """Size and modification time (unix seconds) of a file."""

    size: int
    mtime: float


class RunsRoot:
    """Read-only access to the files under one folder (local path or `gs://BUCKET/DIR`).

    Args:
        url: the folder; a local path or any fsspec URL (`gs://` through gcsfs).
    """

    def __init__(self, url: str | os.PathLike):
        url = os.fspath(url)
        self.url = url
        self.local = "://" not in url
        if self.local:
            if not os.path.isdir(url):
                raise NotFoundError(f"--runs={url!r}: no such directory; pass a folder of runs.")
            self.base = os.path.realpath(url)
            self.fs = None
        else:
            self.fs, base = fsspec.core.url_to_fs(url)
            self.base = base.rstrip("/")

    # -- paths ----------------------------------------------------------------------------------

    def path(self, rel: str, *more: str) -> str:
        """The full path of `rel/more...` under the folder.

        Raises:
            OutsideRootError: `rel` is absolute, has a `..` part, or (locally) resolves
                through a symlink to a place outside the folder.
        """
        rel = "/".join(p for p in (rel, *more) if p)
        if "\x00" in rel or rel.startswith(("/", "\\")) or (len(rel) > 1 and rel[1] == ":"):
            raise OutsideRootError(f"path {rel!r}: absolute paths are refused; use a run id.")
        parts = rel.replace("\\", "/").split("/")
        if any(p == ".." for p in parts):
            raise OutsideRootError(f"path {rel!r}: '..' is refused; use a run id under the folder.")
        clean = [p for p in parts if p not in ("", ".")]
        if not self.local:
            return posixpath.join(self.base, *clean)
        full = os.path.realpath(os.path.join(self.base, *clean))
        if full != self.base and not full.startswith(self.base + os.sep):
            raise OutsideRootError(
                f"path {rel!r} resolves outside the runs folder (a symlink?); refused."
            )
        return full

    def rel(self, full: str) -> str:
        """The run id of a full path under the folder."""
        if self.local:
            return os.path.relpath(full, self.base).replace(os.sep, "/")
        return full[len(self.base) :].strip("/")

    # -- reading --------------------------------------------------------------------------------

    def stat(self, full: str) -> Stat | None:
        """Size and mtime of a file, None if it does not exist."""
        try:
            if self.local:
                st = os.stat(full)
                return Stat(st.st_size, st.st_mtime)
            info = self.fs.info(full)
        except (FileNotFoundError, NotADirectoryError):
            return None
        mtime = info.get("mtime") or info.get("updated") or info.get("created") or 0.0
        if hasattr(mtime, "timestamp"):
            mtime = mtime.timestamp()
        elif isinstance(mtime, str):
            mtime = _iso_seconds(mtime)
        return Stat(int(info.get("size") or 0), float(mtime))

    def read_bytes(self, full: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes `start:end` of a file (raises FileNotFoundError)."""
        if self.local:
            with open(full, "rb") as f:
                f.seek(start)
                return f.read() if end is None else f.read(max(0, end - start))
        return self.fs.cat_file(full, start=start, end=end)

    def read_ranges(self, full: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Bytes `start:end` for each range, in one open (local) or one batch (`cat_ranges`)."""
        if self.local:
            out = []
            with open(full, "rb") as f:
                for start, end in ranges:
                    f.seek(start)
                    out.append(f.read(max(0, end - start)))
            return out
        starts, ends = [r[0] for r in ranges], [r[1] for r in ranges]
        return list(self.fs.cat_ranges([full] * len(ranges), starts, ends))

    def read_text(self, full: str) -> str | None:
        """A whole small file as text, None if it does not exist."""
        try:
            return self.read_bytes(full).decode("utf-8", errors="replace")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def is_dir(self, full: str) -> bool:
        if self.local:
            return os.path.isdir(full)
        return self.fs.isdir(full)

    def listdir(self, full: str) -> list[str]:
        """Names in a directory (empty if it does not exist)."""
        try:
            if self.local:
                return sorted(os.listdir(full))
            return sorted(posixpath.basename(p.rstrip("/")) for p in self.fs.ls(full, detail=False))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def walk(self, marker_files: tuple[str, ...]) -> Iterator[tuple[str, set[str]]]:
        """(full dir path, names of `marker_files` it holds) for each directory holding any,
        at most `MAX_DEPTH` deep, skipping `SKIP_DIRS`, hidden names and symlinks."""
        if self.local:
            for top, dirs, files in os.walk(self.base, followlinks=False):
                depth = 0 if top == self.base else top[len(self.base) :].count(os.sep)
                dirs[:] = sorted(
                    d
                    for d in dirs
                    if d not in SKIP_DIRS
                    and not d.startswith(".")
                    and depth < MAX_DEPTH
                    and not os.path.islink(os.path.join(top, d))
                )
                found = {f for f in files if f in marker_files}
                if found:
                    yield top, found
            return
        for top, dirs, files in self.fs.walk(self.base, maxdepth=MAX_DEPTH, topdown=True):
            if isinstance(dirs, dict):
                for d in [d for d in dirs if d in SKIP_DIRS or d.startswith(".")]:
                    del dirs[d]
            else:
                dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")]
            found = {f for f in files if f in marker_files}
            if found:
                yield top.rstrip("/"), found


def _iso_seconds(text: str) -> float:
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
