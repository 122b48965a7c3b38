"""Document sources: text files, JSON lines, Parquet, or any mix of them; local or URLs.

A source lists its files in a fixed order (`files()`), and reads one file as a stream of raw
documents (`read(file)`). The build decodes, filters and tokenizes them; bad input is reported
by location (`file:line`) and counted by reason, never raised. Files are opened through
`fsspec` (streaming, compression inferred from the name: `.gz`, `.zst`, `.bz2`, `.xz`), so a
`gs://`, `s3://`, `file://` or `memory://` URL is read as a stream, never whole.
"""

from __future__ import annotations

import abc
import dataclasses
import glob
import hashlib
import io
import json
import os
import sysconfig
from collections.abc import Iterator, Sequence

import fsspec
import fsspec.utils
import xxhash
from fsspec.core import url_to_fs

__all__ = [
    "Files",
    "JsonlFiles",
    "ParquetFiles",
    "RawDocument",
    "Source",
    "SourceError",
    "TextFiles",
    "file_digest",
    "file_format",
    "file_stat",
    "open_binary",
    "parse_source",
    "stdlib_corpus",
]

_GLOB = "*?["


class SourceError(ValueError):
    """A source is misconfigured (no files match, unknown format, missing package)."""


@dataclasses.dataclass(frozen=True)
class RawDocument:
    """One document as read: `text` is a str, or bytes still to be decoded as UTF-8.

    `problem` is set (and `text` is None) when the record itself is malformed; `reason` is
    the short key it is counted under (`malformed_json`, `no_text_field`, `null_value`, ...).
    """

    location: str
    text: str | bytes | None
    problem: str | None = None
    reason: str | None = None


def _filesystem(url: str):
    """(fsspec filesystem, path inside it) of a URL, with a `SourceError` naming the fix."""
    try:
        return url_to_fs(url)
    except (ImportError, ValueError) as e:
        raise SourceError(f"cannot read {url!r}: {e} (through fsspec)") from None


class _ZstdReader(io.RawIOBase):
    """A zstd stream (one frame or several), decompressed as it is read; input that ends
    inside a frame raises EOFError after everything decodable before it was returned (the
    stream reader of `zstandard` returns end-of-file there, silently losing the damage)."""

    def __init__(self, raw):
        import zstandard

        self._raw = raw
        self._new = zstandard.ZstdDecompressor().decompressobj
        self._dobj = self._new()
        self._pending = b""
        self._started = False  # a frame has begun and not ended

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._pending:
            chunk = self._raw.read(1 << 16)
            if not chunk:
                if self._started:
                    raise EOFError("the zstd frame is cut short (truncated file)")
                return 0
            while chunk:
                self._started = True
                self._pending += self._dobj.decompress(chunk)
                chunk = b""
                if self._dobj.eof:  # a frame ended: the rest is the next frame
                    chunk = self._dobj.unused_data
                    self._dobj = self._new()
                    self._started = False
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


def open_binary(path: str) -> io.BufferedIOBase:
    """Opens a local file or a URL as a binary stream, decompressing by the file's name.

    Compression is inferred by `fsspec` (`.gz`, `.zst`, `.bz2`, `.xz`, ...); URLs stream.
    """
    compression = fsspec.utils.infer_compression(path)
    if path.endswith((".zst", ".zstd")) and compression is None:
        raise SourceError(f"reading {path!r} needs zstandard: pip install 'meltemi-data[zstd]'")
    if compression is None and "://" not in path:  # a plain local file: no fsspec layer
        try:
            return open(path, "rb")
        except FileNotFoundError:
            raise SourceError(f"{path!r} does not exist") from None
    try:
        if compression == "zstd":  # our reader: zstandard's own ignores a truncated frame
            raw = fsspec.open(path, "rb").open()
            return io.BufferedReader(_ZstdReader(raw), 1 << 16)
        return fsspec.open(path, "rb", compression="infer").open()
    except FileNotFoundError:
        raise SourceError(f"{path!r} does not exist") from None
    except (ImportError, ValueError) as e:
        raise SourceError(f"cannot read {path!r}: {e} (through fsspec)") from None


def _expand_url(pattern: str) -> list[str]:
    fs, inner = _filesystem(pattern)
    if any(c in inner for c in _GLOB):
        found = fs.glob(inner)
    elif fs.isdir(inner):
        found = fs.find(inner)
    else:
        return [pattern]
    return sorted(fs.unstrip_protocol(f) for f in found if not fs.isdir(f))


