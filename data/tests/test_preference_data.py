"""Preference pairs: rendering with the chat template, loss only on the replies, the row shapes
of the common preference sets, and bad pairs counted per reason with their file:line.

Expected ids and masks are recomputed independently: with `transformers`' own
`apply_chat_template` (prompt + reply with the assistant mask, and the prompt alone with the
generation prompt, as TRL tokenizes a pair), and for the byte tokenizer from the rendered text.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
from chat_fixtures import STYLES, hf_tokenizer

from meltemi.data import ByteTokenizer, HfTokenizer, JsonlFiles, build_store
from meltemi.data.chat import (
    ChatFiles,
    ChatRowError,
    ChatTemplate,
    PreferenceFiles,
    encode_chat,
    encode_preference,
)

TEMPLATE = ChatTemplate(
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TOK = ByteTokenizer()


def _u(text):
    return {"role": "user", "content": text}


def _a(text):
    return {"role": "assistant", "content": text}


def _byte_reference(prompt: list, reply: str) -> tuple[list[int], list[int]]:
    """Ids and reply mask of a pair's conversation under TEMPLATE, from the text itself."""
    head = "".join(f"<|{m['role']}|>{m['content']}<eos>\n" for m in prompt) + "<|assistant|>"
    ids = TOK.encode_with_offsets(head + reply + "<eos>\n")[0].tolist()
    n_head = len(TOK.encode_with_offsets(head)[0])
    n_reply = len(TOK.encode_with_offsets(reply + "<eos>")[0])
    mask = [0] * n_head + [1] * n_reply + [0] * (len(ids) - n_head - n_reply)
    return ids, mask


def test_pair_ids_and_reply_mask_from_the_rendered_text():
    prompt = [_u("Καλημέρα"), _a("earlier answer"), _u("and now?")]
    pair = encode_preference(prompt, "good 🙂", "bad", TOK, TEMPLATE)
    for enc, reply in ((pair.chosen, "good 🙂"), (pair.rejected, "bad")):
        ids, mask = _byte_reference(prompt, reply)
        assert enc.ids.tolist() == ids
        assert enc.loss_mask.tolist() == mask
    # encode_chat alone would also train on the prompt's earlier assistant turn
    whole = encode_chat([*prompt, _a("bad")], TOK, TEMPLATE)
    assert whole.loss_mask.sum() > pair.rejected.loss_mask.sum()
    n = len(pair.chosen)
    assert pair.ids.tolist() == pair.chosen.ids.tolist() + pair.rejected.ids.tolist()
    assert pair.turn_ends.tolist() == [n, n + len(pair.rejected)]


def test_the_row_shapes_of_common_sets_encode_alike():
    explicit = encode_preference([_u("q?")], [_a("yes")], [_a("no")], TOK, TEMPLATE)
    strings = encode_preference("q?", "yes", "no", TOK, TEMPLATE)
    # UltraFeedback-binarized: a prompt string and whole conversations
    ultra = encode_preference("q?", [_u("q?"), _a("yes")], [_u("q?"), _a("no")], TOK, TEMPLATE)
    implicit = encode_preference(None, [_u("q?"), _a("yes")], [_u("q?"), _a("no")], TOK, TEMPLATE)
    for other in (strings, ultra, implicit):
        assert other.ids.tolist() == explicit.ids.tolist()
        assert other.loss_mask.tolist() == explicit.loss_mask.tolist()
        assert other.turn_ends.tolist() == explicit.turn_ends.tolist()


@pytest.fixture(scope="module")
def hf_tokenizers(tmp_path_factory):
    out = {}
    for name in ("chatml", "llama3"):
        d = tmp_path_factory.mktemp(name)
        fast = hf_tokenizer(d, STYLES[name], STYLES[name].template)
        out[name] = (fast, HfTokenizer(d, bos=STYLES[name].bos or "", eos=STYLES[name].eos), d)
    return out


