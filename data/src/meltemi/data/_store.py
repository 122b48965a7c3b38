"""The read side of a token store: zarr3 jagged arrays (tokens + offsets) per shard.

Layout of a store directory (local path, or a `gs://`/`s3://` URL tensorstore can read):

    meta.json               written last, atomically: the store exists iff this file exists
    build.json              the build plan (sources, tokenizer, options, shard list)
    ledger.jsonl            one line per finished shard (append-only; makes builds resumable)
    shards/00007/tokens/    zarr3 array [n_tokens] uint16|uint32, chunked, zstd
    shards/00007/offsets/   zarr3 array [n_docs + 1] int64: document d is tokens[o[d]:o[d+1]]
    shards/00007/locations.json   where each document came from (file:line)

A chat store (`meta.json` "kind": "chat", built from a source with `encode`) also holds, per
shard:

    shards/00007/loss_mask/     zarr3 array [n_tokens] uint8: 1 where the token carries loss
    shards/00007/turn_ends/     zarr3 array [n_turn_ends] int64: offsets inside the document
                                just after each assistant turn (a conversation may be cut there)
    shards/00007/turn_offsets/  zarr3 array [n_docs + 1] int64: document d's turn ends are
                                turn_ends[t[d]:t[d+1]]

A preference store ("kind": "preference", built from `meltemi.data.chat.PreferenceFiles`) has
the same arrays; each document is a pair, the chosen conversation then the rejected one, and
its two turn ends are where each ends (`TokenStore.pair_splits` gives the first).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np
import tensorstore as ts

from meltemi.data._sources import file_digest, local_path, stat_key
from meltemi.data._tokenizer import Tokenizer

__all__ = ["SourcesChangedError", "StoreError", "TokenStore", "TokenizerMismatchError"]

FORMAT = "meltemi-token-store/1"
CHAT = "chat"  # meta.json "kind" of a chat store (a text store has no "kind")
PREFERENCE = "preference"  # meta.json "kind" of a preference store (pairs of conversations)

# `read_flat`'s choice between slice reads of merged spans (ranges less than a zarr chunk
# apart share one read) and one index-array read, in seconds (measured on a 2-core VM: a
# slice read costs ~45 us plus ~2 ns per token it spans; an index-array read ~150 ns per token).
_SLICE_COST = 45e-6
_SPAN_TOKEN_COST = 2e-9
_INDEX_COST = 200e-6
_INDEX_TOKEN_COST = 150e-9


# Build counts of documents that were kept, changed (the others were skipped).
ALTERED = frozenset({"invalid_utf8_replaced", "truncated_runs", "truncated_long"})


class StoreError(RuntimeError):
    """A store is missing, incomplete, or does not match what the caller asked for."""


class TokenizerMismatchError(StoreError):
    """A store was opened with a tokenizer other than the one it was built with."""


class SourcesChangedError(StoreError):
    """A source file's content changed after the store was built from it."""


def source_records(files: list[tuple[str, str]]) -> list[dict]:
    """What `TokenStore.open` checks: each `(source, file)` with its content digest and the
    stat key (size, times, inode) under which that digest was taken."""
    out = []
    for source, f in files:
        key = stat_key(f)
        out.append(
            {
                "source": source,
                "path": f,
                "digest": file_digest(f),
                "stat": None if key is None else list(key[1:]),
            }
        )
    return out


