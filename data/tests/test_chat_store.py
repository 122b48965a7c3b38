"""Chat stores: ids, loss masks and turn ends stored beside the tokens, bad rows counted, and
text stores exactly as before.

`FakeChat` stands in for `meltemi.data.chat.ChatFiles` (same interface: `files`, `read`,
`fingerprint`, `encode(raw, tokenizer)`), with a format simple enough to recompute by hand.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from collections.abc import Iterator

import numpy as np
import pytest
from conftest import varied_texts, write_jsonl

from meltemi.data import (
    ByteTokenizer,
    JsonlFiles,
    MixtureDataset,
    PackedDataset,
    RawDocument,
    Source,
    StoreError,
    TokenStore,
    build_store,
)


class FakeRowError(ValueError):
    """Like `ChatRowError`: a bad row, counted under `.reason`."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclasses.dataclass
class Encoded:
    ids: np.ndarray
    loss_mask: np.ndarray
    turn_ends: np.ndarray


ROLES = ("system", "user", "assistant")


def fake_encode(row: dict, tok: ByteTokenizer) -> Encoded:
    """`role: content` per message; an assistant turn's content and closing eos carry loss
    and it ends just after that eos; other turns end with a newline (no loss)."""
    if not row.get("messages"):
        raise FakeRowError("no_messages", "the row has no 'messages'")
    ids, mask, ends = [], [], []
    for m in row["messages"]:
        if m["role"] not in ROLES:
            raise FakeRowError("unknown_role", f"unknown role {m['role']!r}")
        head = tok.encode(f"{m['role']}: ").tolist()
        body = tok.encode(m["content"]).tolist()
        ids += head
        mask += [0] * len(head)
        if m["role"] == "assistant":
            ids += body + [tok.eos_id]
            mask += [1] * (len(body) + 1)
            ends.append(len(ids))
        else:
            ids += body + tok.encode("\n").tolist()
            mask += [0] * (len(body) + 1)
    if not any(mask):
        raise FakeRowError("no_assistant_tokens", "no assistant tokens to train on")
    return Encoded(np.asarray(ids, np.int32), np.asarray(mask, np.uint8), np.asarray(ends))


class FakeChat(Source):
    """JSON lines of `{"messages": [...]}`; each row is one `RawDocument` (`file:line`)."""

    def __init__(self, name: str, paths):
        self.name = name
        self.paths = [str(p) for p in paths]

    def files(self) -> list[str]:
        return list(self.paths)

    def read(self, path: str) -> Iterator[RawDocument]:
        with open(path) as f:
            for lineno, line in enumerate(f, start=1):
                if line.strip():
                    yield RawDocument(f"{path}:{lineno}", line)

    def encode(self, raw: RawDocument, tokenizer) -> Encoded:
        try:
            row = json.loads(raw.text)
        except json.JSONDecodeError as e:
            raise FakeRowError("malformed_json", f"malformed JSON ({e.msg})") from None
        return fake_encode(row, tokenizer)


def conversations(count: int, seed: int = 0) -> list[dict]:
    """Rows of 1-4 exchanges (some with a system turn), contents of 1-30 varied characters."""
    rng = np.random.default_rng(seed)
    words = ["ja", "nein", "ok", "ναι", "όχι", "why?", "because", "3+4=7", "hm"]
    rows = []
    for i in range(count):
        msgs = [{"role": "system", "content": f"be brief {i}"}] if i % 3 == 0 else []
        for _ in range(int(rng.integers(1, 5))):
            for role in ("user", "assistant"):
                n = int(rng.integers(1, 7))
                msgs.append({"role": role, "content": " ".join(rng.choice(words, n))})
        rows.append({"messages": msgs})
    return rows


def write_rows(path: pathlib.Path, rows: list) -> pathlib.Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def chat_files(tmp_path: pathlib.Path, count: int, files: int = 3, seed: int = 0) -> list:
    rows = conversations(count, seed)
    paths = []
    for k in range(files):
        paths.append(write_rows(tmp_path / f"chat{k}.jsonl", rows[k::files]))
    return paths


def _row_at(location: str) -> dict:
    path, line = location.rsplit(":", 1)
    return json.loads(pathlib.Path(path).read_text().splitlines()[int(line) - 1])


def _store_arrays(store: TokenStore) -> list[tuple]:
    return [
        (store.document(d).tolist(), store.loss_mask(d).tolist(), store.turn_ends(d).tolist())
        for d in range(store.num_documents)
    ]


