"""Benchmarks of meltemi.data, printed as JSON: `bazel run //data:bench`.

All figures come from one run on this machine:

* `feistel_numpy_indices_per_s`: `FeistelPermutation(10**9)` on numpy, over spread-out chunks.
* `feistel_jax_indices_per_s`: the jitted twin (`on_device.feistel_jax`), same length, after
  compilation, with results fetched to host memory excluded (device arrays ready).
* `numpy_permutation_per_s`: `numpy.random.permutation(10**7)`, the reference.
* `store_batches_per_s`: random `PackedDataset.batch(step)` calls (32 x 1024 tokens) on the
  stdlib corpus store.
* `build_mb_per_s`: input megabytes per second building that store (byte tokenizer).
* `short_doc_*`: a 32 x 4096 batch of ~100-token documents: the whole `batch(step)`, and its
  token reads batched (`TokenStore.read_flat`) against one tensorstore read per piece (the
  previous reader, the reference).
* `pack_*`: whole-document packing of 100,000 documents of 50..1499 tokens at seq_len 2048:
  padding of next-fit and first-fit-decreasing (window 1024) against the lower bound, and the
  time of each against the previous piece-by-piece loop (the reference).
* `pipeline_mb_per_s`: `meltemi.data.pipeline` end to end (normalize, exact and fuzzy dedup,
  quality, tokenize with the byte tokenizer) on a synthetic corpus with planted duplicates and
  junk, `--workers` fray actors on a `LocalCluster` started before the clock (the actors
  start inside it, as in a real run; input MB/s); `pipeline_inline_mb_per_s` is the same in
  one process (the reference; runs alternate with the actor runs), `pipeline_speedup_vs_inline`
  their ratio. Inputs under `pipeline_auto_inline_below_mb` run inline by default.
* `normalize_*`, `quality_*`: the vectorised batch normalize (with the exact-dedup digest) and
  quality rules (`normalize_texts` + `digests`, `quality_reasons`) on the corpus's texts,
  against the per-document Python they replaced (`normalize_text` + `digest` per text;
  `meltemi.data.testing.quality_reason_reference`): the references.
* `minhash_docs_per_s`: `minhash_signatures` (128 values, 5-word shingles, one-permutation
  hashing), one process; `minhash_permutations_docs_per_s`: classic MinHash (128 hashes a
  shingle) on the same documents;
  `lsh_docs_per_s`: banding, verification and components of those signatures. When
  `datasketch` is importable, `datasketch_*` measure its `MinHash.update_batch` (shingled in
  Python, as its users do) and `MinHashLSH` (same bands, insert + query + `jaccard` check) on
  the same documents: the reference.
* `dedup_*`: fuzzy dedup quality (not speed) on the web-like corpus of
  `pipeline/_webcorpus.py` (`--dedup_pages` pages of standard-library prose on 12 sites
  sharing boilerplate, `--dedup_pairs` near copies planted in each true-Jaccard bucket
  0.75-0.80 .. 0.90-0.95), threshold 0.8, 128 values: `dedup_recall_<lo>_<hi>` per bucket
  beside `dedup_theory_<lo>_<hi>` (candidate and verified: the probability a pair is merged)
  and `dedup_s_curve_<lo>_<hi>` (candidate only, `1 - (1 - s^r)^b`); `dedup_recall` over the
  pairs of true Jaccard >= 0.8, `dedup_precision` (merged pairs of true Jaccard >= 0.8),
  `dedup_false_positive_rate` (pages sharing boilerplate merged with a page below 0.8);
  `datasketch_dedup_*` the same for datasketch's `MinHashLSH` (its own bands, `jaccard`
  check), the reference.
* `decontaminate_*`: one 2,000-token document against 2M evaluation hashes: sorted search
  (`contains_any`) against `np.isin` (the previous check, the reference).

Each timing is the best of `--repeats`; the machine is shared, so the best is the least noisy.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import re
import sys
import tempfile
import time

import numpy as np

from meltemi import fray
from meltemi.data import (
    ByteTokenizer,
    FeistelPermutation,
    JsonlFiles,
    PackedDataset,
    build_store,
    ngram_hashes,
    stdlib_corpus,
)
from meltemi.data._clean import contains_any
from meltemi.data._packing import pack_ffd, pack_next_fit, padding_fraction
from meltemi.data.pipeline import (
    INLINE_BELOW_BYTES,
    PipelineConfig,
    QualityConfig,
    lsh_params,
    minhash_signatures,
    near_duplicate_drops,
    normalize_text,
    run_pipeline,
)
from meltemi.data.pipeline._normalize import digest, digests, normalize_texts
from meltemi.data.pipeline._quality import quality_reasons
from meltemi.data.pipeline._synthetic import synthetic_corpus, write_corpus
from meltemi.data.pipeline._webcorpus import compare_dedups, site_pair_jaccard, web_corpus
from meltemi.data.testing import next_fit_reference, quality_reason_reference


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_feistel_numpy(length: int, chunk: int, chunks: int, repeats: int) -> float:
    perm = FeistelPermutation(length, seed=1)
    starts = np.linspace(0, length - chunk, chunks).astype(np.int64)
    xs = [np.arange(s, s + chunk) for s in starts]
    return chunks * chunk / _best(lambda: [perm(x) for x in xs], repeats)


def bench_feistel_jax(length: int, chunk: int, chunks: int, repeats: int) -> float:
    import jax
    import jax.numpy as jnp

    from meltemi.data.on_device import feistel_jax

    f = feistel_jax(FeistelPermutation(length, seed=1))
    starts = np.linspace(0, length - chunk, chunks).astype(np.int64)
    xs = [jnp.arange(s, s + chunk, dtype=jnp.uint32) for s in starts.tolist()]
    jax.block_until_ready(f(xs[0]))  # compile

    def run():
        jax.block_until_ready([f(x) for x in xs])

    return chunks * chunk / _best(run, repeats)


def bench_numpy_permutation(n: int, repeats: int) -> float:
    return n / _best(lambda: np.random.permutation(n), repeats)


def bench_store(workdir: str, batches: int, repeats: int, workers: int) -> dict:
    start = time.perf_counter()
    store = build_store(
        [stdlib_corpus("train")], ByteTokenizer(), os.path.join(workdir, "store"), workers=workers
    )
    build_s = time.perf_counter() - start
    mb = store.metadata["per_source"]["stdlib-train"]["input_bytes"] / 1e6
    ds = PackedDataset(store, seq_len=1024, batch_size=32, seed=0)
    steps = np.random.default_rng(0).integers(0, 10 * ds.steps_per_epoch, batches).tolist()
    ds.batch(0)
    per_s = batches / _best(lambda: [ds.batch(s) for s in steps], repeats)
    return {
        "store_batches_per_s": per_s,
        "build_mb_per_s": mb / build_s,
        "build_input_mb": round(mb, 2),
        "build_workers": workers,
        "store_tokens": store.num_tokens,
    }


def _read_per_piece(store, docs, starts, stops) -> list[np.ndarray]:
    """The previous reader: one tensorstore slice read per piece (the reference)."""
    shards = store._shard_of(docs)
    base = store._doc_starts[docs]
    futures = [
        store._tokens[int(s)][int(b + lo) : int(b + hi)].read()
        for s, b, lo, hi in zip(shards, base, starts, stops, strict=True)
    ]
    return [np.asarray(f.result(), np.int32) for f in futures]


def bench_short_documents(workdir: str, documents: int, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    words = np.asarray(["alpha", "beta", "gamma", "delta", "epsilon"])
    path = os.path.join(workdir, "short.jsonl")
    with open(path, "w") as f:
        for _ in range(documents):
            text = " ".join(rng.choice(words, int(rng.integers(10, 30))))
            f.write(json.dumps({"text": text}) + "\n")
    store = build_store([JsonlFiles("short", [path])], ByteTokenizer(), path + ".store")
    ds = PackedDataset(store, seq_len=4096, batch_size=32, seed=0)
    steps = list(range(1, 6))
    ds.batch(0)
    batch_s = _best(lambda: [ds.batch(s) for s in steps], repeats) / len(steps)
    pieces = [ds._piece_arrays(ds._packed_of(np.arange(32 * s, 32 * (s + 1)))) for s in steps]
    reads = [(doc, off, off + n) for _, doc, off, n, _ in pieces]
    flat_s = _best(lambda: [store.read_flat(*r) for r in reads], repeats) / len(steps)
    per_piece_s = _best(lambda: [_read_per_piece(store, *r) for r in reads], repeats) / len(steps)
    return {
        "short_doc_mean_tokens": float(store.document_lengths.mean()),
        "short_doc_pieces_per_batch": float(np.mean([len(r[0]) for r in reads])),
        "short_doc_batch_ms": batch_s * 1e3,
        "short_doc_read_ms": flat_s * 1e3,
        "short_doc_read_ms_per_piece_reference": per_piece_s * 1e3,
        "short_doc_read_speedup_vs_reference": per_piece_s / flat_s,
    }


def _next_fit_loop(lengths: np.ndarray, seq_len: int) -> list[np.ndarray]:
    """The previous piece-by-piece next-fit loop (the reference), with its plan arrays."""
    return [np.asarray(x, np.int64) for x in next_fit_reference(lengths, seq_len)]


def bench_packing(documents: int, repeats: int) -> dict:
    lengths = np.random.default_rng(0).integers(50, 1500, documents)
    seq_len = 2048
    next_fit = pack_next_fit(lengths, seq_len)
    ffd = pack_ffd(lengths, seq_len, 1024)
    reference = _next_fit_loop(lengths, seq_len)
    ours = (next_fit.pos, next_fit.offset, next_fit.length, next_fit.row_offset, next_fit.seq_start)
    if not all(np.array_equal(a, b) for a, b in zip(ours, reference, strict=True)):
        raise AssertionError("the vectorised next-fit differs from the reference loop")
    loop_s = _best(lambda: _next_fit_loop(lengths, seq_len), repeats)
    next_fit_s = _best(lambda: pack_next_fit(lengths, seq_len), repeats)
    ffd_s = _best(lambda: pack_ffd(lengths, seq_len, 1024), repeats)
    return {
        "pack_documents": documents,
        "pack_rows_lower_bound": -(-int(lengths.sum()) // seq_len),
        "pack_rows_next_fit": next_fit.num_sequences,
        "pack_rows_ffd": ffd.num_sequences,
        "pack_padding_next_fit": padding_fraction(next_fit, seq_len),
        "pack_padding_ffd": padding_fraction(ffd, seq_len),
        "pack_next_fit_s": next_fit_s,
        "pack_ffd_s": ffd_s,
        "pack_loop_s_reference": loop_s,
        "pack_next_fit_speedup_vs_reference": loop_s / next_fit_s,
    }


def bench_decontamination(hashes: int, tokens: int, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    evals = np.unique(rng.integers(0, 2**63, hashes, dtype=np.uint64))
    doc = ngram_hashes(rng.integers(0, 50_000, tokens), 13)
    sorted_s = _best(lambda: contains_any(evals, doc), repeats)
    isin_s = _best(lambda: np.isin(doc, evals).any(), repeats)
    return {
        "decontaminate_ms_per_doc": sorted_s * 1e3,
        "decontaminate_ms_per_doc_isin_reference": isin_s * 1e3,
        "decontaminate_speedup_vs_reference": isin_s / sorted_s,
    }


def _datasketch(texts: list[str], threshold: float, repeats: int) -> dict:
    """The reference: datasketch's MinHash and MinHashLSH on the same texts (if installed)."""
    try:
        from datasketch import MinHash, MinHashLSH
    except ModuleNotFoundError:
        return {}
    word = re.compile(r"[^\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f]+")

    def signatures():
        out = []
        for t in texts:
            w = word.findall(t.lower())
            shingles = {" ".join(w[i : i + 5]).encode() for i in range(len(w) - 4)}
            m = MinHash(num_perm=128, seed=1)
            m.update_batch(list(shingles))
            out.append(m)
        return out

    sigs = signatures()
    bands, rows = lsh_params(threshold, 128)

    def lsh():
        index = MinHashLSH(threshold=threshold, num_perm=128, params=(bands, rows))
        for i, m in enumerate(sigs):
            index.insert(i, m)
        pairs = {(min(i, j), max(i, j)) for i, m in enumerate(sigs) for j in index.query(m)}
        return sum(sigs[i].jaccard(sigs[j]) >= threshold for i, j in pairs if i != j)

    return {
        "datasketch_minhash_docs_per_s": len(texts) / _best(signatures, repeats),
        "datasketch_lsh_docs_per_s": len(texts) / _best(lsh, repeats),
    }


