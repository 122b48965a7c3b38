"""The read side of a token store: zarr3 jagged arrays (tokens + offsets) per shard.

Layout of a store directory (local path, or a `gs://`/`s3://` URL tensorstore can read):

    meta.json               written last, atomically: the store exists iff this file exists
    build.json              the build plan (sources, tokenizer, options, shard list)
    ledger.jsonl            one line per finished shard (append-only; makes builds resumable)
    shards/00007/tokens/    zarr3 array [n_tokens] uint16|uint32, chunked, zstd
    shards/00007/offsets/   zarr3 array [n_docs + 1] int64: document d is tokens[o[d]:o[d+1]]
    shards/00007/locations.json   where each document came from (file:line)
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np
import tensorstore as ts

from meltemi.data._tokenizer import Tokenizer

__all__ = ["StoreError", "TokenStore", "TokenizerMismatchError"]

FORMAT = "meltemi-token-store/1"


class StoreError(RuntimeError):
    """A store is missing, incomplete, or does not match what the caller asked for."""


class TokenizerMismatchError(StoreError):
    """A store was opened with a tokenizer other than the one it was built with."""


def kvstore_spec(path: str) -> dict | str:
    """A tensorstore kvstore spec for a local path or a cloud URL (always ends with '/')."""
    path = os.fspath(path)
    if "://" in path:
        return path.rstrip("/") + "/"
    return {"driver": "file", "path": os.path.abspath(path).rstrip("/") + "/"}


def _join(base: dict | str, sub: str) -> dict | str:
    if isinstance(base, str):
        return base + sub.strip("/") + "/"
    return {**base, "path": base["path"] + sub.strip("/") + "/"}


def read_json(path: str, key: str) -> dict | None:
    kv = ts.KvStore.open(kvstore_spec(path)).result()
    value = kv.read(key).result()
    if value.state != "value":
        return None
    return json.loads(bytes(value.value).decode())


def zarr_spec(base: dict | str, sub: str, context: ts.Context | None = None) -> dict:
    spec = {"driver": "zarr3", "kvstore": _join(base, sub)}
    return spec


class TokenStore:
    """A finished token store: random access by document and by token range.

    Open with `TokenStore.open(path, tokenizer=...)`; build with `meltemi.data.build_store`.

    Attributes:
        path: where it lives.
        metadata: the contents of meta.json (counts, fingerprints, options, per-source stats).
        document_lengths: int64 array, tokens per document (global document order).
    """

    def __init__(self, path: str, metadata: dict, cache_bytes: int = 256 << 20):
        self.path = os.fspath(path)
        self.metadata = metadata
        base = kvstore_spec(self.path)
        context = ts.Context({"cache_pool": {"total_bytes_limit": int(cache_bytes)}})
        self._tokens = []
        doc_counts = []
        lengths = []
        for shard in metadata["shards"]:
            name = f"shards/{shard['id']:05d}"
            self._tokens.append(
                ts.open(zarr_spec(base, name + "/tokens"), open=True, context=context)
            )
            doc_counts.append(shard["documents"])
        opened = [f.result() for f in self._tokens]
        self._tokens = opened
        for shard in metadata["shards"]:
            name = f"shards/{shard['id']:05d}"
            if shard["documents"] == 0:
                lengths.append(np.zeros(0, np.int64))
                continue
            arr = ts.open(zarr_spec(base, name + "/offsets"), open=True).result()
            offsets = arr.read().result().astype(np.int64)
            lengths.append(np.diff(offsets))
        self._shard_first_doc = np.concatenate([[0], np.cumsum(doc_counts)]).astype(np.int64)
        self.document_lengths = (
            np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        ).astype(np.int64)
        self._doc_starts = np.zeros(len(self.document_lengths), np.int64)
        # Start of each document inside its own shard's token array.
        for s in range(len(doc_counts)):
            lo, hi = self._shard_first_doc[s], self._shard_first_doc[s + 1]
            seg = self.document_lengths[lo:hi]
            self._doc_starts[lo:hi] = np.cumsum(seg) - seg
        self._locations: dict[int, list[str]] = {}

    @classmethod
    def open(cls, path: str | os.PathLike, tokenizer: Tokenizer | None = None) -> TokenStore:
        """Opens a finished store; checks the tokenizer when one is given.

        Raises:
            StoreError: no store at `path`, or its build never finished.
            TokenizerMismatchError: `tokenizer` is not the one the store was built with.
        """
        path = os.fspath(path)
        meta = read_json(path, "meta.json")
        if meta is None:
            if read_json(path, "build.json") is not None:
                raise StoreError(
                    f"TokenStore.open({path!r}): the build of this store did not finish; rerun "
                    f"build_store(...) with the same sources and path to resume it"
                )
            raise StoreError(
                f"TokenStore.open({path!r}): no token store here (no meta.json); build one with "
                f"meltemi.data.build_store(sources, tokenizer, {path!r})"
            )
        if meta.get("format") != FORMAT:
            raise StoreError(
                f"TokenStore.open({path!r}): format {meta.get('format')!r}, expected {FORMAT!r}"
            )
        if tokenizer is not None and tokenizer.fingerprint() != meta["tokenizer"]["fingerprint"]:
            raise TokenizerMismatchError(
                f"TokenStore.open({path!r}): built with tokenizer {meta['tokenizer']['name']} "
                f"(fingerprint {meta['tokenizer']['fingerprint'][:12]}), opened with "
                f"{tokenizer!r} (fingerprint {tokenizer.fingerprint()[:12]}); pass the same "
                f"tokenizer or build a new store for this one"
            )
        return cls(path, meta)

    @property
    def num_documents(self) -> int:
        return len(self.document_lengths)

    @property
    def num_tokens(self) -> int:
        return int(self.document_lengths.sum())

    @property
    def vocab_size(self) -> int:
        return int(self.metadata["tokenizer"]["vocab_size"])

    @property
    def skipped(self) -> dict[str, int]:
        """Documents skipped or altered at build time, by reason (summed over sources)."""
        return dict(self.metadata["skipped"])

    def _check_doc(self, document: int) -> int:
        document = int(document)
        if not 0 <= document < self.num_documents:
            raise IndexError(
                f"document {document} out of range: the store at {self.path} has "
                f"{self.num_documents} documents"
            )
        return document

    def _shard_of(self, documents: np.ndarray) -> np.ndarray:
        return np.searchsorted(self._shard_first_doc, documents, side="right") - 1

    def document(self, document: int) -> np.ndarray:
        """All tokens of one document (int32)."""
        d = self._check_doc(document)
        return self.read([(d, 0, int(self.document_lengths[d]))])[0]

    def tokens(self, document: int, start: int, stop: int) -> np.ndarray:
        """Tokens `[start, stop)` of a document (int32)."""
        d = self._check_doc(document)
        n = int(self.document_lengths[d])
        if not 0 <= start <= stop <= n:
            raise IndexError(f"token range [{start}, {stop}) outside document {d} of length {n}")
        return self.read([(d, start, stop)])[0]

    def read(self, pieces: Sequence[tuple[int, int, int]]) -> list[np.ndarray]:
        """Reads many `(document, start, stop)` token ranges concurrently (int32 arrays)."""
        if not pieces:
            return []
        arr = np.asarray(pieces, np.int64).reshape(-1, 3)
        shards = self._shard_of(arr[:, 0])
        base = self._doc_starts[arr[:, 0]]
        futures = [
            self._tokens[int(s)][int(b + lo) : int(b + hi)].read()
            for s, b, (_, lo, hi) in zip(shards, base, arr, strict=True)
        ]
        return [np.asarray(f.result(), np.int32) for f in futures]

    def location(self, document: int) -> str:
        """Where a document came from (`file` or `file:line`)."""
        d = self._check_doc(document)
        s = int(self._shard_of(np.asarray([d]))[0])
        if s not in self._locations:
            shard = self.metadata["shards"][s]
            got = read_json(self.path, f"shards/{shard['id']:05d}/locations.json")
            self._locations[s] = got["locations"] if got else []
        return self._locations[s][d - int(self._shard_first_doc[s])]

    def __repr__(self) -> str:
        return (
            f"TokenStore({self.path!r}, documents={self.num_documents}, tokens={self.num_tokens})"
        )