def expand_paths(patterns: Sequence[str]) -> list[str]:
    """Files matching `patterns` (files, directories, globs, URLs), each once, in order."""
    files: list[str] = []
    seen: set[str] = set()
    for pattern in patterns:
        pattern = os.fspath(pattern)
        if "://" in pattern:
            found = _expand_url(pattern)
        elif any(c in pattern for c in _GLOB):
            found = sorted(f for f in glob.glob(pattern, recursive=True) if not os.path.isdir(f))
        elif os.path.isdir(pattern):
            found = sorted(os.path.join(d, f) for d, _, fs in os.walk(pattern) for f in fs)
        else:
            found = [pattern]
        for f in found:  # overlapping patterns ([dir, dir/*.jsonl]) name a file once
            key = f if "://" in f else os.path.abspath(f)
            if key not in seen:
                seen.add(key)
                files.append(f)
    return files


def local_path(path: str) -> str | None:
    """The local path of a plain path or `file://` URL (None for other URLs)."""
    if path.startswith("file://"):
        return path.removeprefix("file://")
    return None if "://" in path else path


def file_stat(path: str) -> tuple[int, int]:
    """(size in bytes, modification time in ns; 0 for a URL) of a file or URL."""
    local = local_path(path)
    if local is not None:
        st = os.stat(local)
        return st.st_size, st.st_mtime_ns
    fs, inner = _filesystem(path)
    info = fs.info(inner)
    return int(info.get("size") or 0), 0


_DIGESTS: dict[tuple, str] = {}  # (path, size, mtime, ctime, inode) -> content digest


