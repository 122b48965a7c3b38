"""The top-level keys (`name`, `run_dir`) and where a run's files and caches go."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re

import fsspec
from etils import epath

from meltemi.levanter.config._checks import Text
from meltemi.levanter.config._errors import ConfigError
from meltemi.levanter.config._keys import key


@dataclasses.dataclass(frozen=True, kw_only=True)
class TopKeys:
    """The keys outside any section (`RunSpec.name` and `RunSpec.run_dir` hold them)."""

    name: str = key(
        "run", "The run's name (the run directory is `runs/<name>` by default).", Text()
    )
    run_dir: str = key(
        "",
        "The run directory (a local path or gs://BUCKET/DIR); empty: `runs/<name>` under the "
        "directory the command was started from.",
        Text(),
    )


def resolve_run_dir(name: str, run_dir: str) -> pathlib.Path | epath.Path:
    """`run_dir`, or `runs/<name>`, relative to the directory the user started from.

    Under `bazel run` the working directory is the runfiles tree, so relative paths are
    taken against `$BUILD_WORKING_DIRECTORY` instead. A `gs://bucket/dir` URL is an
    `etils.epath.Path` (what orbax writes through).

    Raises:
        ConfigError: another scheme (`s3://`: orbax writes checkpoint arrays to local paths
            and `gs://` only), or `gs://` without `gcsfs` installed.
    """
    text = run_dir or os.path.join("runs", name)
    scheme = re.match(r"^([a-z][a-z0-9+.-]*)://", text)
    if scheme:
        return _object_store_dir(text, scheme.group(1))
    path = pathlib.Path(text).expanduser()
    if not path.is_absolute():
        path = pathlib.Path(os.environ.get("BUILD_WORKING_DIRECTORY") or os.getcwd()) / path
    return path


def _object_store_dir(text: str, scheme: str) -> epath.Path:
    """A `gs://bucket/dir` run directory, checked (pathlib would make it `gs:/bucket/dir`)."""
    if scheme != "gs":
        raise ConfigError(
            f"run_dir={text!r}: only gs:// object storage is supported (orbax writes "
            f"checkpoint arrays to gs:// through tensorstore, not to {scheme}://); use "
            f"--config.run_dir=gs://BUCKET/DIR, or a local path or a mount of the bucket."
        )
    bucket = text[len("gs://") :].split("/", 1)[0]
    if not bucket or not text[len("gs://") + len(bucket) :].strip("/"):
        raise ConfigError(
            f"run_dir={text!r}: name a directory inside the bucket, e.g. "
            f"--config.run_dir=gs://{bucket or 'BUCKET'}/runs/NAME."
        )
    try:
        fsspec.get_filesystem_class("gs")
    except (ImportError, ValueError) as e:
        raise ConfigError(
            f"run_dir={text!r}: gs:// needs the gcsfs package (orbax's metadata and the run's "
            f"metrics go through fsspec): {e}"
        ) from None
    return epath.Path(text.rstrip("/"))


def default_cache_dir(cache_dir: str) -> pathlib.Path:
    """`data.cache_dir`, else `$MELTEMI_CACHE/data`, else `~/.cache/meltemi/data`."""
    if cache_dir:
        return pathlib.Path(cache_dir).expanduser()
    root = os.environ.get("MELTEMI_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "meltemi"
    )
    return pathlib.Path(root) / "data"
