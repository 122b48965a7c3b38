"""Packing preference pairs: each pair whole in one row as two segments (chosen, rejected),
`pair_ids`/`is_chosen` naming them, positions restarting per conversation, the loss mask on
the reply targets only, pairs longer than a row dropped and counted, and mixtures.

Every expectation is recomputed from `encode_preference` on the rows that were written.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_preference_data import TEMPLATE, TOK, _a, _u

from meltemi.data import MixtureDataset, PackedDataset, build_store
from meltemi.data.chat import ChatFiles, PreferenceFiles, encode_preference

SEQ = 241  # odd; pairs run from 76 to 152 tokens, plus a few of about 300


def _rows(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "γάμμα", "delta", "ok", "no", "🙂", "yes"]
    out = []
    for i in range(count):
        prompt = " ".join(rng.choice(words, rng.integers(1, 3)))
        chosen = " ".join(rng.choice(words, rng.integers(1, 9)))
        rejected = " ".join(rng.choice(words, rng.integers(1, 9))) + f" {i}"
        if i % 15 == 7:  # longer than a row
            rejected = "long " * 50 + rejected
        out.append({"prompt": [_u(prompt)], "chosen": chosen, "rejected": rejected})
    return out


def _store(tmp_path_factory, name: str, count: int, seed: int):
    d = tmp_path_factory.mktemp(name)
    rows = _rows(count, seed)
    (d / "p.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    store = build_store(
        [PreferenceFiles(name, [str(d / "p.jsonl")], template=TEMPLATE)],
        TOK,
        d / "s",
        min_shards=2,
    )
    pairs = [
        encode_preference(r["prompt"], r["chosen"], r["rejected"], TOK, TEMPLATE) for r in rows
    ]
    return store, pairs


@pytest.fixture(scope="module")
def pref(tmp_path_factory):
    return _store(tmp_path_factory, "p", 61, 0)


def _check_row(batch, r: int, pairs_by_ids: dict) -> list[int]:
    """Checks one row against the pairs it holds; returns their indices."""
    seg = batch["segment_ids"][r]
    found = []
    n_pairs = int(batch["pair_ids"][r].max())
    assert set(seg[seg > 0].tolist()) == set(range(1, 2 * n_pairs + 1))
    for p in range(1, n_pairs + 1):
        c, j = (seg == 2 * p - 1), (seg == 2 * p)
        assert (batch["pair_ids"][r][c | j] == p).all() and (
            batch["pair_ids"][r][~(c | j)] != p
        ).all()
        assert batch["is_chosen"][r][c].all() and not batch["is_chosen"][r][j].any()
        ci = np.flatnonzero(c)
        ji = np.flatnonzero(j)
        assert ji[0] == ci[-1] + 1  # rejected right after its chosen
        key = (tuple(batch["tokens"][r][ci].tolist()), tuple(batch["tokens"][r][ji].tolist()))
        k = pairs_by_ids[key]
        found.append(k)
        for idx in (ci, ji):
            assert batch["positions"][r][idx].tolist() == list(range(len(idx)))
            # target i is token i + 1 of the same conversation; the last has no target
            assert batch["targets"][r][idx[:-1]].tolist() == batch["tokens"][r][idx[1:]].tolist()
            assert batch["loss_mask"][r][idx[-1]] == 0
    assert (batch["pair_ids"][r][seg == 0] == 0).all() and (
        batch["is_chosen"][r][seg == 0] == 0
    ).all()
    return found


@pytest.mark.parametrize("packing", ["ffd", "next_fit"])
def test_every_pair_is_in_one_row_once_per_epoch_with_reply_only_loss(pref, packing):
    store, pairs = pref
    ds = PackedDataset(store, seq_len=SEQ, batch_size=4, mode="document", packing=packing)
    by_ids = {
        (tuple(p.chosen.ids.tolist()), tuple(p.rejected.ids.tolist())): k
        for k, p in enumerate(pairs)
    }
    batch = ds.sequences(np.arange(ds.num_sequences))
    seen = []
    for r in range(ds.num_sequences):
        seen += _check_row(batch, r, by_ids)
    fits = [k for k, p in enumerate(pairs) if len(p.ids) <= SEQ]
    assert sorted(seen) == fits  # each pair that fits, exactly once
    assert ds.overlong == {"dropped": len(pairs) - len(fits), "truncated": 0}
    assert 3 <= ds.overlong["dropped"] <= len(pairs) - 20  # the fixture has both kinds
    # loss_mask[i] is the stored mask of token i + 1 (the target): per segment, the reply
    # tokens of that conversation, the prompt never
    for r in range(ds.num_sequences):
        seg = batch["segment_ids"][r]
        for p in range(1, int(batch["pair_ids"][r].max()) + 1):
            ci = np.flatnonzero(seg == 2 * p - 1)
            k = by_ids[
                (
                    tuple(batch["tokens"][r][ci].tolist()),
                    tuple(batch["tokens"][r][seg == 2 * p].tolist()),
                )
            ]
            for s, enc in ((2 * p - 1, pairs[k].chosen), (2 * p, pairs[k].rejected)):
                got = batch["loss_mask"][r][seg == s]
                assert got.tolist() == enc.loss_mask[1:].tolist() + [0]
                assert got.sum() == enc.loss_mask.sum() > 0


def test_rows_hold_several_pairs(pref):
    store, _ = pref
    ds = PackedDataset(store, seq_len=SEQ, batch_size=4, mode="document", packing="ffd")
    batch = ds.sequences(np.arange(ds.num_sequences))
    assert batch["pair_ids"].max() >= 2
    assert batch["pair_ids"].dtype == np.int32 and batch["is_chosen"].dtype == np.int32


def test_a_row_of_exactly_one_pair_fits(tmp_path_factory, pref):
    _, pairs = pref
    n = len(pairs[0].ids)
    store, _ = pref
    ds = PackedDataset(store, seq_len=n, batch_size=1, mode="document")
    assert ds.overlong["dropped"] == sum(len(p.ids) > n for p in pairs)


def test_pairs_are_never_truncated(pref):
    store, _ = pref
    with pytest.raises(
        ValueError,
        match=r"overlong='truncate'.*pairs, which are never truncated.*use overlong='drop'",
    ):
        PackedDataset(store, seq_len=SEQ, batch_size=2, mode="document", overlong="truncate")
    with pytest.raises(ValueError, match=r"loss_average='conversation'.*use loss_average='token'"):
        PackedDataset(
            store, seq_len=SEQ, batch_size=2, mode="document", loss_average="conversation"
        )
    with pytest.raises(
        ValueError, match=r"every pair of the store .* longer than seq_len .*use a longer seq_len$"
    ):
        PackedDataset(store, seq_len=60, batch_size=2, mode="document")


def test_batches_are_a_pure_function_of_the_step(pref):
    store, _ = pref
    a = PackedDataset(store, seq_len=SEQ, batch_size=4, mode="document", packing="ffd", seed=3)
    b = PackedDataset(store, seq_len=SEQ, batch_size=4, mode="document", packing="ffd", seed=3)
    for step in (0, 5, 17):
        x, y = a.batch(step), b.batch(step)
        assert set(x) == {
            "tokens",
            "targets",
            "loss_mask",
            "segment_ids",
            "positions",
            "pair_ids",
            "is_chosen",
        }
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])
    halves = [a.batch(5, process_index=i, process_count=2) for i in range(2)]
    np.testing.assert_array_equal(
        np.concatenate([h["pair_ids"] for h in halves]), a.batch(5)["pair_ids"]
    )


def test_mixture_of_preference_sets_keeps_pairs(pref, tmp_path_factory):
    store, pairs = pref
    other, other_pairs = _store(tmp_path_factory, "q", 23, 1)
    comps = {
        "p": PackedDataset(store, seq_len=SEQ, batch_size=4, mode="document", packing="ffd"),
        "q": PackedDataset(other, seq_len=SEQ, batch_size=4, mode="document", packing="ffd"),
    }
    mix = MixtureDataset(comps, {"p": 0.75, "q": 0.25}, batch_size=4)
    by_ids = {}
    for k, p in enumerate(pairs + other_pairs):
        by_ids[(tuple(p.chosen.ids.tolist()), tuple(p.rejected.ids.tolist()))] = k
    batch = mix.sequences(np.arange(40))
    for r in range(40):
        _check_row(batch, r, by_ids)
    assert np.bincount(batch["component"]).tolist() == [30, 10]


def test_mixture_refuses_pairs_beside_conversations(pref, tmp_path):
    store, _ = pref
    (tmp_path / "c.jsonl").write_text(
        "".join(json.dumps({"messages": [_u("q"), _a("a" * i)]}) + "\n" for i in range(1, 9))
    )
    chat = build_store(
        [ChatFiles("c", [str(tmp_path / "c.jsonl")], template=TEMPLATE)], TOK, tmp_path / "s"
    )
    comps = {
        "p": PackedDataset(store, seq_len=SEQ, batch_size=4, mode="document"),
        "c": PackedDataset(chat, seq_len=SEQ, batch_size=4, mode="document"),
    }
    with pytest.raises(
        ValueError, match=r"component 'p' holds preference pairs and 'c' holds no preference pairs"
    ):
        MixtureDataset(comps, {"p": 1, "c": 1}, batch_size=4)
