"""PackedDataset: stateless batches, packing modes, process slicing, provenance."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from meltemi.data import PackedDataset


def _rows_tokens(ds, step):
    return ds.batch(step)["tokens"]


def test_batch_has_the_documented_arrays(tiny_store):
    b = PackedDataset(tiny_store, seq_len=13, batch_size=3, seed=1).batch(0)
    assert set(b) == {"tokens", "targets", "loss_mask", "segment_ids", "positions"}
    assert all(v.shape == (3, 13) for v in b.values())
    assert b["tokens"].dtype == np.int32 and b["loss_mask"].dtype == np.float32


_BATCH_7 = """
import sys
import numpy as np
from meltemi.data import PackedDataset, TokenStore
ds = PackedDataset(TokenStore.open(sys.argv[1]), seq_len=13, batch_size=3, seed=1)
np.save(sys.argv[2], ds.batch(7)["tokens"])
"""


def test_batches_are_pure_functions_of_seed_and_step(tiny_store, tmp_path):
    a = PackedDataset(tiny_store, seq_len=13, batch_size=3, seed=1)
    for step in (30, 0, 8, 6):  # other steps first: no state may carry over
        a.batch(step)
    got = a.batch(7)["tokens"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = tmp_path / "b7.npy"
    subprocess.run([sys.executable, "-c", _BATCH_7, tiny_store.path, str(out)], env=env, check=True)
    assert np.array_equal(got, np.load(out))  # a fresh process asking only for step 7
    assert not np.array_equal(got, a.batch(8)["tokens"])
    c = PackedDataset(tiny_store, seq_len=13, batch_size=3, seed=2)
    assert not np.array_equal(got, c.batch(7)["tokens"])


@pytest.mark.parametrize("mode", ["stream", "document"])
def test_process_slices_concatenate_to_the_global_batch(tiny_store, mode):
    ds = PackedDataset(tiny_store, seq_len=11, batch_size=6, seed=3, mode=mode)
    full = ds.batch(4)
    for count in (2, 3, 6):
        parts = [ds.batch(4, i, count) for i in range(count)]
        for key in full:
            assert np.array_equal(np.concatenate([p[key] for p in parts]), full[key])


def test_stream_epoch_uses_every_token_once(tiny_store):
    ds = PackedDataset(tiny_store, seq_len=7, batch_size=1, seed=5)
    rows = ds.sequences(np.arange(ds.num_sequences))
    got = np.sort(rows["tokens"].ravel())
    everything = np.concatenate([tiny_store.document(d) for d in range(37)])
    assert ds.num_sequences == len(everything) // 7
    assert (rows["segment_ids"] > 0).all()  # stream mode never pads
    # All but the dropped remainder (< seq_len tokens) appear exactly once.
    assert len(got) == len(everything) - len(everything) % 7
    values, counts = np.unique(got, return_counts=True)
    all_values, all_counts = np.unique(everything, return_counts=True)
    lookup = dict(zip(all_values.tolist(), all_counts.tolist(), strict=True))
    assert all(c <= lookup[v] for v, c in zip(values.tolist(), counts.tolist(), strict=True))


def test_document_mode_never_splits_short_documents(tiny_store):
    seq = 61
    ds = PackedDataset(tiny_store, seq_len=seq, batch_size=1, seed=2, mode="document")
    seen = {}
    for i in range(ds.num_sequences):
        for piece in ds.locate_sequence(i):
            seen.setdefault(piece.document, []).append(piece)
    assert sorted(seen) == list(range(37))
    for doc, pieces in seen.items():
        length = int(tiny_store.document_lengths[doc])
        if length < seq:
            assert len(pieces) == 1 and pieces[0].length == length
        assert sum(p.length for p in pieces) == length


def test_document_mode_pads_with_pad_id_and_zero_segments(tiny_store):
    ds = PackedDataset(tiny_store, seq_len=97, batch_size=4, seed=0, mode="document")
    b = ds.batch(0)
    pad = b["segment_ids"] == 0
    assert pad.any()
    assert (b["tokens"][pad] == 258).all() and (b["loss_mask"][pad] == 0).all()


def test_targets_are_next_tokens_within_a_segment(tiny_store):
    b = PackedDataset(tiny_store, seq_len=29, batch_size=5, seed=4).batch(2)
    m = b["loss_mask"][:, :-1] > 0
    assert np.array_equal(b["targets"][:, :-1][m], b["tokens"][:, 1:][m])
    boundary = b["segment_ids"][:, 1:] != b["segment_ids"][:, :-1]
    assert not m[boundary].any()
    assert (b["loss_mask"][:, -1] == 0).all()


def test_positions_restart_at_each_segment(tiny_store):
    b = PackedDataset(tiny_store, seq_len=29, batch_size=5, seed=4).batch(1)
    starts = np.ones_like(b["segment_ids"], bool)
    starts[:, 1:] = b["segment_ids"][:, 1:] != b["segment_ids"][:, :-1]
    assert (b["positions"][starts] == 0).all()


@pytest.mark.parametrize("mode", ["stream", "document"])
def test_locate_reproduces_the_row(tiny_store, mode):
    ds = PackedDataset(tiny_store, seq_len=23, batch_size=3, seed=8, mode=mode)
    row = ds.batch(9)["tokens"][2]
    for p in ds.locate(9, 2):
        want = tiny_store.tokens(p.document, p.token_offset, p.token_offset + p.length)
        assert np.array_equal(row[p.row_offset : p.row_offset + p.length], want)


@pytest.mark.parametrize("mode", ["stream", "document"])
def test_steps_of_inverts_locate(tiny_store, mode):
    ds = PackedDataset(tiny_store, seq_len=23, batch_size=3, seed=8, mode=mode)
    max_step = 3 * ds.steps_per_epoch + 2  # crosses epochs
    expected: dict[int, set] = {}
    for step in range(max_step):
        for row in range(3):
            for p in ds.locate(step, row):
                expected.setdefault(p.document, set()).add((step, row))
    for doc in (0, 11, 36):
        assert set(ds.steps_of(doc, max_step=max_step)) == expected.get(doc, set())


def test_epochs_reshuffle_sequences(tiny_store):
    ds = PackedDataset(tiny_store, seq_len=17, batch_size=1, seed=0)
    q = ds.num_sequences
    first = [ds.locate_sequence(i)[0] for i in range(q)]
    second = [ds.locate_sequence(q + i)[0] for i in range(q)]
    assert sorted(first) == sorted(second) and first != second


def test_bad_arguments_name_the_fix(tiny_store):
    with pytest.raises(ValueError, match="mode='packed'"):
        PackedDataset(tiny_store, seq_len=8, batch_size=2, mode="packed")
    ds = PackedDataset(tiny_store, seq_len=8, batch_size=6)
    with pytest.raises(ValueError, match="batch_size=6 is not divisible by process_count=4"):
        ds.batch(0, 0, 4)
    with pytest.raises(ValueError, match="process_index=2 must be < process_count=2"):
        ds.batch(0, 2, 2)
    with pytest.raises(ValueError, match="step must be an int >= 0, got -1"):
        ds.batch(-1)
    with pytest.raises(ValueError, match=r"holds only \d+ tokens; use a shorter seq_len"):
        PackedDataset(tiny_store, seq_len=10**7, batch_size=1)