@pytest.mark.parametrize("style", ["chatml", "llama3"])
def test_pair_equals_transformers_prompt_and_reply_tokens(hf_tokenizers, style):
    fast, tok, d = hf_tokenizers[style]
    prompt = [
        {"role": "system", "content": "You are terse."},
        _u("Καλημέρα! Πώς είσαι;"),
        _a("Very well, thank you."),
        _u("  Tell me a joke.\n"),
    ]
    chosen, rejected = "Why did the chicken cross the road?", "No. 日本語も話せます"
    pair = encode_preference(prompt, chosen, rejected, tok, ChatTemplate.from_pretrained(d))
    n_prompt = len(fast.apply_chat_template(prompt, add_generation_prompt=True, return_dict=False))
    assert pair.prompt_tokens == n_prompt
    for enc, reply in ((pair.chosen, chosen), (pair.rejected, rejected)):
        ref = fast.apply_chat_template(
            [*prompt, _a(reply)],
            chat_template=STYLES[style].annotated,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        mask = list(ref["assistant_masks"])
        mask[:n_prompt] = [0] * n_prompt  # the prompt's earlier assistant turn is context
        assert enc.ids.tolist() == ref["input_ids"]
        assert enc.loss_mask.tolist() == mask
        assert sum(mask) > 0


GOOD = [
    {"prompt": [_u("q1")], "chosen": [_a("yes")], "rejected": [_a("no")]},
    {"prompt": "q2", "chosen": [_u("q2"), _a("sure")], "rejected": [_u("q2"), _a("nope")]},
    {"chosen": [_u("q3"), _a("ok")], "rejected": [_u("q3"), _a("not ok")]},
    {"prompt": "q4", "chosen": "fine", "rejected": "bad"},
]
BAD = {
    "identical_replies": [
        {"prompt": "q", "chosen": "same", "rejected": "same"},
        {"prompt": "q", "chosen": "same", "rejected": [_a("same")]},
    ],
    "empty_reply": [
        {"prompt": "q", "chosen": "", "rejected": "no"},
        {"prompt": "q", "chosen": "yes", "rejected": "   "},
        {"prompt": "q", "chosen": [], "rejected": "no"},
        {"chosen": [_u("q"), _a("yes")], "rejected": [_u("q")]},
    ],
    "prompt_mismatch": [
        {"chosen": [_u("q"), _a("yes")], "rejected": [_u("other q"), _a("no")]},
        {"prompt": "not q", "chosen": [_u("q"), _a("yes")], "rejected": [_u("q"), _a("no")]},
        {"prompt": [_u("p")], "chosen": [_u("q"), _a("yes")], "rejected": "no"},
    ],
    "no_prompt": [{"chosen": "yes", "rejected": "no"}],
    "no_pair": [{"prompt": "q", "chosen": "yes"}, {"prompt": "q", "rejected": "no"}],
    "unknown_role": [
        {"prompt": [{"role": "robot", "content": "q"}], "chosen": "a", "rejected": "b"}
    ],
}


def _write(path: pathlib.Path, rows: list) -> pathlib.Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows) + "{oops\n")
    return path


def test_bad_pairs_are_counted_per_reason_with_file_and_line_and_never_stored(tmp_path):
    rows, expect = [], {}
    for reason, bad in BAD.items():
        for r in bad:
            rows.append(r)
            rows.append(GOOD[len(rows) % len(GOOD)])
            expect.setdefault(reason, []).append(len(rows) - 1)  # 1-based line of the bad row
    path = _write(tmp_path / "pairs.jsonl", rows)
    source = PreferenceFiles("p", [str(path)], template=TEMPLATE)
    store = build_store([source], TOK, tmp_path / "s", min_shards=1)
    counts = {k: len(v) for k, v in expect.items()} | {"malformed_json": 1}
    assert store.skipped == counts
    for reason, lines in expect.items():
        got = store.metadata["examples"][reason]
        assert [g.split(": ", 1)[0] for g in got] == [f"{path}:{n}" for n in lines][:5]
    kept = [r for r in rows if r in GOOD]
    assert store.num_documents == len(kept)
    for d, row in enumerate(kept):
        pair = encode_preference(row.get("prompt"), row["chosen"], row["rejected"], TOK, TEMPLATE)
        assert store.document(d).tolist() == pair.ids.tolist()
        assert store.loss_mask(d).tolist() == pair.loss_mask.tolist()
        assert store.pair_splits([d]).tolist() == [len(pair.chosen)]
    assert store.is_preference and store.has_loss_mask
    assert store.metadata["kind"] == "preference"


