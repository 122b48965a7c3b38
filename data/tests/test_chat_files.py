"""`ChatFiles`: JSONL/compressed/Parquet rows, bad rows as counted reasons, byte-level chat."""

from __future__ import annotations

import gzip
import json
import pickle

import pytest
from chat_fixtures import CONVERSATIONS, GEMMA, LLAMA3, QWEN25, TOOLS

from meltemi.data import ByteTokenizer, Source, SourceError
from meltemi.data.chat import ChatFiles, ChatRowError, ChatTemplate, encode_chat

BYTES = ByteTokenizer()
CHATML = ChatTemplate(QWEN25)
GOOD = {"messages": CONVERSATIONS["multi_turn"]}


def _rows(src: ChatFiles):
    return [raw for f in src.files() for raw in src.read(f)]


def _outcomes(src: ChatFiles) -> list[tuple[str, str]]:
    """(location, "ok" or the reason) of every row, as a build would count them."""
    out = []
    for raw in _rows(src):
        try:
            src.encode(raw, BYTES)
            out.append((raw.location, "ok"))
        except ChatRowError as e:
            assert str(e).startswith(raw.location + ": ")
            out.append((raw.location, e.reason))
    return out


def test_reads_jsonl_gzip_and_parquet_alike(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [{**GOOD, "tools": None}, {"messages": CONVERSATIONS["tool_calls"], "tools": TOOLS}]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet")
    src = ChatFiles("chat", [str(tmp_path)], template=CHATML)
    assert isinstance(src, Source)
    raws = _rows(src)
    assert [r.location.rsplit("/", 1)[1] for r in raws] == [
        "a.jsonl:1", "a.jsonl:2", "b.jsonl.gz:1", "b.jsonl.gz:2", "c.parquet:row 1",
        "c.parquet:row 2"]  # fmt: skip
    expected = [encode_chat(r["messages"], BYTES, CHATML, tools=r.get("tools")) for r in rows] * 3
    for raw, want in zip(raws, expected, strict=True):
        got = src.encode(raw, BYTES)
        assert got.ids.tolist() == want.ids.tolist()
        assert got.loss_mask.tolist() == want.loss_mask.tolist()
        assert got.turn_ends.tolist() == want.turn_ends.tolist()
    assert "get_weather" in BYTES.decode(src.encode(raws[1], BYTES).ids)  # the tools reached it


def test_bad_rows_are_counted_by_reason_with_their_line(tmp_path):
    two_users = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                 {"role": "assistant", "content": "c"}]  # fmt: skip
    lines = [
        json.dumps(GOOD),
        json.dumps({"text": "no messages here"}),
        '{"messages": [{"role": "user", "content": "cut',
        json.dumps({"messages": [{"role": "wizard", "content": "x"}]}),
        json.dumps({"messages": two_users}),
        json.dumps({"messages": [{"role": "user", "content": "only a question"}]}),
        json.dumps({"messages": []}),
        json.dumps({"messages": ["just a string"]}),
        json.dumps(GOOD),
    ]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    src = ChatFiles("chat", [str(tmp_path / "a.jsonl")], template=ChatTemplate(GEMMA))
    reasons = [(loc.rsplit(":", 1)[1], reason) for loc, reason in _outcomes(src)]
    assert reasons == [
        ("1", "ok"),
        ("2", "no_messages"),
        ("3", "malformed_json"),
        ("4", "unknown_role"),
        ("5", "template_error"),  # Gemma: "Conversation roles must alternate"
        ("6", "no_assistant_tokens"),
        ("7", "no_messages"),
        ("8", "bad_message"),
        ("9", "ok"),
    ]


def test_row_error_messages_say_what_is_wrong(tmp_path):
    gemma = ChatTemplate(GEMMA)
    two_users = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ChatRowError, match="roles must alternate") as e:
        encode_chat(two_users, BYTES, gemma)
    assert e.value.reason == "template_error"
    with pytest.raises(ChatRowError, match=r"message 0 has role 'wizard'; known roles: \[") as e:
        encode_chat([{"role": "wizard", "content": "x"}], BYTES, gemma)
    with pytest.raises(ChatRowError, match="no assistant tokens.*train_on='all'"):
        encode_chat([{"role": "user", "content": "x"}], BYTES, gemma)
    with pytest.raises(ValueError, match=r"train_on='user'.*\['assistant', 'all'\]"):
        encode_chat(CONVERSATIONS["multi_turn"], BYTES, gemma, train_on="user")


