"""Building a token store: shards in parallel, a ledger for resuming, an atomic finalise.

The plan (which files go in which shard) is a pure function of the sources and options and is
saved in build.json. Each shard is written to a temporary directory and renamed into place;
only then does the parent append the shard's line to ledger.jsonl. A rerun skips the shards the
ledger lists and redoes the others, so a killed build loses and duplicates nothing. meta.json
is written last (write to a temporary name, then rename): a store without it does not open.

A source with an `encode(raw, tokenizer)` method (`meltemi.data.chat.ChatFiles`) is a chat
source: its rows are not cleaned or wrapped in bos/eos; `encode` gives each row's ids, loss
mask and turn ends, stored beside the tokens (a chat store, meta.json "kind": "chat"). A row
it rejects (an exception with a `.reason`, `ChatRowError`) is counted under that reason with
its `file:line`, like any malformed record. A chat source whose class says
`store_kind = "preference"` (`meltemi.data.chat.PreferenceFiles`) builds a preference store the
same way: its documents are pairs (meta.json "kind": "preference").
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import tensorstore as ts

from meltemi.data._clean import CleanPolicy, contains_any, ngram_hashes, truncate_runs
from meltemi.data._ledger import append_json_line, exclusive_lock, read_json_lines, write_json
from meltemi.data._parallel import Executor, make_executor
from meltemi.data._sources import Source, SourceError, file_stat
from meltemi.data._store import (
    CHAT,
    FORMAT,
    PREFERENCE,
    StoreError,
    TokenStore,
    kvstore_spec,
    source_records,
    zarr_spec,
)
from meltemi.data._tokenizer import Tokenizer

__all__ = ["build_store", "plan_shards"]

_MAX_PROBLEMS = 20  # problem locations kept per shard in the ledger
_MAX_EXAMPLES = 5  # `file:line` examples kept per reason (per shard, and in meta.json)


def _token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


_SYNC_MODES = ("files", "shards")


def _fsync_tree(path: str) -> None:
    """fsyncs every file under local `path`, then every directory, 16 at a time (concurrent
    fsyncs share the filesystem's journal commits). A 1.8 M-token shard here: written with
    tensorstore's fsync of each chunk file 112 ms, written without and then this 64 ms
    (medians of 8, load 12)."""
    files, dirs = [], []
    for root, _, names in os.walk(path):
        dirs.append(root)
        files += [os.path.join(root, name) for name in names]

    def fsync(p: str) -> None:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(fsync, files))
        list(pool.map(fsync, dirs))


def _write_array(
    base, sub: str, data: np.ndarray, dtype: str, chunk: int, sync: bool = True
) -> None:
    spec = {
        **zarr_spec(base, sub),
        "metadata": {
            "shape": [len(data)],
            "data_type": dtype,
            "chunk_grid": {
                "name": "regular",
                "configuration": {"chunk_shape": [max(1, min(chunk, len(data) or 1))]},
            },
            "codecs": [
                {"name": "bytes", "configuration": {"endian": "little"}},
                {"name": "zstd", "configuration": {"level": 3}},
            ],
        },
        "create": True,
        "delete_existing": True,
    }
    if not sync:  # the caller fsyncs the whole shard at once (`_fsync_tree`)
        spec["context"] = {"file_io_sync": False}
    arr = ts.open(spec).result()
    if len(data):
        arr.write(data.astype(dtype)).result()


@dataclasses.dataclass(frozen=True)
class _ShardTask:
    path: str
    shard: int
    source: Source
    files: tuple[str, ...]
    tokenizer: Tokenizer
    policy: CleanPolicy
    chunk_tokens: int
    eval_hashes: str | None  # a sorted .npy of evaluation n-gram hashes, loaded once per worker
    sync: str = "files"  # build_store(sync=...)
    chat: bool = False  # the source encodes rows itself (`_is_chat`)


_EVAL_SETS: dict[str, np.ndarray] = {}  # per worker process: path -> memory-mapped hashes


def _eval_set(path: str | None) -> np.ndarray | None:
    """The evaluation hashes of a build, read once per worker (memory-mapped, shared pages)."""
    if path is None:
        return None
    if path not in _EVAL_SETS:
        _EVAL_SETS.clear()  # one build at a time per worker
        _EVAL_SETS[path] = np.load(path, mmap_mode="r")
    return _EVAL_SETS[path]


def _clean(doc, policy: CleanPolicy, counts: collections.Counter) -> tuple[str | None, str]:
    """Applies the policy: (text to keep or None, the reason it was dropped under); counts
    every action."""
    if doc.problem is not None:
        counts[doc.reason or "malformed"] += 1
        return None, doc.reason or "malformed"
    text = doc.text
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            if policy.invalid_utf8 == "skip":
                counts["invalid_utf8_skipped"] += 1
                return None, "invalid_utf8_skipped"
            counts["invalid_utf8_replaced"] += 1
            text = text.decode("utf-8", errors="replace")
    if len(text) > policy.max_document_chars:
        counts["truncated_long"] += 1
        text = text[: policy.max_document_chars]
    text, cut = truncate_runs(text, policy.max_run)
    if cut:
        counts["truncated_runs"] += 1
    if len(text.strip()) < policy.min_document_chars:
        counts["empty"] += 1
        return None, "empty"
    return text, ""


def _note(problems: list[str], examples: dict, reason: str, where: str) -> None:
    """Keeps the first problems of a shard, and the first examples of each reason."""
    if len(problems) < _MAX_PROBLEMS:
        problems.append(where)
    kept = examples.setdefault(reason, [])
    if len(kept) < _MAX_EXAMPLES:
        kept.append(where)


def _add(doc, task: _ShardTask, counts, problems, examples, docs, locations) -> None:
    """Cleans, tokenizes and decontaminates one document, appending it if it is kept."""
    tok, policy = task.tokenizer, task.policy
    text, why = _clean(doc, policy, counts)
    if text is None:
        _note(problems, examples, why, f"{doc.location}: {doc.problem or why}")
        return
    ids = tok.encode(text)
    eval_set = _eval_set(task.eval_hashes)
    if eval_set is not None and contains_any(eval_set, ngram_hashes(ids, policy.ngram)):
        counts["decontaminated"] += 1
        return
    parts = []
    if policy.add_bos and tok.bos_id is not None:  # a tokenizer without bos: none added
        parts.append(np.asarray([tok.bos_id], np.int32))
    parts.append(ids)
    if policy.add_eos and tok.eos_id is not None:
        parts.append(np.asarray([tok.eos_id], np.int32))
    docs.append(np.concatenate(parts) if len(parts) > 1 else ids)
    locations.append(doc.location)


def _is_chat(source) -> bool:
    """A chat source encodes its rows itself (ids, loss mask, turn ends)."""
    return callable(getattr(source, "encode", None))


def _kind(source) -> str | None:
    """The store kind a source builds: None (text), "chat" or "preference"."""
    if not _is_chat(source):
        return None
    return PREFERENCE if getattr(source, "store_kind", CHAT) == PREFERENCE else CHAT


@dataclasses.dataclass
class _ChatParts:
    """The kept conversations of one shard: ids, loss masks and turn ends per document."""

    masks: list[np.ndarray] = dataclasses.field(default_factory=list)
    turn_ends: list[np.ndarray] = dataclasses.field(default_factory=list)


def _check_encoded(enc, where: str, task: _ShardTask) -> tuple[np.ndarray, ...]:
    """(ids, loss mask, turn ends) of an `encode` result; a malformed result is a bug of the
    source (raised, not counted)."""
    src = f"{type(task.source).__name__}({task.source.name!r}).encode at {where}"
    ids = np.asarray(enc.ids).reshape(-1)
    mask = np.asarray(enc.loss_mask).reshape(-1)
    ends = np.asarray(enc.turn_ends, np.int64).reshape(-1)
    if len(mask) != len(ids):
        raise ValueError(
            f"{src}: loss_mask has {len(mask)} values for {len(ids)} ids; encode must return "
            f"one mask value (0 or 1) per id"
        )
    if len(mask) and not np.isin(mask, (0, 1)).all():
        raise ValueError(f"{src}: loss_mask holds {sorted(set(mask.tolist()))}; use only 0 and 1")
    if len(ids) and (ids.min() < 0 or ids.max() >= task.tokenizer.vocab_size):
        raise ValueError(
            f"{src}: ids outside [0, {task.tokenizer.vocab_size}) of tokenizer "
            f"{task.tokenizer!r} (min {ids.min()}, max {ids.max()})"
        )
    if len(ends) and (ends[0] < 1 or ends[-1] > len(ids) or (np.diff(ends) <= 0).any()):
        raise ValueError(
            f"{src}: turn_ends {ends.tolist()} must be strictly increasing offsets in "
            f"[1, {len(ids)}] (just after each assistant turn)"
        )
    return ids.astype(np.int32), mask.astype(np.uint8), ends


def _add_chat(doc, task: _ShardTask, counts, problems, examples, docs, locations, chat) -> None:
    """Encodes one conversation (no cleaning, no bos/eos), appending it if it is kept; a row
    the source rejects (an exception with a `.reason`) is counted under that reason."""
    if doc.problem is not None:
        reason = doc.reason or "malformed"
        counts[reason] += 1
        _note(problems, examples, reason, f"{doc.location}: {doc.problem}")
        return
    try:
        enc = task.source.encode(doc, task.tokenizer)
    except ValueError as e:  # ChatRowError: bad data, counted; anything else is our bug
        reason = getattr(e, "reason", None)
        if not isinstance(reason, str):
            raise
        counts[reason] += 1
        problem = getattr(e, "problem", None) or str(e)  # ChatRowError: without its location
        _note(problems, examples, reason, f"{doc.location}: {problem}")
        return
    ids, mask, ends = _check_encoded(enc, doc.location, task)
    if not len(ids):
        counts["empty"] += 1
        _note(problems, examples, "empty", f"{doc.location}: no tokens")
        return
    docs.append(ids)
    chat.masks.append(mask)
    chat.turn_ends.append(ends)
    locations.append(doc.location)


def _read_guarded(source: Source, f: str, counts, problems, examples) -> Iterator:
    """The documents of one file; a corrupt or unreadable file ends early and is counted."""
    try:
        reader = iter(source.read(f))
        while True:
            try:
                doc = next(reader)
            except StopIteration:
                return
            yield doc
    except SourceError:
        raise  # misconfiguration (a missing column, a missing package): fix and rerun
    except Exception as e:  # keep what was read before the damage; count the file
        counts["truncated_file"] += 1
        _note(problems, examples, "truncated_file", f"{f}: unreadable ({type(e).__name__}: {e})")


def _build_shard(task: _ShardTask) -> dict:
    """Reads, cleans, tokenizes and writes one shard; returns its ledger entry."""
    tok = task.tokenizer
    counts: collections.Counter = collections.Counter()
    problems: list[str] = []
    examples: dict[str, list[str]] = {}
    docs: list[np.ndarray] = []
    locations: list[str] = []
    chat = _ChatParts()
    input_bytes = 0
    for f in task.files:
        for doc in _read_guarded(task.source, f, counts, problems, examples):
            if task.chat:
                _add_chat(doc, task, counts, problems, examples, docs, locations, chat)
            else:
                _add(doc, task, counts, problems, examples, docs, locations)
        try:
            input_bytes += file_stat(f)[0]
        except OSError:
            pass  # already counted as unreadable
    lengths = np.asarray([len(d) for d in docs], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.concatenate(docs) if docs else np.zeros(0, np.int32)

    final = os.path.join(task.path, "shards", f"{task.shard:05d}")
    tmp = f"{final}.tmp-{uuid.uuid4().hex[:8]}"
    base = kvstore_spec(tmp)
    per_file = task.sync == "files"
    _write_array(base, "tokens", tokens, _token_dtype(tok.vocab_size), task.chunk_tokens, per_file)
    _write_array(base, "offsets", offsets, "int64", 1 << 16, per_file)
    if task.chat:
        masks = np.concatenate(chat.masks) if docs else np.zeros(0, np.uint8)
        _write_array(base, "loss_mask", masks, "uint8", task.chunk_tokens, per_file)
        ends = np.concatenate(chat.turn_ends) if docs else np.zeros(0, np.int64)
        _write_array(base, "turn_ends", ends, "int64", 1 << 16, per_file)
        counts_per_doc = np.asarray([len(e) for e in chat.turn_ends], np.int64)
        turn_offsets = np.concatenate([[0], np.cumsum(counts_per_doc)]).astype(np.int64)
        _write_array(base, "turn_offsets", turn_offsets, "int64", 1 << 16, per_file)
    with open(os.path.join(tmp, "locations.json"), "w") as fh:
        json.dump({"locations": locations}, fh)
    if not per_file:
        _fsync_tree(tmp)  # durable before the rename and the ledger line, as with "files"
    if os.path.exists(final):  # left by a run killed between the rename and the ledger line
        shutil.rmtree(final)
    os.rename(tmp, final)
    return {
        "shard": task.shard,
        "source": task.source.name,
        "documents": len(docs),
        "tokens": int(offsets[-1]),
        "input_bytes": input_bytes,
        "counts": dict(counts),
        "problems": problems,
        "examples": examples,
    }


def plan_shards(listed: Sequence[list[str]], shard_bytes: int, min_shards: int) -> list[dict]:
    """Cuts each source's files, in order, into shards of whole files of about `shard_bytes`.

    Args:
        listed: the files of each source (a shard never mixes two sources).
        shard_bytes: the bytes a shard aims at (a file bigger than that is a shard alone).
        min_shards: a smaller corpus is cut into about this many shards instead.

    Returns:
        `{"source": index into listed, "files": [...], "id": n}` per shard, ids 0, 1, ...
    """
    sized = [[(f, file_stat(f)[0]) for f in files] for files in listed]
    total = sum(size for files in sized for _, size in files)
    # Small corpora still get about `min_shards` shards, so that workers have work to share.
    shard_bytes = max(1, min(shard_bytes, total // max(1, min_shards)))
    shards = []
    for si, files in enumerate(sized):
        current: list[str] = []
        size = 0
        for f, fsize in files:
            if current and size + fsize > shard_bytes:
                shards.append({"source": si, "files": current})
                current, size = [], 0
            current.append(f)
            size += fsize
        if current:
            shards.append({"source": si, "files": current})
    for i, s in enumerate(shards):
        s["id"] = i
    return shards


def _eval_hashes(sources: Sequence[Source], tok: Tokenizer, n: int) -> np.ndarray | None:
    if not sources:
        return None
    hashes = []
    for source in sources:
        for f in source.files():
            for doc in source.read(f):
                if doc.text is None:
                    continue
                text = doc.text
                if isinstance(text, bytes):
                    text = text.decode("utf-8", errors="replace")
                hashes.append(ngram_hashes(tok.encode(text), n))
    return np.unique(np.concatenate(hashes)) if hashes else np.zeros(0, np.uint64)  # sorted


def _special(tok: Tokenizer, what: str) -> str:
    """`"none"`, the token string, or `"id N"` for a tokenizer without token strings."""
    i = getattr(tok, f"{what}_id")
    if i is None:
        return "none"
    name = getattr(tok, f"{what}_token", None)
    return name if name is not None else f"id {i}"


def _read_ledger(path: str) -> dict[int, dict]:
    """The ledger's shards whose directory exists (a torn line: that shard is redone)."""
    done = {}
    for entry in read_json_lines(os.path.join(path, "ledger.jsonl")):
        if os.path.isdir(os.path.join(path, "shards", f"{entry['shard']:05d}")):
            done[entry["shard"]] = entry
    return done


def build_store(
    sources: Sequence[Source],
    tokenizer: Tokenizer,
    path: str | os.PathLike,
    *,
    policy: CleanPolicy | None = None,
    decontaminate: Sequence[Source] = (),
    workers: int = 1,
    executor: Executor | None = None,
    shard_bytes: int = 64 << 20,
    min_shards: int = 8,
    chunk_tokens: int = 1 << 15,
    progress: Callable[[int, int], None] | None = None,
    stop_after_shards: int | None = None,
    sync: str = "files",
) -> TokenStore | None:
    """Builds (or resumes, or just opens) the token store at local `path`.

    Args:
        sources: where documents come from; their order fixes the global document order.
            Sources with an `encode(raw, tokenizer)` method (chat sources) build a chat
            store: ids, loss masks and turn ends as `encode` gives them, no cleaning or
            bos/eos; rows it rejects are counted by their `.reason`. All or none are chat.
        tokenizer: e.g. `ByteTokenizer()`; its fingerprint is recorded and checked on open.
        path: a local directory (created).
        policy: the cleaning policy (`CleanPolicy()` by default).
        decontaminate: evaluation sources; training documents sharing a `policy.ngram`-token
            n-gram with any of them are dropped (counted per source as "decontaminated").
        workers: local worker processes (1 = build in this process).
        executor: overrides `workers` (anything with `map_unordered(fn, items)`).
        shard_bytes: input bytes per shard (whole files are never split).
        min_shards: smaller corpora are cut into about this many shards (so that workers
            share them); the plan never depends on `workers`, so neither does the store.
        chunk_tokens: zarr chunk length of the token arrays.
        progress: called as `progress(shards_done, shards_total)` after each shard.
        stop_after_shards: build at most this many new shards then return None without
            finalising (rerun to continue); for incremental builds and tests.
        sync: how a shard is made durable before its ledger line: `"files"` (tensorstore
            fsyncs each chunk file as it writes it) or `"shards"` (the shard's files are
            written without fsync, then all fsynced at once before the shard is renamed
            into place: the same guarantee, for about half the wait where an fsync costs
            ~10 ms). The store is the same either way.

    Returns:
        The opened `TokenStore`, or None when `stop_after_shards` stopped the build early.

    Raises:
        StoreError: `path` holds a build of different sources, tokenizer or options.

    >>> import tempfile, pathlib
    >>> from meltemi.data import ByteTokenizer, JsonlFiles
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "a.jsonl").write_text('{"text": "hi"}\\n{oops\\n{"text": "yo"}\\n')
    >>> store = build_store([JsonlFiles("a", [str(d / "a.jsonl")])], ByteTokenizer(), d / "s")
    >>> store.num_documents, store.skipped
    (2, {'malformed_json': 1})
    >>> ByteTokenizer().decode(store.document(1))
    'yo'
    """
    path = os.fspath(path)
    if "://" in path:
        raise StoreError(
            f"build_store(path={path!r}): builds write locally; build to a local directory "
            f"and copy it (the store opens from gs:// or s3:// through tensorstore)"
        )
    policy = policy or CleanPolicy()
    if sync not in _SYNC_MODES:
        raise ValueError(f"build_store(sync={sync!r}): use one of {list(_SYNC_MODES)}")
    if not sources:
        raise ValueError("build_store(sources=[]): pass at least one source")
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise ValueError(f"build_store: source names must be unique, got {names}")
    kind = _check_kinds(sources)
    chat = kind is not None
    if chat and decontaminate:
        # Template boilerplate (role headers, a shared system prompt) would match n-grams of
        # every conversation: n-gram decontamination as for text does not carry over.
        raise ValueError(
            f"build_store(decontaminate=[{', '.join(s.name for s in decontaminate)}]): "
            f"decontamination is for text stores; a chat store's shared template text would "
            f"match every conversation. Filter chat rows before building, and pass "
            f"decontaminate=()"
        )
    listed = [s.files() for s in sources]  # listed once for the plan, fingerprints and records
    shards = plan_shards(listed, shard_bytes, min_shards)
    options = dataclasses.asdict(policy) | {"chunk_tokens": chunk_tokens}
    plan = {
        "format": FORMAT,
        **({"kind": kind} if chat else {}),  # a text store's plan is what it always was
        "tokenizer": {
            "name": repr(tokenizer),
            "fingerprint": tokenizer.fingerprint(),
            "vocab_size": tokenizer.vocab_size,
            "bos_id": tokenizer.bos_id,
            "eos_id": tokenizer.eos_id,
            "pad_id": tokenizer.pad_id,
            # What each document is wrapped in: a token, or "none" (not added).
            "bos": _special(tokenizer, "bos") if policy.add_bos and not chat else "none",
            "eos": _special(tokenizer, "eos") if policy.add_eos and not chat else "none",
        },
        "sources": [
            {"name": s.name, "fingerprint": s.fingerprint(files)}
            for s, files in zip(sources, listed, strict=True)
        ],
        "decontaminate": [{"name": s.name, "fingerprint": s.fingerprint()} for s in decontaminate],
        "options": options,
        "token_dtype": _token_dtype(tokenizer.vocab_size),
        "shard_plan": shards,
    }
    finished = _open_finished(path, plan, tokenizer)  # no lock: a finished store is read-only
    if finished is not None:
        return finished
    os.makedirs(os.path.join(path, "shards"), exist_ok=True)
    with _build_lock(path):
        return _build_locked(
            path,
            plan,
            shards,
            sources=sources,
            listed=listed,
            tokenizer=tokenizer,
            policy=policy,
            decontaminate=decontaminate,
            executor=executor or make_executor(workers),
            chunk_tokens=chunk_tokens,
            progress=progress,
            stop_after_shards=stop_after_shards,
            sync=sync,
        )


def _check_kinds(sources: Sequence[Source]) -> str | None:
    """The store kind every source builds (None: text); a mix of kinds is refused."""
    kinds = [_kind(s) for s in sources]
    if len(set(kinds)) > 1:
        if PREFERENCE in kinds:
            pairs = [s.name for s, k in zip(sources, kinds, strict=True) if k == PREFERENCE]
            other = [s.name for s, k in zip(sources, kinds, strict=True) if k != PREFERENCE]
            raise ValueError(
                f"build_store: sources {pairs} hold preference pairs and {other} do not; a "
                f"store holds one kind: build the pairs into a store of their own"
            )
        chat = [s.name for s, k in zip(sources, kinds, strict=True) if k]
        text = [s.name for s, k in zip(sources, kinds, strict=True) if not k]
        raise ValueError(
            f"build_store: sources {chat} are chat sources and {text} are text sources; a "
            f"store holds one kind: build one store of each and mix them with "
            f"MixtureDataset({{'chat': ..., 'text': ...}}, weights)"
        )
    return kinds[0] if kinds else None


def _check_build(path: str, plan: dict, finished: bool) -> None:
    """Raises if `path/build.json` records a build of something else than `plan`."""
    with open(os.path.join(path, "build.json")) as fh:
        old = json.load(fh)
    # A finished store serves any request for the same content; the shard layout only has to
    # match when resuming.
    keys = [k for k in plan if not (finished and k == "shard_plan")]
    diff = [k for k in keys if old.get(k) != plan[k]]
    if diff:
        raise StoreError(
            f"build_store: {path} holds a build with different {diff}; use a new path, or "
            f"delete {path} to rebuild"
        )


def _open_finished(path: str, plan: dict, tokenizer: Tokenizer) -> TokenStore | None:
    """The store at `path` if its build has finished, else None; takes no lock.

    meta.json is written last and atomically (temporary name, fsync, rename) and a finished
    store is never written again, so any number of processes (trainers sharing a cache
    directory) may check and open it at once while a build elsewhere holds the lock."""
    if not os.path.exists(os.path.join(path, "meta.json")):
        return None
    _check_build(path, plan, finished=True)
    return TokenStore.open(path, tokenizer)  # checks that the sources did not change


@contextlib.contextmanager
def _build_lock(path: str):
    """An exclusive lock on `path/.build.lock` for the duration of a build (one builder);
    opening a finished store takes none (`_open_finished`)."""
    busy = StoreError(
        f"build_store: another build of {path} is running (it holds {path}/.build.lock); "
        f"wait for it, or build on one process and TokenStore.open() on the others"
    )
    with exclusive_lock(os.path.join(path, ".build.lock"), busy):
        yield


def _build_locked(
    path: str,
    plan: dict,
    shards: list[dict],
    *,
    sources: Sequence[Source],
    listed: Sequence[list[str]],
    tokenizer: Tokenizer,
    policy: CleanPolicy,
    decontaminate: Sequence[Source],
    executor: Executor,
    chunk_tokens: int,
    progress: Callable[[int, int], None] | None,
    stop_after_shards: int | None,
    sync: str = "files",
) -> TokenStore | None:
    if os.path.exists(os.path.join(path, "build.json")):
        _check_build(path, plan, finished=os.path.exists(os.path.join(path, "meta.json")))
    else:
        write_json(os.path.join(path, "build.json"), plan)
    if os.path.exists(os.path.join(path, "meta.json")):  # finished while we waited for the lock
        return TokenStore.open(path, tokenizer)  # checks that the sources did not change

    for entry in os.listdir(os.path.join(path, "shards")):
        if ".tmp-" in entry:  # debris of a killed worker
            shutil.rmtree(os.path.join(path, "shards", entry), ignore_errors=True)
    for entry in os.listdir(path):
        if entry.startswith(".eval-hashes-"):  # left by a killed build
            os.remove(os.path.join(path, entry))
    done = _read_ledger(path)
    todo = [s for s in shards if s["id"] not in done]
    if stop_after_shards is not None:
        todo = todo[:stop_after_shards]
    eval_hashes = None
    if todo and decontaminate:  # written once; each worker maps it once (not one copy a task)
        hashes = _eval_hashes(decontaminate, tokenizer, policy.ngram)
        eval_hashes = os.path.join(path, f".eval-hashes-{uuid.uuid4().hex[:8]}.npy")
        np.save(eval_hashes, hashes)
    tasks = [
        _ShardTask(
            path=path,
            shard=s["id"],
            source=sources[s["source"]],
            files=tuple(s["files"]),
            tokenizer=tokenizer,
            policy=policy,
            chunk_tokens=chunk_tokens,
            eval_hashes=eval_hashes,
            sync=sync,
            chat=plan.get("kind") in (CHAT, PREFERENCE),
        )
        for s in todo
    ]
    start = time.perf_counter()
    try:
        with open(os.path.join(path, "ledger.jsonl"), "a") as ledger:
            for entry in executor.map_unordered(_build_shard, tasks):
                append_json_line(ledger, entry)
                done[entry["shard"]] = entry
                if progress is not None:
                    progress(len(done), len(shards))
    finally:
        if eval_hashes is not None:
            os.remove(eval_hashes)
    elapsed = time.perf_counter() - start
    if len(done) < len(shards):
        return None
    files = [(s.name, f) for s, fs in zip(sources, listed, strict=True) for f in fs]
    return _finalise(path, plan, shards, done, elapsed, tokenizer, source_records(files))


def merge_examples(per_shard, limit: int = _MAX_EXAMPLES) -> dict[str, list[str]]:
    """The first `limit` `file:line` examples of each reason, in shard order.

    Args:
        per_shard: for each shard in order, its `{reason: [file:line, ...]}`.
        limit: examples kept per reason.
    """
    out: dict[str, list[str]] = {}
    for examples in per_shard:
        for reason, where in examples.items():
            kept = out.setdefault(reason, [])
            kept += where[: limit - len(kept)]
    return dict(sorted(out.items()))


def _finalise(path, plan, shards, done, elapsed, tokenizer, files) -> TokenStore:
    per_source: dict[str, dict] = {}
    skipped: collections.Counter = collections.Counter()
    for s in shards:
        entry = done[s["id"]]
        src = per_source.setdefault(
            entry["source"], {"documents": 0, "tokens": 0, "input_bytes": 0, "counts": {}}
        )
        src["documents"] += entry["documents"]
        src["tokens"] += entry["tokens"]
        src["input_bytes"] += entry["input_bytes"]
        for k, v in entry["counts"].items():
            src["counts"][k] = src["counts"].get(k, 0) + v
            skipped[k] += v
    meta = {
        "format": FORMAT,
        **({"kind": plan["kind"]} if "kind" in plan else {}),
        "tokenizer": plan["tokenizer"],
        "sources": plan["sources"],
        "decontaminate": plan["decontaminate"],
        "options": plan["options"],
        "token_dtype": plan["token_dtype"],
        "documents": sum(done[s["id"]]["documents"] for s in shards),
        "tokens": sum(done[s["id"]]["tokens"] for s in shards),
        "skipped": dict(sorted(skipped.items())),
        "per_source": per_source,
        "shards": [
            {
                "id": s["id"],
                "documents": done[s["id"]]["documents"],
                "tokens": done[s["id"]]["tokens"],
            }
            for s in shards
        ],
        "problems": [p for s in shards for p in done[s["id"]]["problems"]][:100],
        "examples": merge_examples(done[s["id"]].get("examples", {}) for s in shards),
        "last_build_seconds": round(elapsed, 3),
        "source_files": files,
    }
    write_json(os.path.join(path, "meta.json"), meta)
    return TokenStore.open(path, tokenizer)
