"""Document sources: text files, JSON lines (plain, .gz, .zst), Parquet; local or cloud.

A source lists its files in a fixed order (`files()`), and reads one file as a stream of raw
documents (`read(file)`). The build decodes, filters and tokenizes them; bad input is reported
by location (`file:line`) and counted, never raised.
"""

from __future__ import annotations

import abc
import dataclasses
import glob
import gzip
import hashlib
import io
import json
import os
import sysconfig
from collections.abc import Iterator, Sequence

import tensorstore as ts

__all__ = [
    "JsonlFiles",
    "ParquetFiles",
    "RawDocument",
    "Source",
    "SourceError",
    "TextFiles",
    "open_binary",
    "parse_source",
    "stdlib_corpus",
]

_CLOUD = ("gs://", "s3://", "az://")


class SourceError(ValueError):
    """A source is misconfigured (no files match, unknown format, missing package)."""


@dataclasses.dataclass(frozen=True)
class RawDocument:
    """One document as read: `text` is a str, or bytes still to be decoded as UTF-8.

    `problem` is set (and `text` is None) when the record itself is malformed.
    """

    location: str
    text: str | bytes | None
    problem: str | None = None


def _is_cloud(path: str) -> bool:
    return path.startswith(_CLOUD)


def _cloudpath(path: str):
    try:
        from cloudpathlib import AnyPath
    except ModuleNotFoundError as e:  # pragma: no cover
        raise SourceError(
            f"reading {path!r} needs cloudpathlib: pip install 'meltemi-data[cloud]'"
        ) from e
    return AnyPath(path)


def _read_object(url: str) -> bytes:
    """Reads a whole object through tensorstore's kvstore drivers (gs://, s3://, file://...)."""
    base, _, key = url.rpartition("/")
    try:
        kv = ts.KvStore.open(base + "/").result()
        value = kv.read(key).result()
    except ValueError as e:
        raise SourceError(f"cannot read {url!r} through tensorstore: {e}") from e
    if value.state != "value":
        raise SourceError(f"{url!r} does not exist")
    return bytes(value.value)


def open_binary(path: str) -> io.BufferedIOBase:
    """Opens a local file or a URL for reading, decompressing `.gz` and `.zst` transparently.

    URLs (`gs://`, `s3://`, `file://`, ...) are read whole through tensorstore's kvstores.
    """
    raw = io.BytesIO(_read_object(path)) if "://" in path else open(path, "rb")
    if path.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw)
    if path.endswith(".zst"):
        try:
            import zstandard
        except ModuleNotFoundError as e:  # pragma: no cover
            raise SourceError(
                f"reading {path!r} needs zstandard: pip install 'meltemi-data[zstd]'"
            ) from e
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
    return raw


def _expand(patterns: Sequence[str]) -> list[str]:
    files: list[str] = []
    for pattern in patterns:
        pattern = os.fspath(pattern)
        if pattern.startswith("file://"):
            files += ["file://" + f for f in _expand([pattern.removeprefix("file://")])]
        elif _is_cloud(pattern):
            if any(c in pattern for c in "*?["):
                scheme, rest = pattern.split("://", 1)
                bucket, _, key = rest.partition("/")
                root = _cloudpath(f"{scheme}://{bucket}")
                files += sorted(str(p) for p in root.glob(key))
            else:
                files.append(pattern)
        elif any(c in pattern for c in "*?["):
            files += sorted(glob.glob(pattern, recursive=True))
        elif os.path.isdir(pattern):
            files += sorted(os.path.join(d, f) for d, _, fs in os.walk(pattern) for f in fs)
        else:
            files.append(pattern)
    return files


def _file_stat(path: str) -> tuple[int, int]:
    path = path.removeprefix("file://")
    if _is_cloud(path):
        st = _cloudpath(path).stat()
        return int(st.st_size), int(getattr(st, "st_mtime", 0))
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


