"""Describes a token store: `bazel run //data:inspect -- --store=/tmp/store`.

Prints documents, tokens, skipped counts per reason and per source, a `file:line` example of
each reason, and a sample of documents (decoded with --tokenizer, default byte).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from meltemi.data import TokenStore, load_tokenizer


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--store", required=True)
    p.add_argument("--tokenizer", default="byte")
    p.add_argument("--sample", type=int, default=2, help="documents to show")
    p.add_argument("--chars", type=int, default=300, help="characters shown per document")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    path = args.store
    if "://" not in path and not os.path.isabs(path) and "BUILD_WORKING_DIRECTORY" in os.environ:
        path = os.path.join(os.environ["BUILD_WORKING_DIRECTORY"], path)
    tok = load_tokenizer(args.tokenizer)
    store = TokenStore.open(path, tokenizer=tok)
    lengths = store.document_lengths
    meta = store.metadata
    print(f"store       {path}")
    print(f"tokenizer   {meta['tokenizer']['name']} (vocab {meta['tokenizer']['vocab_size']})")
    print(f"documents   {store.num_documents}")
    print(f"tokens      {store.num_tokens}")
    if len(lengths):
        q = np.percentile(lengths, [50, 90, 99]).astype(int).tolist()
        print(f"doc length  mean {lengths.mean():.0f}, p50/p90/p99 {q}, max {lengths.max()}")
    print(f"skipped     {json.dumps(store.skipped)}")
    for name, src in meta["per_source"].items():
        print(f"  {name}: {src['documents']} docs, {src['tokens']} tokens, {src['counts']}")
    for reason, examples in meta.get("examples", {}).items():
        print(f"  {reason}: {store.skipped.get(reason, 0)}, e.g. {examples[0]}")
    rng = np.random.default_rng(args.seed)
    count = min(args.sample, store.num_documents)
    for d in sorted(rng.choice(store.num_documents, count, replace=False).tolist()):
        text = tok.decode(store.document(d))[: args.chars]
        print(f"--- document {d} ({store.location(d)}, {lengths[d]} tokens)")
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
