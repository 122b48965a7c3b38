"""End to end: `meltemi.data.chat.ChatFiles` rows through `build_store` and `PackedDataset`.

A ChatML-style template (the Qwen layout) over the byte tokenizer, whose `<|im_end|>`-like
closing token is its eos: the store holds exactly `encode_chat`'s ids, masks and turn ends,
bad rows are counted per reason at their line, and packed rows train on assistant text only.
"""

from __future__ import annotations

import json

import numpy as np

from meltemi.data import ByteTokenizer, PackedDataset, build_store
from meltemi.data.chat import ChatFiles, ChatTemplate, encode_chat

# ChatML as Qwen writes it, with the byte tokenizer's eos closing each turn; a second user turn
# in a row is refused by the template, as some templates do.
TEMPLATE = (
    "{% for m in messages %}"
    "{% if loop.index0 > 0 and m.role == 'user' and messages[loop.index0 - 1].role == 'user' %}"
    "{{ raise_exception('two user turns in a row') }}{% endif %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _msgs(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


ROWS = [
    {"messages": _msgs(("system", "Be kind."), ("user", "Γειά!"), ("assistant", "Γειά σου."))},
    {"messages": _msgs(("user", "2+2?"), ("assistant", "4"), ("user", "3+3?"), ("assistant", "6"))},
    {"text": "not a conversation"},
    {"messages": _msgs(("user", "a"), ("user", "b"), ("assistant", "c"))},
    {"messages": _msgs(("wizard", "abracadabra"), ("assistant", "no"))},
    {"messages": _msgs(("user", "only a question"))},
    {"messages": _msgs(("user", "long?"), ("assistant", "yes " * 20), ("user", "ok"))},
]


def test_chat_files_build_a_chat_store_and_pack_assistant_only(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ROWS) + "{oops\n")
    tok = ByteTokenizer()
    template = ChatTemplate(TEMPLATE)
    store = build_store([ChatFiles("c", [str(path)], template=template)], tok, tmp_path / "s")

    assert store.has_loss_mask and store.num_documents == 3
    kept = [ROWS[0], ROWS[1], ROWS[6]]
    for d, row in enumerate(kept):
        want = encode_chat(row["messages"], tok, template)
        assert store.document(d).tolist() == want.ids.tolist()
        assert store.loss_mask(d).tolist() == want.loss_mask.tolist()
        assert store.turn_ends(d).tolist() == want.turn_ends.tolist()
    assert store.location(2) == f"{path}:7"

    skipped = store.skipped
    assert sum(skipped.values()) == 5 and skipped["malformed_json"] == 1
    assert skipped["unknown_role"] == 1 and skipped["no_assistant_tokens"] == 1
    examples = store.metadata["examples"]
    where = {e.split(": ")[0] for reason in skipped for e in examples[reason]}
    assert where == {f"{path}:{n}" for n in (3, 4, 5, 6, 8)}
    assert any("two user turns in a row" in e for r in examples for e in examples[r])

    ds = PackedDataset(store, seq_len=131, batch_size=3, mode="document", overlong="truncate")
    assert ds.overlong == {"dropped": 0, "truncated": 1}  # the third, cut after its answer
    batch = ds.sequences(np.arange(ds.num_sequences))
    trained = {}
    for q in range(ds.num_sequences):
        for p in ds.locate_sequence(q):
            span = slice(p.row_offset, p.row_offset + p.length)
            trained[p.document] = batch["targets"][q, span][batch["loss_mask"][q, span] > 0]
    answers = {d: tok.decode(ids) for d, ids in trained.items()}
    assert answers == {0: "Γειά σου.", 1: "46", 2: "yes " * 20}
    # Each answer's closing eos is trained (the model learns to stop), nothing else special.
    assert [int((ids == tok.eos_id).sum()) for _, ids in sorted(trained.items())] == [1, 2, 1]