@pytest.mark.parametrize("reason", sorted(BAD))
def test_each_bad_pair_raises_its_reason(reason):
    for row in BAD[reason]:
        with pytest.raises(ChatRowError) as err:
            encode_preference(
                row.get("prompt"), row.get("chosen"), row.get("rejected"), TOK, TEMPLATE
            )
        assert err.value.reason == reason, (row, err.value)


def test_replies_rendering_to_the_same_tokens_are_identical():
    # Two different message objects (an extra key the template ignores) render the same.
    chosen = [{"role": "assistant", "content": "yes", "name": "x"}]
    with pytest.raises(ChatRowError, match="render to the same tokens") as err:
        encode_preference("q", chosen, "yes", TOK, TEMPLATE)
    assert err.value.reason == "identical_replies"


def test_missing_field_names_the_key_to_set(tmp_path):
    path = _write(tmp_path / "p.jsonl", [{"prompt": "q", "good": "yes", "rejected": "no"}])
    source = PreferenceFiles("p", [str(path)], template=TEMPLATE)
    raw = next(iter(source.read(str(path))))
    with pytest.raises(
        ChatRowError, match=r"p\.jsonl:1: the row has no 'chosen' field \(set chosen_key\)"
    ):
        source.encode(raw, TOK)
    keyed = PreferenceFiles("p", [str(path)], template=TEMPLATE, chosen_key="good")
    assert len(keyed.encode(raw, TOK).chosen) > 0
    assert keyed.fingerprint() != source.fingerprint()


def test_parquet_pairs_read_like_jsonl(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [GOOD[0], GOOD[0] | {"prompt": [_u("q9")]}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    source = PreferenceFiles("p", [str(tmp_path / "p.parquet")], template=TEMPLATE)
    store = build_store([source], TOK, tmp_path / "s", min_shards=1)
    assert store.num_documents == 2 and store.location(1) == f"{tmp_path}/p.parquet:row 2"
    other = PreferenceFiles("p", [str(tmp_path / "p.parquet")], template=TEMPLATE, chosen_key="c")
    with pytest.raises(Exception, match=r"has no column 'c'.*\(set chosen_key\)"):
        list(other.read(str(tmp_path / "p.parquet")))


def test_pairs_and_other_sources_in_one_store_are_refused(tmp_path):
    path = _write(tmp_path / "p.jsonl", GOOD)
    pairs = PreferenceFiles("p", [str(path)], template=TEMPLATE)
    (tmp_path / "c.jsonl").write_text(json.dumps({"messages": [_u("q"), _a("a")]}) + "\n")
    chat = ChatFiles("c", [str(tmp_path / "c.jsonl")], template=TEMPLATE)
    (tmp_path / "t.jsonl").write_text(json.dumps({"text": "plain"}) + "\n")
    text = JsonlFiles("t", [str(tmp_path / "t.jsonl")])
    for other in (chat, text):
        with pytest.raises(ValueError, match=r"sources \['p'\] hold preference pairs and"):
            build_store([pairs, other], TOK, tmp_path / f"s_{other.name}")


def test_pair_splits_refuses_a_chat_store(tmp_path):
    (tmp_path / "c.jsonl").write_text(json.dumps({"messages": [_u("q"), _a("a")]}) + "\n")
    store = build_store(
        [ChatFiles("c", [str(tmp_path / "c.jsonl")], template=TEMPLATE)], TOK, tmp_path / "s"
    )
    assert not store.is_preference and store.metadata["kind"] == "chat"
    with pytest.raises(Exception, match="holds no preference pairs; build it from"):
        store.pair_splits([0])
    assert np.asarray(store.turn_ends(0)).tolist() == [len(store.document(0)) - 1]