def stat_key(path: str) -> tuple | None:
    """What identifies a local file's version without reading it (None for URLs)."""
    local = local_path(path)
    if local is None:
        return None
    st = os.stat(local)
    return (os.path.abspath(local), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def file_digest(path: str) -> str:
    """A digest of a file's content: xxh3-128 for local files (cached by path, size, mtime,
    ctime and inode, so an unchanged file is hashed once per process), the store's own version
    key (`fsspec` `ukey`: etag or generation) for other URLs."""
    key = stat_key(path)
    if key is None:
        fs, inner = _filesystem(path)
        return "ukey:" + str(fs.ukey(inner))
    if key not in _DIGESTS:
        h = xxhash.xxh3_128()
        with open(key[0], "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        _DIGESTS[key] = "xxh3:" + h.hexdigest()
    return _DIGESTS[key]


def file_format(path: str) -> str:
    """`"jsonl"`, `"parquet"` or `"text"`, from a file's name (compression suffixes aside).

    >>> file_format("a/b.jsonl.gz"), file_format("c.parquet"), file_format("d.py")
    ('jsonl', 'parquet', 'text')
    """
    name = path.lower()
    for suffix in (".gz", ".zst", ".zstd", ".bz2", ".xz", ".lzma"):
        name = name.removesuffix(suffix)
    if name.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    return "text"


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

    def fingerprint(self, files: Sequence[str] | None = None) -> str:
        """A digest of the kind, options, file names, sizes and contents (`file_digest`).

        `files` saves listing them again when the caller already has `self.files()`.
        """
        h = hashlib.sha256()
        h.update(json.dumps([type(self).__name__, self.name, self.options()]).encode())
        for f in self.files() if files is None else files:
            h.update(f"{f}\0{file_stat(f)[0]}\0{file_digest(f)}\n".encode())
        return h.hexdigest()

    def _check_files(self, files: list[str], patterns) -> list[str]:
        if not files:
            raise SourceError(
                f"{type(self).__name__}(name={self.name!r}): no files match {list(patterns)}; "
                f"check the paths (globs like 'data/*.jsonl.zst' are expanded)"
            )
        return files


def _read_text(path: str, location: str) -> Iterator[RawDocument]:
    """One document per file; a damaged file (truncated archive) keeps what was read."""
    chunks = []
    try:
        with open_binary(path) as f:
            while chunk := f.read(1 << 16):  # small reads: damage loses at most one
                chunks.append(chunk)
    except (OSError, EOFError, ValueError) as e:
        if chunks:
            yield RawDocument(location, b"".join(chunks))
        raise e
    yield RawDocument(location, b"".join(chunks))


def _read_jsonl(path: str, text_key: str) -> Iterator[RawDocument]:
    """Each line's `text_key` field is a document; bad lines carry a problem and a reason."""
    with open_binary(path) as f:
        for lineno, line in enumerate(f, start=1):
            loc = f"{path}:{lineno}"
            if lineno == 1:
                line = line.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark
            if not line.strip():
                continue
            text = line.decode("utf-8", errors="surrogateescape")
            try:
                record = json.loads(text)
            except json.JSONDecodeError as e:
                problem = f"malformed JSON ({e.msg} at column {e.colno})"
                yield RawDocument(loc, None, problem, "malformed_json")
                continue
            if not isinstance(record, dict) or not isinstance(record.get(text_key), str):
                yield RawDocument(loc, None, f"no string field {text_key!r}", "no_text_field")
                continue
            value = record[text_key]
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


def _read_parquet(path: str, column: str, source: str) -> Iterator[RawDocument]:
    """Each row's `column` is a document; nulls and non-strings carry a problem and reason."""
    try:
        import pyarrow.parquet as pq
    except ModuleNotFoundError as e:  # pragma: no cover
        raise SourceError("ParquetFiles needs pyarrow: pip install 'meltemi-data[parquet]'") from e
    with open_binary(path) as f:
        pf = pq.ParquetFile(f)
        if column not in pf.schema_arrow.names:
            raise SourceError(
                f"ParquetFiles(name={source!r}): {path} has no column {column!r}; "
                f"its columns are {pf.schema_arrow.names}"
            )
        row = 0
        for batch in pf.iter_batches(columns=[column], batch_size=1024):
            for value in batch.column(0).to_pylist():
                row += 1
                loc = f"{path}:row {row}"
                if value is None:
                    yield RawDocument(loc, None, "null value", "null_value")
                elif isinstance(value, str | bytes):
                    yield RawDocument(loc, value)
                else:
                    kind = type(value).__name__
                    yield RawDocument(loc, None, f"{kind} value, not text", "non_string_value")


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
        return self._check_files(expand_paths(self.paths), self.paths)

    def read(self, path: str) -> Iterator[RawDocument]:
        yield from _read_text(path, os.path.relpath(path, self.root) if self.root else path)


@dataclasses.dataclass(frozen=True)
class JsonlFiles(Source):
    """JSON lines (plain or compressed); each line's `text_key` field is a document.

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
        return self._check_files(expand_paths(self.paths), self.paths)

    def read(self, path: str) -> Iterator[RawDocument]:
        return _read_jsonl(path, self.text_key)


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
        return self._check_files(expand_paths(self.paths), self.paths)

    def read(self, path: str) -> Iterator[RawDocument]:
        return _read_parquet(path, self.column, self.name)


@dataclasses.dataclass(frozen=True)
class Files(Source):
    """Files of any supported format, each read according to its name (`file_format`).

    `*.jsonl` / `*.json` / `*.ndjson` (plain or compressed) are JSON lines, `*.parquet` is
    Parquet, anything else is one text document per file. Use it for a directory or a list
    that mixes formats: a `.jsonl.gz` inside a directory is read line by line (a truncated
    archive keeps every line before the damage), never as one text document.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "a.jsonl").write_text('{"text": "one"}\\n{"text": "two"}\\n')
    >>> _ = (d / "b.txt").write_text("three")
    >>> src = Files("mixed", [str(d)])
    >>> [doc.text for f in src.files() for doc in src.read(f)]
    ['one', 'two', b'three']
    """

    name: str
    paths: tuple[str, ...]
    text_key: str = "text"
    column: str = "text"

    def __post_init__(self):
        object.__setattr__(self, "paths", tuple(os.fspath(p) for p in self.paths))

    def options(self) -> dict:
        return {"text_key": self.text_key, "column": self.column}

    def files(self) -> list[str]:
        return self._check_files(expand_paths(self.paths), self.paths)

    def read(self, path: str) -> Iterator[RawDocument]:
        kind = file_format(path)
        if kind == "jsonl":
            return _read_jsonl(path, self.text_key)
        if kind == "parquet":
            return _read_parquet(path, self.column, self.name)
        return _read_text(path, path)


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
    `parquet`, `files` (each file by its name, see `Files`) and PATHS a comma-separated list
    of files, directories, globs or URLs.

    >>> parse_source("jsonl:web=/data/web/*.jsonl.zst").paths
    ('/data/web/*.jsonl.zst',)
    >>> parse_source("stdlib:validation").name
    'stdlib-validation'
    """
    kind, sep, rest = spec.partition(":")
    if kind == "stdlib" and sep:
        return stdlib_corpus(rest)
    kinds = {"text": TextFiles, "jsonl": JsonlFiles, "parquet": ParquetFiles, "files": Files}
    name, eq, paths = rest.partition("=")
    if kind not in kinds or not sep or not eq or not name or not paths:
        raise SourceError(
            f"source spec {spec!r}: use 'stdlib:train', 'stdlib:validation' or "
            f"'KIND:NAME=PATH[,PATH...]' with KIND in {sorted(kinds)}, e.g. "
            f"'jsonl:web=data/*.jsonl.gz'"
        )
    return kinds[kind](name, tuple(paths.split(",")))