def verify_source_files(path: str, records: list[dict]) -> None:
    """Raises `SourcesChangedError` if a local source file that still exists has other content.

    A file whose size, times and inode are those recorded at build time is not read again;
    a file that is gone (a store copied to another machine) or a URL is not checked.
    """
    for record in records:
        local = local_path(record["path"])
        if local is None or not os.path.exists(local):
            continue
        key = stat_key(record["path"])
        if record.get("stat") is not None and list(key[1:]) == record["stat"]:
            continue
        digest = file_digest(record["path"])
        if digest != record["digest"]:
            now, then = digest.split(":")[-1][:12], record["digest"].split(":")[-1][:12]
            raise SourcesChangedError(
                f"TokenStore.open({path!r}): source file {record['path']} (source "
                f"{record['source']!r}) changed since the store was built (content {now}, "
                f"built from {then}); "
                f"rebuild it (delete {path} or build to a new path), or open it with "
                f"check_sources=False to use it as it is"
            )


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
        self._masks: list = []
        self._turn_ends = np.zeros(0, np.int64)
        self._turn_start = np.zeros(len(self.document_lengths) + 1, np.int64)
        if self.has_loss_mask:
            self._open_chat(base, context)
        self._locations: dict[int, list[str]] = {}
        self._merge_gap = int(metadata.get("options", {}).get("chunk_tokens", 1 << 15))

    def _open_chat(self, base, context) -> None:
        """Opens the loss masks and reads every document's turn ends (a few per document)."""
        futures = [
            ts.open(zarr_spec(base, f"shards/{s['id']:05d}/loss_mask"), open=True, context=context)
            for s in self.metadata["shards"]
        ]
        self._masks = [f.result() for f in futures]
        ends, counts = [], []
        for shard in self.metadata["shards"]:
            if shard["documents"] == 0:
                continue
            name = f"shards/{shard['id']:05d}"
            t = ts.open(zarr_spec(base, name + "/turn_offsets"), open=True).result().read()
            e = ts.open(zarr_spec(base, name + "/turn_ends"), open=True).result().read()
            t = t.result().astype(np.int64)
            ends.append(e.result().astype(np.int64))
            counts.append(np.diff(t))
        if ends:
            self._turn_ends = np.concatenate(ends)
            self._turn_start = np.concatenate([[0], np.cumsum(np.concatenate(counts))])

    @classmethod
    def open(
        cls,
        path: str | os.PathLike,
        tokenizer: Tokenizer | None = None,
        *,
        check_sources: bool = True,
    ) -> TokenStore:
        """Opens a finished store; checks the tokenizer when one is given, and the content of
        every local source file still present (unless `check_sources=False`).

        Raises:
            StoreError: no store at `path`, or its build never finished.
            TokenizerMismatchError: `tokenizer` is not the one the store was built with.
            SourcesChangedError: a source file's content changed since the build.
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
        if check_sources:
            verify_source_files(path, meta.get("source_files", []))
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
    def has_loss_mask(self) -> bool:
        """True for a chat or preference store: per-token loss masks and turn ends are stored."""
        return self.metadata.get("kind") in (CHAT, PREFERENCE)

    @property
    def is_preference(self) -> bool:
        """True for a preference store: each document is a chosen then a rejected conversation."""
        return self.metadata.get("kind") == PREFERENCE

    def pair_splits(self, documents) -> np.ndarray:
        """Tokens of the chosen conversation of each pair `documents[i]` (int64): the rejected
        one is the rest of the document. Preference stores only.

        Raises:
            StoreError: the store is not a preference store.
        """
        if not self.is_preference:
            raise StoreError(
                f"TokenStore.pair_splits: the store at {self.path} holds no preference pairs; "
                f"build it from meltemi.data.chat.PreferenceFiles"
            )
        docs = np.asarray(documents, np.int64).reshape(-1)
        return self._turn_ends[self._turn_start[docs]].copy()

    @property
    def skipped(self) -> dict[str, int]:
        """Documents skipped or altered at build time, by reason (summed over sources)."""
        return dict(self.metadata["skipped"])

    def skipped_summary(self) -> str | None:
        """One line on what the build skipped or altered, or None when it did neither.

        What a trainer prints after opening its store, e.g. `data: /tmp/s skipped 3 inputs
        (malformed_json 2, truncated_file 1; e.g. a.jsonl:31: malformed JSON ...); altered 1
        (invalid_utf8_replaced 1); 120 documents kept; details in /tmp/s/meta.json`.
        """
        counts = self.skipped
        if not any(counts.values()):
            return None
        altered = {k: v for k, v in counts.items() if k in ALTERED and v}
        skipped = {k: v for k, v in counts.items() if k not in ALTERED and v}
        parts = []
        if skipped:
            reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(skipped.items()))
            examples = self.metadata.get("examples", {})
            first = next((examples[k][0] for k in sorted(skipped) if examples.get(k)), None)
            example = f"; e.g. {first}" if first else ""
            parts.append(f"skipped {sum(skipped.values()):,} inputs ({reasons}{example})")
        if altered:
            reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(altered.items()))
            parts.append(f"altered {sum(altered.values()):,} documents ({reasons})")
        return (
            f"data: {self.path} {'; '.join(parts)}; {self.num_documents:,} documents kept; "
            f"details in {self.path}/meta.json"
        )

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
        """Reads many `(document, start, stop)` token ranges (int32 arrays); see `read_flat`."""
        if not len(pieces):
            return []
        arr = np.asarray(pieces, np.int64).reshape(-1, 3)
        flat = self.read_flat(arr[:, 0], arr[:, 1], arr[:, 2])
        return np.split(flat, np.cumsum(arr[:, 2] - arr[:, 1])[:-1])

    def read_flat(self, documents, starts, stops) -> np.ndarray:
        """Token ranges `[starts[i], stops[i])` of `documents[i]`, concatenated (int32).

        Reads are batched per shard: nearby ranges are merged into one slice read (one
        tensorstore read per contiguous span), and when the merged spans would still be many
        (short documents scattered over a large shard) one index-array read fetches exactly
        the tokens needed; all reads run concurrently.
        """
        return self._read_ranges(self._tokens, np.int32, documents, starts, stops)

    def read_mask_flat(self, documents, starts, stops) -> np.ndarray:
        """The loss masks (uint8, 1 = the token carries loss) of token ranges, concatenated;
        batched like `read_flat`.

        Raises:
            StoreError: the store is not a chat store (it has no masks).
        """
        self._need_chat("read_mask_flat")
        return self._read_ranges(self._masks, np.uint8, documents, starts, stops)

    def loss_mask(self, document: int) -> np.ndarray:
        """The loss mask of one document (uint8, one per token); chat stores only."""
        d = self._check_doc(document)
        return self.read_mask_flat([d], [0], [int(self.document_lengths[d])])

    def turn_ends(self, document: int) -> np.ndarray:
        """Token offsets inside `document` just after each assistant turn (int64, ascending):
        where a conversation may be cut. Chat stores only."""
        self._need_chat("turn_ends")
        d = self._check_doc(document)
        return self._turn_ends[self._turn_start[d] : self._turn_start[d + 1]].copy()

    def _need_chat(self, what: str) -> None:
        if not self.has_loss_mask:
            raise StoreError(
                f"TokenStore.{what}: the store at {self.path} is a text store (no loss masks or "
                f"turn ends); build it from a chat source (one with encode(), e.g. "
                f"meltemi.data.chat.ChatFiles)"
            )

    def _read_ranges(self, arrays: list, dtype, documents, starts, stops) -> np.ndarray:
        """`read_flat` over one per-shard array list (`_tokens` or `_masks`)."""
        docs = np.asarray(documents, np.int64).reshape(-1)
        starts = np.asarray(starts, np.int64).reshape(-1)
        n = np.asarray(stops, np.int64).reshape(-1) - starts
        out = np.empty(int(n.sum()), dtype)
        if not len(out):
            return out
        shards = self._shard_of(docs)
        lo = self._doc_starts[docs] + starts
        dest = np.cumsum(n) - n
        jobs = []
        for s in np.unique(shards).tolist():
            sel = np.flatnonzero((shards == s) & (n > 0))
            sel = sel[np.argsort(lo[sel], kind="stable")]
            a, b = lo[sel], lo[sel] + n[sel]
            new = np.ones(len(sel), bool)
            new[1:] = a[1:] > np.maximum.accumulate(b)[:-1] + self._merge_gap
            heads = np.flatnonzero(new)
            span_lo, span_hi = a[heads], np.maximum.reduceat(b, heads)
            tokens = int(n[sel].sum())
            slices = len(heads) * _SLICE_COST + int((span_hi - span_lo).sum()) * _SPAN_TOKEN_COST
            arr = arrays[s]
            if slices <= _INDEX_COST + tokens * _INDEX_TOKEN_COST:
                futures = [
                    arr[x:y].read() for x, y in zip(span_lo.tolist(), span_hi.tolist(), strict=True)
                ]
                group = np.cumsum(new) - 1
                jobs.append((sel, futures, span_lo, span_hi, group))
            else:
                within = np.arange(tokens) - np.repeat(np.cumsum(n[sel]) - n[sel], n[sel])
                jobs.append(
                    (sel, [arr.oindex[np.repeat(a, n[sel]) + within].read()], None, None, None)
                )
        for sel, futures, span_lo, span_hi, group in jobs:
            k = n[sel]
            within = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
            to = np.repeat(dest[sel], k) + within
            if span_lo is None:
                out[to] = futures[0].result()
                continue
            buf = np.concatenate([np.asarray(f.result()) for f in futures])
            base = (np.cumsum(span_hi - span_lo) - (span_hi - span_lo))[group] - span_lo[group]
            out[to] = buf[np.repeat(lo[sel] + base, k) + within]
        return out

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