def test_chat_rows_are_stored_with_their_masks_and_turn_ends(tmp_path):
    tok = ByteTokenizer()
    paths = chat_files(tmp_path, 41)
    store = build_store([FakeChat("c", paths)], tok, tmp_path / "s", min_shards=3)
    assert store.has_loss_mask and store.metadata["kind"] == "chat"
    assert len(store.metadata["shards"]) == 3 and store.num_documents == 41
    # Not wrapped in bos/eos: exactly the ids encode gave, and the metadata says so.
    assert (store.metadata["tokenizer"]["bos"], store.metadata["tokenizer"]["eos"]) == (
        "none",
        "none",
    )
    for d in range(store.num_documents):
        want = fake_encode(_row_at(store.location(d)), tok)
        assert store.document(d).tolist() == want.ids.tolist()
        assert store.loss_mask(d).tolist() == want.loss_mask.tolist()
        assert store.turn_ends(d).tolist() == want.turn_ends.tolist()
    # Rows are in source order: file 0's rows first.
    assert store.location(0) == f"{paths[0]}:1" and store.location(14) == f"{paths[1]}:1"


def test_mask_reads_are_batched_like_token_reads(tmp_path):
    store = build_store([FakeChat("c", chat_files(tmp_path, 30))], ByteTokenizer(), tmp_path / "s")
    rng = np.random.default_rng(1)
    docs = rng.integers(0, store.num_documents, 50)
    starts = np.asarray([rng.integers(0, store.document_lengths[d] + 1) for d in docs])
    stops = np.asarray(
        [rng.integers(a, store.document_lengths[d] + 1) for a, d in zip(starts, docs, strict=True)]
    )
    got = store.read_mask_flat(docs, starts, stops)
    want = [store.loss_mask(int(d))[a:b] for d, a, b in zip(docs, starts, stops, strict=True)]
    assert got.dtype == np.uint8 and got.tolist() == np.concatenate(want).tolist()


def test_bad_chat_rows_are_counted_per_reason_with_file_and_line(tmp_path):
    good = conversations(5)
    rows = [
        good[0],
        {"text": "no messages here"},
        good[1],
        {"messages": [{"role": "wizard", "content": "hi"}]},
        "{broken json",
        {"messages": [{"role": "user", "content": "only a question"}]},
        good[2],
        {"messages": []},
    ]
    path = write_rows(tmp_path / "bad.jsonl", rows)
    store = build_store([FakeChat("c", [path])], ByteTokenizer(), tmp_path / "s")
    assert store.num_documents == 3
    want = {"malformed_json": 1, "no_assistant_tokens": 1, "no_messages": 2, "unknown_role": 1}
    assert store.skipped == want
    examples = store.metadata["examples"]
    assert [e.split(": ")[0] for e in examples["no_messages"]] == [f"{path}:2", f"{path}:8"]
    assert examples["unknown_role"] == [f"{path}:4: unknown role 'wizard'"]
    assert examples["malformed_json"][0].startswith(f"{path}:5: malformed JSON")
    assert examples["no_assistant_tokens"][0].startswith(f"{path}:6: ")
    assert "no_messages 2" in store.skipped_summary()


class _WrongMask(FakeChat):
    def encode(self, raw, tokenizer):
        enc = super().encode(raw, tokenizer)
        return Encoded(enc.ids, enc.loss_mask[:-1], enc.turn_ends)


def test_an_inconsistent_encoding_is_raised_not_counted(tmp_path):
    src = _WrongMask("c", chat_files(tmp_path, 4, files=1))
    with pytest.raises(ValueError, match=r"loss_mask has \d+ values for \d+ ids"):
        build_store([src], ByteTokenizer(), tmp_path / "s")


def test_chat_and_text_sources_in_one_store_are_refused(tmp_path):
    chat = FakeChat("chat", chat_files(tmp_path, 4, files=1))
    text = JsonlFiles("web", [str(write_jsonl(tmp_path / "t.jsonl", ["hello"]))])
    with pytest.raises(ValueError, match=r"\['chat'\] are chat sources and \['web'\] are text"):
        build_store([chat, text], ByteTokenizer(), tmp_path / "s")


def test_a_stopped_chat_build_resumes_to_the_same_store(tmp_path):
    paths = chat_files(tmp_path, 40, files=4)
    tok = ByteTokenizer()
    whole = build_store([FakeChat("c", paths)], tok, tmp_path / "whole", min_shards=4)
    assert build_store([FakeChat("c", paths)], tok, tmp_path / "r", stop_after_shards=1) is None
    assert build_store([FakeChat("c", paths)], tok, tmp_path / "r", stop_after_shards=2) is None
    resumed = build_store([FakeChat("c", paths)], tok, tmp_path / "r", min_shards=4)
    assert len(resumed.metadata["shards"]) == 4
    assert _store_arrays(resumed) == _store_arrays(whole)
    assert len(whole.metadata["shards"]) == 4