def bench_batch_stages(texts: list[str], repeats: int) -> dict:
    """The vectorised normalize (+ exact-dedup digest) and quality rules against the
    per-document Python they replaced (the references), on the same texts."""
    mb = sum(map(len, texts)) / 1e6
    quality = QualityConfig()
    normalize_s = _best(lambda: digests(normalize_texts(texts, 1000)[0]), repeats)

    def per_document():
        for t in texts:
            digest(normalize_text(t, 1000, collections.Counter()))

    normalize_ref_s = _best(per_document, repeats)
    quality_s = _best(lambda: quality_reasons(texts, quality), repeats)
    quality_ref_s = _best(lambda: [quality_reason_reference(t, quality) for t in texts], repeats)
    return {
        "normalize_mb_per_s": mb / normalize_s,
        "normalize_per_document_mb_per_s_reference": mb / normalize_ref_s,
        "normalize_speedup_vs_reference": normalize_ref_s / normalize_s,
        "quality_mb_per_s": mb / quality_s,
        "quality_per_document_mb_per_s_reference": mb / quality_ref_s,
        "quality_speedup_vs_reference": quality_ref_s / quality_s,
    }


def bench_pipeline(workdir: str, distinct: int, repeats: int, workers: int) -> dict:
    recs = synthetic_corpus(
        distinct, exact=distinct // 20, near=distinct // 20, junk=distinct // 10
    )
    paths = write_corpus(recs, os.path.join(workdir, "corpus"), files=8)
    mb = sum(os.path.getsize(p) for p in paths) / 1e6
    runs = iter(range(1 << 20))

    def once(cluster):
        out = os.path.join(workdir, f"pipeline-{next(runs)}")
        # 8 equal shards: 2 or 4 workers get equal shares at every stage barrier.
        cfg = PipelineConfig(tuple(paths), out, tokenize=True, min_shards=8)
        report = run_pipeline(cfg, cluster=cluster, workers=workers, inline_below_bytes=0)
        assert report is not None and report["documents"] > 0.9 * distinct
        return report

    # Interleaved, so that a burst of load on this shared machine hits both alike.
    fray_times, inline_times = [], []
    with fray.LocalCluster() as cluster:
        for _ in range(repeats):
            fray_times.append(_best(lambda: once(cluster), 1))
            inline_times.append(_best(lambda: once(None), 1))
    fray_s, inline_s = min(fray_times), min(inline_times)
    texts = [r["text"] for r in recs]
    out = bench_batch_stages(texts, repeats)
    sig: list = []
    minhash_s = _best(lambda: sig.__setitem__(slice(None), [minhash_signatures(texts)]), repeats)
    sigs, has = sig[0]
    classic_s = _best(lambda: minhash_signatures(texts, scheme="permutations"), repeats)
    bands, rows = lsh_params(0.8, 128)
    lsh_s = _best(
        lambda: near_duplicate_drops(sigs, has, threshold=0.8, bands=bands, rows=rows), repeats
    )
    out |= {
        "pipeline_input_mb": mb,
        "pipeline_documents": len(recs),
        "pipeline_mb_per_s": mb / fray_s,
        "pipeline_inline_mb_per_s": mb / inline_s,
        "pipeline_speedup_vs_inline": inline_s / fray_s,
        "pipeline_auto_inline_below_mb": INLINE_BELOW_BYTES / 1e6,
        "pipeline_goal_5mb_per_s_met": mb / fray_s >= 5.0,
        "minhash_docs_per_s": len(texts) / minhash_s,
        "minhash_mb_per_s": sum(map(len, texts)) / 1e6 / minhash_s,
        "minhash_permutations_docs_per_s": len(texts) / classic_s,
        "lsh_docs_per_s": len(texts) / lsh_s,
    }
    ref = _datasketch(texts, 0.8, repeats)
    out.update(ref)
    if ref:
        out["minhash_vs_datasketch"] = (
            out["minhash_docs_per_s"] / ref["datasketch_minhash_docs_per_s"]
        )
        out["lsh_vs_datasketch"] = out["lsh_docs_per_s"] / ref["datasketch_lsh_docs_per_s"]
    return out