class Source(abc.ABC):
    """A named, ordered collection of files holding documents."""

    name: str

    @abc.abstractmethod
    def files(self) -> list[str]:
        """The files, in the order their documents enter the store."""

    @abc.abstractmethod
    def read(self, path: str) -> Iterator[RawDocument]:
        """The documents of one file."""

    def options(self) -> dict:
        """Reader options that change the documents (part of the fingerprint)."""
        return {}

    def fingerprint(self) -> str:
        """A digest of the kind, options, file names, sizes and modification times."""
        h = hashlib.sha256()
        h.update(json.dumps([type(self).__name__, self.name, self.options()]).encode())
        for f in self.files():
            size, mtime = _file_stat(f)
            h.update(f"{f}\0{size}\0{mtime}\n".encode())
        return h.hexdigest()

    def _check_files(self, files: list[str], patterns) -> list[str]:
        if not files:
            raise SourceError(
                f"{type(self).__name__}(name={self.name!r}): no files match {list(patterns)}; "
                f"check the paths (globs like 'data/*.jsonl.zst' are expanded)"
            )
        return files


@dataclasses.dataclass(frozen=True)
class TextFiles(Source):
    """Each file is one document (read as bytes, decoded by the build's UTF-8 policy).

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "a.txt").write_text("hello")
    >>> src = TextFiles("demo", [str(d / "*.txt")])
    >>> [doc.text for f in src.files() for doc in src.read(f)]
    [b'hello']
    """

    name: str
    paths: tuple[str, ...]
    root: str | None = None  # locations are reported relative to it

    def __post_init__(self):
        object.__setattr__(self, "paths", tuple(os.fspath(p) for p in self.paths))

    def files(self) -> list[str]:
        return self._check_files(_expand(self.paths), self.paths)

    def read(self, path: str) -> Iterator[RawDocument]:
        with open_binary(path) as f:
            data = f.read()
        loc = os.path.relpath(path, self.root) if self.root else path
        yield RawDocument(loc, data)


@dataclasses.dataclass(frozen=True)
class JsonlFiles(Source):
    """JSON lines (optionally .gz or .zst); each line's `text_key` field is a document.

    Malformed lines come out as documents with a `problem` (reported as `file:line`).
    """

    name: str
    paths: tuple[str, ...]
    text_key: str = "text"

    def __post_init__(self):
        object.__setattr__(self, "paths", tuple(os.fspath(p) for p in self.paths))

    def options(self) -> dict:
        return {"text_key": self.text_key}

    def files(self) -> list[str]:
        return self._check_files(_expand(self.paths), self.paths)

    def read(self, path: str) -> Iterator[RawDocument]:
        with open_binary(path) as f:
            for lineno, line in enumerate(f, start=1):
                loc = f"{path}:{lineno}"
                if not line.strip():
                    continue
                text = line.decode("utf-8", errors="surrogateescape")
                try:
                    record = json.loads(text)
                except json.JSONDecodeError as e:
                    yield RawDocument(loc, None, f"malformed JSON ({e.msg} at column {e.colno})")
                    continue
                if not isinstance(record, dict) or not isinstance(record.get(self.text_key), str):
                    yield RawDocument(loc, None, f"no string field {self.text_key!r}")
                    continue
                value = record[self.text_key]
                # Invalid bytes survive as lone surrogates: hand them back as bytes so the
                # build's UTF-8 policy sees them.
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    try:  # raw invalid bytes, smuggled through as U+DC80..U+DCFF
                        value = value.encode("utf-8", errors="surrogateescape")
                    except UnicodeEncodeError:  # lone surrogates from JSON escapes (\ud800)
                        value = value.encode("utf-8", errors="surrogatepass")
                yield RawDocument(loc, value)