def test_a_finished_chat_store_is_reopened_not_rebuilt(tmp_path):
    paths = chat_files(tmp_path, 12)
    first = build_store([FakeChat("c", paths)], ByteTokenizer(), tmp_path / "s")
    stamp = os.stat(tmp_path / "s" / "meta.json").st_mtime_ns
    again = build_store([FakeChat("c", paths)], ByteTokenizer(), tmp_path / "s")
    assert os.stat(tmp_path / "s" / "meta.json").st_mtime_ns == stamp
    assert _store_arrays(again) == _store_arrays(first)
    reopened = TokenStore.open(tmp_path / "s", ByteTokenizer())
    assert reopened.has_loss_mask and _store_arrays(reopened) == _store_arrays(first)


def test_chat_decontamination_is_refused_with_the_fix(tmp_path):
    rows = conversations(10)
    train = FakeChat("train", [write_rows(tmp_path / "train.jsonl", rows)])
    held = FakeChat("held", [write_rows(tmp_path / "held.jsonl", [rows[3]])])
    with pytest.raises(ValueError, match=r"decontaminate=\[held\]\): .* pass decontaminate=\(\)"):
        build_store([train], ByteTokenizer(), tmp_path / "s", decontaminate=[held])


# -- text stores: exactly as before ------------------------------------------------------------

# sha256 of every batch array of the datasets below, computed by the code before chat stores
# existed (git HEAD of 2026-11-26): a text store's batches must stay bit for bit the same.
_TEXT_BATCHES = "8d0427f9f4e5c4fc978b310fbc027b72ade514a171838339199af4de0495618b"
_TEXT_MIXTURE = "70bdf3f77fcb7b771f41a9bc8957d94687e2f17a693ba20a3c69f229a1fe2e4a"


def _digest(batches) -> str:
    h = hashlib.sha256()
    for b in batches:
        for k in sorted(b):
            h.update(k.encode())
            h.update(b[k].dtype.str.encode())
            h.update(b[k].tobytes())
    return h.hexdigest()


def test_text_store_batches_are_bitwise_unchanged(tmp_path):
    src = JsonlFiles("tiny", [str(write_jsonl(tmp_path / "tiny.jsonl", varied_texts(37)))])
    store = build_store([src], ByteTokenizer(), tmp_path / "store", min_shards=3)
    options = [
        {"mode": "stream"},
        {"mode": "document"},
        {"mode": "document", "packing": "ffd", "pack_window": 8},
    ]
    batches = []
    for kw in options:
        ds = PackedDataset(store, seq_len=24, batch_size=5, seed=3, **kw)
        batches += [ds.batch(step) for step in range(4)]
    assert _digest(batches) == _TEXT_BATCHES

    src2 = JsonlFiles("two", [str(write_jsonl(tmp_path / "two.jsonl", varied_texts(23, seed=5)))])
    store2 = build_store([src2], ByteTokenizer(), tmp_path / "store2")
    a = PackedDataset(store, seq_len=24, batch_size=5, seed=1, mode="document", packing="ffd")
    b = PackedDataset(store2, seq_len=24, batch_size=5, seed=2)
    mix = MixtureDataset({"a": a, "b": b}, {"a": 0.6, "b": 0.4}, batch_size=5)
    assert _digest([mix.batch(step) for step in range(4)]) == _TEXT_MIXTURE


def test_text_store_files_and_metadata_are_unchanged(tmp_path, tiny_store):
    # The keys of build.json decide whether an old build resumes: they must not change.
    build = json.loads((pathlib.Path(tiny_store.path) / "build.json").read_text())
    assert sorted(build) == [
        "decontaminate",
        "format",
        "options",
        "shard_plan",
        "sources",
        "token_dtype",
        "tokenizer",
    ]
    assert "kind" not in tiny_store.metadata and not tiny_store.has_loss_mask
    shard = pathlib.Path(tiny_store.path) / "shards" / "00000"
    assert sorted(os.listdir(shard)) == ["locations.json", "offsets", "tokens"]
    with pytest.raises(StoreError, match="is a text store .* build it from a chat source"):
        tiny_store.read_mask_flat([0], [0], [3])
    with pytest.raises(StoreError, match="is a text store"):
        tiny_store.turn_ends(0)
