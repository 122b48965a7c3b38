"""Document packing (next-fit, first-fit-decreasing) and batched store reads, each checked
against an independent, plain-Python computation."""

from __future__ import annotations

import numpy as np
import pytest

from meltemi.data import PackedDataset, packing_options
from meltemi.data._packing import pack_ffd, pack_next_fit, padding_fraction
from meltemi.data.testing import next_fit_reference


def _ffd_reference(lengths, seq_len, window):
    """First-fit-decreasing, piece by piece, window by window: rows of (at, pos, offset)."""
    rows = []
    for w0 in range(0, len(lengths), window):
        pieces = []
        for p in range(w0, min(w0 + window, len(lengths))):
            n = int(lengths[p])
            pieces += [(seq_len, p, k) for k in range(0, n - n % seq_len, seq_len)]
            if n % seq_len:
                pieces.append((n % seq_len, p, n - n % seq_len))
        pieces.sort(key=lambda x: -x[0])  # stable: document order among equal lengths
        bins = []
        for size, p, k in pieces:
            for b in bins:
                if b[0] >= size:
                    b[1].append((seq_len - b[0], p, k))
                    b[0] -= size
                    break
            else:
                bins.append([seq_len - size, [(0, p, k)]])
        rows += [b[1] for b in bins]
    return rows


def _assert_ffd_equals_the_reference(lengths, seq_len, window):
    plan = pack_ffd(lengths, seq_len, window)
    want = _ffd_reference(lengths, seq_len, window)
    assert plan.num_sequences == len(want)
    for q, row in enumerate(want):
        lo, hi = plan.seq_start[q], plan.seq_start[q + 1]
        got = zip(plan.row_offset[lo:hi], plan.pos[lo:hi], plan.offset[lo:hi], strict=True)
        assert [tuple(int(v) for v in t) for t in got] == row


@pytest.mark.parametrize("seed", range(6))
def test_next_fit_equals_the_piece_by_piece_loop(seed):
    rng = np.random.default_rng(seed)
    seq_len = int(rng.integers(3, 70))
    lengths = rng.integers(1, 3 * seq_len, int(rng.integers(1, 400)))
    plan = pack_next_fit(lengths, seq_len)
    got = (plan.pos, plan.offset, plan.length, plan.row_offset, plan.seq_start)
    for a, b in zip(got, next_fit_reference(lengths, seq_len), strict=True):
        assert a.tolist() == b


@pytest.mark.parametrize("seed", range(6))
def test_ffd_equals_the_piece_by_piece_reference(seed):
    rng = np.random.default_rng(seed)
    seq_len = int(rng.integers(3, 70))
    lengths = rng.integers(1, 3 * seq_len, int(rng.integers(1, 400)))
    window = int(rng.integers(1, 60))
    _assert_ffd_equals_the_reference(lengths, seq_len, window)


@pytest.mark.parametrize("seed", range(4))
def test_ffd_of_long_documents_equals_the_reference(seed):
    # Many full pieces (long documents, exact multiples of seq_len) and a few short ones: the
    # full pieces take rows of their own without the search, in the reference's order.
    rng = np.random.default_rng(100 + seed)
    seq_len = int(rng.integers(2, 10))
    lengths = rng.integers(1, 20 * seq_len, 14)
    lengths[::3] = seq_len * rng.integers(1, 6, len(lengths[::3]))
    window = int(rng.integers(1, 8))
    _assert_ffd_equals_the_reference(lengths, seq_len, window)


