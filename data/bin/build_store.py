"""Builds (or resumes) a token store: `bazel run //data:build_store -- --output=/tmp/store`.

    --source=stdlib:train (default) | jsonl:NAME=GLOB[,GLOB] | text:NAME=... | parquet:NAME=...
    --tokenizer=byte (default) | path/to/tokenizer.json
    --decontaminate=SPEC  (repeatable) evaluation sources whose 13-grams are removed
    --workers=N           local worker processes

Kill it at any point and rerun the same command: it resumes from the ledger.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from meltemi.data import CleanPolicy, build_store, load_tokenizer, parse_source


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--output", required=True, help="store directory (local)")
    p.add_argument("--source", action="append", help="source spec (repeatable)")
    p.add_argument("--tokenizer", default="byte")
    p.add_argument("--decontaminate", action="append", default=[])
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--shard_mb", type=float, default=64.0)
    p.add_argument("--max_run", type=int, default=CleanPolicy.max_run)
    p.add_argument("--ngram", type=int, default=CleanPolicy.ngram)
    p.add_argument("--invalid_utf8", choices=["replace", "skip"], default="replace")
    p.add_argument("--no_progress", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    output = args.output
    if not os.path.isabs(output) and "BUILD_WORKING_DIRECTORY" in os.environ:
        output = os.path.join(os.environ["BUILD_WORKING_DIRECTORY"], output)
    sources = [parse_source(s) for s in args.source or ["stdlib:train"]]
    policy = CleanPolicy(max_run=args.max_run, ngram=args.ngram, invalid_utf8=args.invalid_utf8)
    bar = None
    progress = None
    if not args.no_progress:
        from tqdm import tqdm

        def progress(done: int, total: int) -> None:
            nonlocal bar
            if bar is None:
                bar = tqdm(total=total, unit="shard", initial=done - 1)
            bar.update(1)

    start = time.perf_counter()
    store = build_store(
        sources,
        load_tokenizer(args.tokenizer),
        output,
        policy=policy,
        decontaminate=[parse_source(s) for s in args.decontaminate],
        workers=args.workers,
        shard_bytes=int(args.shard_mb * (1 << 20)),
        progress=progress,
    )
    if bar is not None:
        bar.close()
    meta = store.metadata
    summary = {
        "store": output,
        "documents": meta["documents"],
        "tokens": meta["tokens"],
        "skipped": meta["skipped"],
        "per_source": meta["per_source"],
        "seconds": round(time.perf_counter() - start, 2),
    }
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