def bench_dedup_quality(pages: int, pairs_per_bucket: int) -> dict:
    """Recall per true-Jaccard bucket, precision and false positives of our fuzzy dedup and
    of datasketch's on the same web-like corpus (quality, not speed)."""
    corpus = web_corpus(pages, pairs_per_bucket=pairs_per_bucket, seed=1)
    same_site = site_pair_jaccard(corpus, 2000)
    out: dict = {
        "dedup_documents": len(corpus.texts),
        "dedup_site_pair_jaccard_mean": float(same_site.mean()),
        "dedup_site_pair_jaccard_max": float(same_site.max()),
    }
    for name, q in compare_dedups(corpus, threshold=0.8, num_perm=128).items():
        prefix = "dedup" if name == "ours" else f"{name}_dedup"
        out[f"{prefix}_bands_rows"] = f"{q['bands']}x{q['rows']}"
        for b in q["buckets"]:
            key = b["jaccard"].replace("0.", "").replace("-", "_")
            out[f"{prefix}_recall_{key}"] = b["recall"]
            out[f"{prefix}_theory_{key}"] = b["theory"]
            out[f"{prefix}_s_curve_{key}"] = b["s_curve"]
        for k in ("recall", "precision", "false_positive_rate", "single_pages"):
            out[f"{prefix}_{k}"] = q[k]
    out["dedup_pairs_per_bucket"] = pairs_per_bucket
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--length", type=int, default=10**9)
    p.add_argument("--chunk", type=int, default=1 << 22)
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--permutation_n", type=int, default=10**7)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--short_documents", type=int, default=60_000)
    p.add_argument("--pack_documents", type=int, default=100_000)
    p.add_argument("--eval_hashes", type=int, default=2_000_000)
    p.add_argument("--pipeline_documents", type=int, default=8_000)
    p.add_argument("--dedup_pages", type=int, default=1_000)
    p.add_argument("--dedup_pairs", type=int, default=100, help="near copies per bucket")
    p.add_argument("--only", choices=["pipeline", "dedup"], help="run only this benchmark")
    p.add_argument("--quick", action="store_true", help="tiny sizes (for tests)")
    args = p.parse_args(argv)
    if args.quick:
        args.chunk, args.chunks, args.permutation_n, args.batches, args.repeats = (
            4096,
            2,
            10**4,
            2,
            1,
        )
        args.short_documents, args.pack_documents, args.eval_hashes = 6_000, 5_000, 10_000
        args.pipeline_documents = 200
        args.dedup_pages, args.dedup_pairs = 200, 10
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.only == "pipeline":
        with tempfile.TemporaryDirectory() as tmp:
            out = bench_pipeline(tmp, args.pipeline_documents, args.repeats, args.workers)
    if args.only == "dedup":
        out = bench_dedup_quality(args.dedup_pages, args.dedup_pairs)
    if args.only:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()},
                         indent=1))  # fmt: skip
        return 0
    out = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()}-core CPU VM ({platform.machine()}, {platform.system()})",
        "feistel_length": args.length,
        "feistel_numpy_indices_per_s": bench_feistel_numpy(
            args.length, args.chunk, args.chunks, args.repeats
        ),
        "feistel_jax_indices_per_s": bench_feistel_jax(
            args.length, args.chunk, args.chunks, args.repeats
        ),
        "numpy_permutation_per_s": bench_numpy_permutation(args.permutation_n, args.repeats),
    }
    with tempfile.TemporaryDirectory() as tmp:
        out.update(bench_store(tmp, args.batches, args.repeats, args.workers))
        out.update(bench_short_documents(tmp, args.short_documents, args.repeats))
    out.update(bench_packing(args.pack_documents, args.repeats))
    out.update(bench_decontamination(args.eval_hashes, 2000, args.repeats))
    with tempfile.TemporaryDirectory() as tmp:
        out.update(bench_pipeline(tmp, args.pipeline_documents, args.repeats, args.workers))
    out.update(bench_dedup_quality(args.dedup_pages, args.dedup_pairs))
    ref = out["numpy_permutation_per_s"]
    out["feistel_numpy_vs_numpy_permutation"] = out["feistel_numpy_indices_per_s"] / ref
    out["feistel_jax_vs_numpy_permutation"] = out["feistel_jax_indices_per_s"] / ref
    out["goal_numpy_10M_per_s_met"] = out["feistel_numpy_indices_per_s"] >= 1e7
    out["goal_jax_100M_per_s_met"] = out["feistel_jax_indices_per_s"] >= 1e8
    print(
        json.dumps(
            {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}, indent=1
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
