"""Benchmarks of meltemi.data, printed as JSON: `bazel run //data:bench`.

All figures come from one run on this machine:

* `feistel_numpy_indices_per_s`: `FeistelPermutation(10**9)` on numpy, over spread-out chunks.
* `feistel_jax_indices_per_s`: the jitted twin (`on_device.feistel_jax`), same length, after
  compilation, with results fetched to host memory excluded (device arrays ready).
* `numpy_permutation_per_s`: `numpy.random.permutation(10**7)`, the reference.
* `store_batches_per_s`: random `PackedDataset.batch(step)` calls (32 x 1024 tokens) on the
  stdlib corpus store.
* `build_mb_per_s`: input megabytes per second building that store (byte tokenizer).

Each timing is the best of `--repeats`; the machine is shared, so the best is the least noisy.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np

from meltemi.data import (
    ByteTokenizer,
    FeistelPermutation,
    PackedDataset,
    build_store,
    stdlib_corpus,
)


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--length", type=int, default=10**9)
    p.add_argument("--chunk", type=int, default=1 << 22)
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--permutation_n", type=int, default=10**7)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
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
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
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