def test_a_raising_template_is_a_row_error_not_a_crash():
    t = ChatTemplate("{{ raise_exception('no tools for you') if tools else 'fine' }}")
    with pytest.raises(ChatRowError, match="no tools for you") as e:
        encode_chat(CONVERSATIONS["system_prompt"], BYTES, t, tools=TOOLS)
    assert e.value.reason == "template_error"


def test_no_assistant_row_trains_on_everything_with_train_on_all():
    enc = encode_chat(
        [{"role": "user", "content": "x"}], BYTES, ChatTemplate(GEMMA), train_on="all"
    )
    assert enc.loss_mask.tolist() == [1] * len(enc.ids) and enc.turn_ends.tolist() == []


def test_byte_tokenizer_maps_its_bos_and_eos_strings_to_ids():
    t = ChatTemplate(LLAMA3.replace("'<|eot_id|>'", "eos_token"))  # bos/eos from the tokenizer
    enc = encode_chat(CONVERSATIONS["multi_turn"], BYTES, t)
    text = t.render(CONVERSATIONS["multi_turn"], bos_token="<bos>", eos_token="<eos>")
    assert enc.ids[0] == BYTES.bos_id
    assert int((enc.ids == BYTES.eos_id).sum()) == text.count("<eos>") == 4
    assert BYTES.decode(enc.ids) == text.replace("<bos>", "").replace("<eos>", "")
    # Each assistant turn is trained through its eos: the model learns to stop.
    assert [enc.ids[e - 1] for e in enc.turn_ends] == [BYTES.eos_id] * 2
    assert enc.loss_mask[enc.turn_ends - 1].tolist() == [1, 1]
    # Plain (non-chat) encoding keeps the strings as bytes.
    assert BYTES.encode("<eos>").tolist() == list(b"<eos>")


def test_byte_tokenizer_offsets_cover_multibyte_characters():
    ids, offsets = BYTES.encode_with_offsets("aΩ<eos>日")
    assert ids.tolist() == [97, 206, 169, 257, 230, 151, 165]
    assert offsets.tolist() == [[0, 1], [1, 2], [1, 2], [2, 7], [7, 8], [7, 8], [7, 8]]


def test_fingerprint_follows_template_and_train_on(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps(GOOD) + "\n")
    a = ChatFiles("c", [str(tmp_path)], template=CHATML)
    assert (
        a.fingerprint()
        == ChatFiles("c", [str(tmp_path)], template=ChatTemplate(QWEN25)).fingerprint()
    )
    assert (
        a.fingerprint()
        != ChatFiles("c", [str(tmp_path)], template=ChatTemplate(GEMMA)).fingerprint()
    )
    assert (
        a.fingerprint()
        != ChatFiles("c", [str(tmp_path)], template=CHATML, train_on="all").fingerprint()
    )
    b = pickle.loads(pickle.dumps(a))  # process executors pickle sources
    raw = _rows(a)[0]
    assert b.encode(raw, BYTES).ids.tolist() == a.encode(raw, BYTES).ids.tolist()


def test_bad_options_name_the_field(tmp_path):
    with pytest.raises(SourceError, match=r"train_on='users'.*\['assistant', 'all'\]"):
        ChatFiles("c", [str(tmp_path)], template=CHATML, train_on="users")
    with pytest.raises(SourceError, match="template='x'; pass a ChatTemplate"):
        ChatFiles("c", [str(tmp_path)], template="x")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(SourceError, match="notes.txt is neither JSON lines nor Parquet"):
        ChatFiles("c", [str(tmp_path)], template=CHATML).files()


def test_parquet_without_the_messages_column_is_a_source_error(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.Table.from_pylist([{"text": "x"}]), tmp_path / "c.parquet")
    src = ChatFiles("c", [str(tmp_path)], template=CHATML)
    with pytest.raises(SourceError, match=r"no column 'messages'; its columns are \['text'\]"):
        list(src.read(src.files()[0]))


def test_derived_mask_needs_an_incremental_template():
    # A template whose prefix renders disagree with the full render cannot be masked without
    # {% generation %}: the row says so instead of training on the wrong tokens.
    t = ChatTemplate("{{ messages | length }}{% for m in messages %}{{ m.content }}{% endfor %}"
                     "{% if add_generation_prompt %}>{% endif %}")  # fmt: skip
    with pytest.raises(ChatRowError, match=r"messages\[:1\].*not a prefix.*generation") as e:
        encode_chat(CONVERSATIONS["system_prompt"][1:], BYTES, t)
    assert e.value.reason == "template_not_incremental"
    with pytest.raises(ChatRowError, match="not a prefix"):  # turn_ends need the spans too
        encode_chat(CONVERSATIONS["system_prompt"][1:], BYTES, t, train_on="all")
