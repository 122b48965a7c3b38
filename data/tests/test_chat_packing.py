"""Packing conversations: whole in one row, never cut mid-turn, segment ids and positions per
conversation, the loss mask aligned to targets, per-conversation averaging, and mixtures.

Every expectation is recomputed here from the store's documents, masks and turn ends.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import varied_texts, write_jsonl
from test_chat_store import FakeChat, chat_files, conversations, write_rows

from meltemi.data import ByteTokenizer, JsonlFiles, MixtureDataset, PackedDataset, build_store

SEQ = 101  # odd; conversations run from 39 to 272 tokens


def _turn(role, content):
    return {"role": role, "content": content}


@pytest.fixture(scope="module")
def chat_store(tmp_path_factory):
    d = tmp_path_factory.mktemp("chat")
    long_first = {"messages": [_turn("user", "q"), _turn("assistant", "long " * 30)]}
    long_last = {
        "messages": [_turn("user", "hi"), _turn("assistant", "ok"), _turn("user", "more")]
        + [_turn("assistant", "z" * 150)]
    }
    extra = write_rows(d / "long.jsonl", [long_first, long_last])
    source = FakeChat("c", [*chat_files(d, 53), extra])
    return build_store([source], ByteTokenizer(), d / "s", min_shards=2)


def _kept_length(store, d: int, overlong: str) -> int:
    """The tokens of conversation d that a row holds (0: dropped), by the rule itself."""
    n = int(store.document_lengths[d])
    if n <= SEQ:
        return n
    fit = [e for e in store.turn_ends(d).tolist() if e <= SEQ]
    return fit[-1] if overlong == "truncate" and fit else 0


def _epoch(ds):
    rows = np.arange(ds.num_sequences)
    return rows, ds.sequences(rows)


def _pieces(ds, rows):
    return [ds.locate_sequence(int(q)) for q in rows]


@pytest.mark.parametrize("overlong", ["drop", "truncate"])
@pytest.mark.parametrize("packing", ["ffd", "next_fit"])
def test_every_conversation_is_packed_whole_in_one_row_once_per_epoch(
    chat_store, packing, overlong
):
    ds = PackedDataset(
        chat_store, seq_len=SEQ, batch_size=3, mode="document", packing=packing, overlong=overlong
    )
    rows, batch = _epoch(ds)
    seen = []
    for r, pieces in enumerate(_pieces(ds, rows)):
        for p in pieces:
            assert p.token_offset == 0  # a conversation starts its piece
            assert p.length == _kept_length(chat_store, p.document, overlong)
            got = batch["tokens"][r, p.row_offset : p.row_offset + p.length]
            assert got.tolist() == chat_store.document(p.document)[: p.length].tolist()
            seen.append(p.document)
    want = [d for d in range(chat_store.num_documents) if _kept_length(chat_store, d, overlong)]
    assert sorted(seen) == want


def test_truncation_is_at_a_turn_end_and_counted(chat_store):
    ds = PackedDataset(chat_store, seq_len=SEQ, batch_size=3, mode="document", overlong="truncate")
    over = [d for d in range(chat_store.num_documents) if chat_store.document_lengths[d] > SEQ]
    cut = [d for d in over if (chat_store.turn_ends(d) <= SEQ).any()]
    assert 0 < len(cut) < len(over)  # the corpus has both cases
    assert ds.overlong == {"dropped": len(over) - len(cut), "truncated": len(cut)}
    for d in cut:
        (q,) = ds.sequence_indices_of(d, ds.num_sequences)
        (piece,) = [p for p in ds.locate_sequence(int(q)) if p.document == d]
        assert piece.length in chat_store.turn_ends(d).tolist()  # never mid-turn
        assert piece.length == max(e for e in chat_store.turn_ends(d) if e <= SEQ)
        # The token after the cut would open the next turn: the kept part ends on eos.
        assert chat_store.document(d)[piece.length - 1] == ByteTokenizer().eos_id


def test_dropped_conversations_are_counted_and_never_seen(chat_store):
    ds = PackedDataset(chat_store, seq_len=SEQ, batch_size=3, mode="document", overlong="drop")
    over = [d for d in range(chat_store.num_documents) if chat_store.document_lengths[d] > SEQ]
    assert ds.overlong == {"dropped": len(over), "truncated": 0} and over
    for d in over:
        assert ds.sequence_indices_of(d, 3 * ds.num_sequences).size == 0


def test_segment_ids_separate_conversations_and_positions_restart(chat_store):
    ds = PackedDataset(chat_store, seq_len=SEQ, batch_size=3, mode="document", packing="ffd")
    rows, batch = _epoch(ds)
    multi = 0
    for r, pieces in enumerate(_pieces(ds, rows)):
        seg, pos = batch["segment_ids"][r], batch["positions"][r]
        want_seg = np.zeros(SEQ, np.int32)
        for k, p in enumerate(pieces, start=1):
            want_seg[p.row_offset : p.row_offset + p.length] = k
            assert pos[p.row_offset : p.row_offset + p.length].tolist() == list(range(p.length))
        assert seg.tolist() == want_seg.tolist()
        # The block-diagonal causal mask built from segment ids: i attends j only inside
        # the same conversation.
        attend = (seg[:, None] == seg[None, :]) & (seg[:, None] > 0) & np.tri(SEQ, dtype=bool)
        for p in pieces:
            span = slice(p.row_offset, p.row_offset + p.length)
            assert attend[span].sum() == p.length * (p.length + 1) // 2
        multi += len(pieces) > 1
    assert multi > 0  # rows do hold several conversations


def test_loss_mask_is_one_where_the_target_token_is_trained(chat_store):
    ds = PackedDataset(chat_store, seq_len=SEQ, batch_size=3, mode="document", packing="ffd")
    rows, batch = _epoch(ds)
    for r, pieces in enumerate(_pieces(ds, rows)):
        want = np.zeros(SEQ, np.float32)
        for p in pieces:
            mask = chat_store.loss_mask(p.document)[: p.length]
            # Position i predicts token i + 1: its loss counts iff token i + 1 is trained.
            want[p.row_offset : p.row_offset + p.length - 1] = mask[1:]
        assert batch["loss_mask"][r].tolist() == want.tolist()
        trained = batch["loss_mask"][r] > 0
        assert (batch["targets"][r][trained] != ds.pad_id).all()
    assert 0 < batch["loss_mask"].mean() < 1


def test_conversation_average_is_the_mean_of_conversation_means(chat_store):
    kw = dict(seq_len=SEQ, batch_size=5, mode="document", packing="ffd", seed=4)
    tokens = PackedDataset(chat_store, **kw).batch(1)
    conv = PackedDataset(chat_store, loss_average="conversation", **kw).batch(1)
    assert (tokens["tokens"] == conv["tokens"]).all()
    loss = np.random.default_rng(0).random(tokens["loss_mask"].shape)
    means = []
    for r in range(5):
        for s in range(1, int(tokens["segment_ids"][r].max()) + 1):
            m = (tokens["segment_ids"][r] == s) & (tokens["loss_mask"][r] > 0)
            if m.any():
                means.append(loss[r][m].mean())
                assert conv["loss_mask"][r][m].sum() == pytest.approx(1.0, abs=1e-6)
    w = conv["loss_mask"]
    assert (loss * w).sum() / w.sum() == pytest.approx(np.mean(means), rel=1e-6)
    token_mean = (loss * tokens["loss_mask"]).sum() / tokens["loss_mask"].sum()
    assert abs(token_mean - np.mean(means)) > 1e-4  # the two averages do differ here
    assert ((w > 0) == (tokens["loss_mask"] > 0)).all()


def test_chat_batches_are_pure_functions_of_seed_and_step(chat_store, tmp_path):
    kw = dict(seq_len=SEQ, batch_size=4, mode="document", packing="ffd", overlong="truncate")
    a = PackedDataset(chat_store, seed=7, **kw)
    b = PackedDataset(chat_store, seed=7, **kw)
    for step in (0, 3, 11):  # 11: a later epoch
        x, y = a.batch(step), b.batch(step)
        assert all((x[k] == y[k]).all() for k in x)
        halves = [a.batch(step, i, 2) for i in range(2)]
        assert all((np.concatenate([h[k] for h in halves]) == x[k]).all() for k in x)
    other = PackedDataset(chat_store, seed=8, **kw).batch(0)
    assert (other["tokens"] != a.batch(0)["tokens"]).any()


def test_chat_options_are_checked_with_the_fix(chat_store, tiny_store):
    with pytest.raises(ValueError, match=r"mode='stream'\): .* holds conversations.*mode='doc"):
        PackedDataset(chat_store, seq_len=SEQ, batch_size=2)
    with pytest.raises(ValueError, match=r"overlong='cut'\): use one of \['drop', 'truncate'\]"):
        PackedDataset(chat_store, seq_len=SEQ, batch_size=2, mode="document", overlong="cut")
    with pytest.raises(ValueError, match=r"loss_average='row'\): use one of \['token', 'conv"):
        PackedDataset(chat_store, seq_len=SEQ, batch_size=2, mode="document", loss_average="row")
    with pytest.raises(ValueError, match=r"is a text store .*use loss_average='token'"):
        PackedDataset(tiny_store, seq_len=SEQ, batch_size=2, loss_average="conversation")
    with pytest.raises(ValueError, match=r"every conversation .* dropped; .*overlong='truncate'"):
        PackedDataset(chat_store, seq_len=4, batch_size=2, mode="document")


# -- mixtures -------------------------------------------------------------------------------------


def _check_rows_come_from_their_component(mix, rows, comps):
    batch = mix.sequences(rows)
    for i, g in enumerate(rows):
        pieces = mix.locate_sequence(int(g))
        ds = comps[pieces[0].component]
        (own,) = [ds.sequences(np.asarray([q])) for q in [_draw(mix, g)]]
        for k in ("tokens", "targets", "loss_mask", "segment_ids", "positions"):
            assert batch[k][i].tolist() == own[k][0].tolist(), k
    return batch


def _draw(mix, g):
    comp, draw = mix._assign(np.asarray([g]))
    return int(draw[0])


def test_a_mixture_of_two_chat_sets_keeps_each_rows_mask(chat_store, tmp_path):
    other = build_store(
        [FakeChat("o", chat_files(tmp_path, 31, seed=9))], ByteTokenizer(), tmp_path / "o"
    )
    kw = dict(seq_len=SEQ, batch_size=6, mode="document", packing="ffd")
    comps = {"a": PackedDataset(chat_store, **kw), "b": PackedDataset(other, seed=1, **kw)}
    mix = MixtureDataset(comps, {"a": 2, "b": 1}, batch_size=6)
    rows = np.arange(30)
    batch = _check_rows_come_from_their_component(mix, rows, comps)
    assert np.bincount(batch["component"]).tolist() == [20, 10]
    stores = {"a": chat_store, "b": other}
    for i, g in enumerate(rows):  # each row's mask is its own store's, shifted onto targets
        want = np.zeros(SEQ, np.float32)
        for p in mix.locate_sequence(int(g)):
            mask = stores[p.component].loss_mask(p.document)[: p.length]
            want[p.row_offset : p.row_offset + p.length - 1] = mask[1:]
        assert batch["loss_mask"][i].tolist() == want.tolist()


def test_a_mixture_of_chat_and_text_trains_all_text_and_assistant_chat(chat_store, tmp_path):
    text = build_store(
        [JsonlFiles("t", [str(write_jsonl(tmp_path / "t.jsonl", varied_texts(40)))])],
        ByteTokenizer(),
        tmp_path / "t",
    )
    kw = dict(seq_len=SEQ, batch_size=4, mode="document", packing="ffd")
    comps = {"chat": PackedDataset(chat_store, **kw), "text": PackedDataset(text, **kw)}
    mix = MixtureDataset(comps, {"chat": 0.5, "text": 0.5}, batch_size=4)
    rows = np.arange(24)
    batch = _check_rows_come_from_their_component(mix, rows, comps)
    is_text = batch["component"] == 1
    real = (batch["targets"] != mix.pad_id) & (batch["segment_ids"] > 0)
    assert (batch["loss_mask"][is_text] == real[is_text]).all()  # text: every real target
    assert (batch["loss_mask"][~is_text] < real[~is_text]).any()  # chat: prompts masked out


def test_a_mixture_refuses_components_with_different_loss_averages(chat_store, tmp_path):
    path = write_rows(tmp_path / "x.jsonl", conversations(9, seed=3))
    other = build_store([FakeChat("x", [path])], ByteTokenizer(), tmp_path / "x")
    kw = dict(seq_len=SEQ, batch_size=2, mode="document")
    comps = {
        "a": PackedDataset(chat_store, **kw),
        "b": PackedDataset(other, loss_average="conversation", **kw),
    }
    with pytest.raises(ValueError, match=r"'a' \(loss_average='token'\) and 'b' \(loss_average="):
        MixtureDataset(comps, {"a": 1, "b": 1}, batch_size=2)
