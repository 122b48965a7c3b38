"""Trains a byte-level BPE tokenizer: `bazel run //data:train_tokenizer -- --output=tok.json`.

--corpus=stdlib:train (default) or any source spec (see build_store)
--vocab_size=4096
"""

from __future__ import annotations

import argparse
import os
import sys

from meltemi.data import parse_source, train_bpe


def _texts(source, limit_bytes: int):
    seen = 0
    for f in source.files():
        for doc in source.read(f):
            if doc.text is None:
                continue
            text = doc.text if isinstance(doc.text, str) else doc.text.decode("utf-8", "replace")
            yield text
            seen += len(text)
            if seen >= limit_bytes:
                return


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--output", required=True, help="where to write tokenizer.json")
    p.add_argument("--corpus", default="stdlib:train")
    p.add_argument("--vocab_size", type=int, default=4096)
    p.add_argument("--max_mb", type=float, default=64.0, help="train on at most this much text")
    args = p.parse_args(argv)
    output = args.output
    if not os.path.isabs(output) and "BUILD_WORKING_DIRECTORY" in os.environ:
        output = os.path.join(os.environ["BUILD_WORKING_DIRECTORY"], output)
    source = parse_source(args.corpus)
    tok = train_bpe(_texts(source, int(args.max_mb * (1 << 20))), args.vocab_size, output)
    sample = "def main(argv):\n    return 0\n"
    ids = tok.encode(sample)
    print(f"wrote {output}: vocab {tok.vocab_size}, fingerprint {tok.fingerprint()[:12]}")
    print(f"{len(sample.encode())} bytes -> {len(ids)} tokens for {sample!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