@dataclasses.dataclass(frozen=True)
class ParquetFiles(Source):
    """Parquet files (extra `[parquet]`); each row's `column` is a document."""

    name: str
    paths: tuple[str, ...]
    column: str = "text"

    def __post_init__(self):
        object.__setattr__(self, "paths", tuple(os.fspath(p) for p in self.paths))

    def options(self) -> dict:
        return {"column": self.column}

    def files(self) -> list[str]:
        return self._check_files(_expand(self.paths), self.paths)

    def read(self, path: str) -> Iterator[RawDocument]:
        try:
            import pyarrow.parquet as pq
        except ModuleNotFoundError as e:  # pragma: no cover
            raise SourceError(
                "ParquetFiles needs pyarrow: pip install 'meltemi-data[parquet]'"
            ) from e
        with open_binary(path) as f:
            pf = pq.ParquetFile(f)
            if self.column not in pf.schema_arrow.names:
                raise SourceError(
                    f"ParquetFiles(name={self.name!r}): {path} has no column {self.column!r}; "
                    f"its columns are {pf.schema_arrow.names}"
                )
            row = 0
            for batch in pf.iter_batches(columns=[self.column], batch_size=1024):
                for value in batch.column(0).to_pylist():
                    row += 1
                    if value is None:
                        yield RawDocument(f"{path}:row {row}", None, "null value")
                    else:
                        yield RawDocument(f"{path}:row {row}", value)


_STDLIB_SKIP = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def stdlib_files(split: str, validation_percent: int = 5) -> tuple[str, list[str]]:
    """(root, files) of the stdlib corpus split; see `stdlib_corpus`."""
    if split not in ("train", "validation"):
        raise SourceError(f"stdlib_corpus(split={split!r}): use split='train' or 'validation'")
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for d, dirs, fs in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in _STDLIB_SKIP)
        for f in sorted(fs):
            if f.endswith(".py"):
                path = os.path.join(d, f)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                bucket = int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "big") % 100
                if (bucket < validation_percent) == (split == "validation"):
                    files.append(path)
    return root, files


@dataclasses.dataclass(frozen=True)
class _StdlibCorpus(TextFiles):
    split: str = "train"
    validation_percent: int = 5

    def options(self) -> dict:
        return {"split": self.split, "validation_percent": self.validation_percent}

    def files(self) -> list[str]:
        return stdlib_files(self.split, self.validation_percent)[1]


def stdlib_corpus(split: str = "train", *, validation_percent: int = 5) -> Source:
    """The Python standard library's source (found via `sysconfig`) as a text corpus.

    Every `.py` file outside `site-packages` and the test suites is one document; a file goes
    to `validation` when the SHA-256 of its path relative to the stdlib root falls in the first
    `validation_percent` of 100 buckets, so the split is stable across machines.

    >>> train, val = stdlib_corpus("train"), stdlib_corpus("validation")
    >>> len(train.files()) > 10 * len(val.files()) > 0
    True
    >>> set(train.files()) & set(val.files())
    set()
    """
    root, _ = stdlib_files(split, validation_percent)
    return _StdlibCorpus(
        name=f"stdlib-{split}",
        paths=(root,),
        root=root,
        split=split,
        validation_percent=validation_percent,
    )


def parse_source(spec: str) -> Source:
    """A source from a command-line spec.

    `stdlib:train`, `stdlib:validation`, or `KIND:NAME=PATHS` with KIND in `text`, `jsonl`,
    `parquet` and PATHS a comma-separated list of files, directories or globs.

    >>> parse_source("jsonl:web=/data/web/*.jsonl.zst").paths
    ('/data/web/*.jsonl.zst',)
    >>> parse_source("stdlib:validation").name
    'stdlib-validation'
    """
    kind, sep, rest = spec.partition(":")
    if kind == "stdlib" and sep:
        return stdlib_corpus(rest)
    kinds = {"text": TextFiles, "jsonl": JsonlFiles, "parquet": ParquetFiles}
    name, eq, paths = rest.partition("=")
    if kind not in kinds or not sep or not eq or not name or not paths:
        raise SourceError(
            f"source spec {spec!r}: use 'stdlib:train', 'stdlib:validation' or "
            f"'KIND:NAME=PATH[,PATH...]' with KIND in {sorted(kinds)}, e.g. "
            f"'jsonl:web=data/*.jsonl.gz'"
        )
    return kinds[kind](name, tuple(paths.split(",")))