def test_ffd_pads_far_less_than_next_fit_on_mixed_lengths():
    lengths = np.random.default_rng(0).integers(50, 1500, 20_000)
    lower_bound = -(-int(lengths.sum()) // 2048)
    next_fit, ffd = pack_next_fit(lengths, 2048), pack_ffd(lengths, 2048, 1024)
    assert padding_fraction(next_fit, 2048) > 0.2
    assert padding_fraction(ffd, 2048) < 0.01
    assert lower_bound <= ffd.num_sequences < 1.01 * lower_bound


def test_ffd_rejects_a_bad_window():
    with pytest.raises(ValueError, match=r"pack_ffd\(window=0\): need an int >= 1"):
        pack_ffd(np.array([3]), 8, 0)


def test_ffd_dataset_covers_every_token_once_and_reports_padding(tiny_store):
    ds = PackedDataset(tiny_store, seq_len=61, batch_size=1, mode="document", packing="ffd",
                       pack_window=16)  # fmt: skip
    rows = ds.sequences(np.arange(ds.num_sequences))
    seen = {}
    for i in range(ds.num_sequences):
        for p in ds.locate_sequence(i):
            seen.setdefault(p.document, []).append((p.token_offset, p.length))
    lengths = tiny_store.document_lengths
    for d in range(tiny_store.num_documents):
        spans = sorted(seen[d])
        assert spans[0][0] == 0 and sum(n for _, n in spans) == lengths[d]
    pad = (rows["segment_ids"] == 0).mean()
    assert ds.padding_fraction == pytest.approx(pad)
    nf = PackedDataset(tiny_store, seq_len=61, batch_size=1, mode="document")
    assert ds.num_sequences <= nf.num_sequences and ds.padding_fraction <= nf.padding_fraction


def test_stream_rows_are_the_shuffled_documents_cut_every_seq_len(tiny_store):
    ds = PackedDataset(tiny_store, seq_len=13, batch_size=1, seed=4)
    order = ds.document_order(np.arange(tiny_store.num_documents))
    stream = np.concatenate([tiny_store.document(int(d)) for d in order])
    packed = ds._packed_of(np.arange(ds.num_sequences))
    rows = ds.sequences(np.arange(ds.num_sequences))["tokens"]
    for i, q in enumerate(packed.tolist()):
        assert np.array_equal(rows[i], stream[q * 13 : (q + 1) * 13])


@pytest.mark.parametrize("strategy", ["slices", "index"])
def test_batched_reads_equal_per_document_slices(tiny_store, monkeypatch, strategy):
    import meltemi.data._store as store_module

    if strategy == "index":  # always choose the index-array read
        monkeypatch.setattr(store_module, "_INDEX_COST", -1.0)
    else:
        monkeypatch.setattr(store_module, "_INDEX_COST", 1.0)
    rng = np.random.default_rng(0)
    docs = rng.integers(0, tiny_store.num_documents, 300)
    lengths = tiny_store.document_lengths[docs]
    starts = (rng.random(300) * lengths).astype(np.int64)
    stops = starts + (rng.random(300) * (lengths - starts)).astype(np.int64)
    flat = tiny_store.read_flat(docs, starts, stops)
    whole = []  # every shard's token array, read whole straight from tensorstore
    for s in tiny_store.metadata["shards"]:
        zarr = store_module.zarr_spec(
            store_module.kvstore_spec(tiny_store.path), f"shards/{s['id']:05d}/tokens"
        )
        whole.append(np.asarray(store_module.ts.open(zarr).result().read().result(), np.int32))
    tokens = np.concatenate(whole)
    first = np.cumsum(tiny_store.document_lengths) - tiny_store.document_lengths
    want = [
        tokens[first[d] + a : first[d] + b] for d, a, b in zip(docs, starts, stops, strict=True)
    ]
    assert np.array_equal(flat, np.concatenate(want))
    pieces = list(zip(docs.tolist(), starts.tolist(), stops.tolist(), strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(tiny_store.read(pieces), want, strict=True))


def test_whole_documents_packing_never_splits_a_short_document(tiny_store):
    seq = 61
    ds = PackedDataset(tiny_store, seq_len=seq, batch_size=1, **packing_options("whole_documents"))
    rows = ds.sequences(np.arange(ds.num_sequences))
    pieces = {}
    for i in range(ds.num_sequences):
        for p in ds.locate_sequence(i):
            pieces.setdefault(p.document, []).append(p)
    for d, got in pieces.items():
        n = int(tiny_store.document_lengths[d])
        if n < seq:  # one piece: the whole document in one row
            assert [(p.token_offset, p.length) for p in got] == [(0, n)]
        else:  # cut at seq_len boundaries
            assert sorted(p.token_offset for p in got) == list(range(0, n, seq))
    assert ds.padding_fraction == pytest.approx((rows["segment_ids"] == 0).mean())
    assert packing_options("stream") == {"mode": "stream"}


def test_an_unknown_packing_names_the_config_field():
    with pytest.raises(ValueError, match=r"data.packing='whole_docs': use one of \['stream', "):
        packing_options("whole_docs")
