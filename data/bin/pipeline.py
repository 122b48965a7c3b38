"""Raw files -> normalised, deduplicated, filtered documents (-> tokens), on fray.

    bazel run //data:pipeline -- --input=data/*.jsonl.gz --output=/tmp/corpus \\
        [--near_duplicate_threshold=0.8] [--cluster=local|ray|inline] [--workers=2] \\
        [--inline_below_mb=8] \\
        [--tokenize --tokenizer=byte|path/tokenizer.json] [--task_timeout_s=3600]

Writes DIR/documents/*.parquet (id, text, meta), DIR/report.json and prints its table. Kill
it at any point and rerun the same command: it resumes from DIR/ledger.jsonl; a rerun of a
finished run does nothing. A shard that crashes or exceeds --task_timeout_s is retried
(--retries), then quarantined and reported: the job always finishes.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import sys

from meltemi import fray
from meltemi.data import SourceError, StoreError
from meltemi.data.pipeline import (
    INLINE_BELOW_BYTES,
    PipelineConfig,
    PipelineError,
    QualityConfig,
    QualityError,
    format_report,
    run_pipeline,
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--input",
        action="append",
        required=True,
        help="files, directories, globs or URLs (repeatable, or comma-separated)",
    )
    p.add_argument("--output", required=True, help="output directory (local)")
    p.add_argument("--near_duplicate_threshold", type=float, default=0.8)
    p.add_argument("--shingle_size", type=int, default=5)
    p.add_argument("--num_perm", type=int, default=128)
    p.add_argument("--no_exact_dedup", action="store_true")
    p.add_argument("--no_fuzzy_dedup", action="store_true")
    p.add_argument(
        "--quality",
        default="",
        help="threshold overrides, e.g. min_words=20,max_duplicate_lines=0.5; "
        "'off' disables the rules",
    )
    p.add_argument("--text_key", default="text")
    p.add_argument("--max_run", type=int, default=1000)
    p.add_argument("--tokenize", action="store_true")
    p.add_argument("--tokenizer", default="byte")
    p.add_argument("--cluster", choices=["local", "ray", "inline"], default="local")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument(
        "--inline_below_mb",
        type=float,
        default=INLINE_BELOW_BYTES / 1e6,
        help="smaller inputs run in this process: starting actors would not pay off (0: never)",
    )
    p.add_argument("--task_timeout_s", type=float, default=3600.0)
    p.add_argument("--retries", type=int, default=2)
    p.add_argument("--shard_mb", type=float, default=64.0)
    p.add_argument("--min_shards", type=int, default=8)
    return p  # fmt: skip


def _quality(spec: str) -> QualityConfig:
    if spec == "off":
        return QualityConfig(enabled=False)
    fields = {f.name: f for f in dataclasses.fields(QualityConfig) if f.name != "enabled"}
    kw = {}
    for item in filter(None, spec.split(",")):
        key, eq, value = item.partition("=")
        if key not in fields or not eq:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise QualityError(
                f"--quality: {item!r} is not NAME=VALUE with a known NAME; {hint}"
                f"the names are {sorted(fields)}"
            )
        try:
            kw[key] = int(value) if fields[key].type == "int" else float(value)
        except ValueError:
            raise QualityError(f"--quality: {key}={value!r} is not a number") from None
    return QualityConfig(**kw)


def _cluster(kind: str, workers: int):
    if kind == "inline":
        return None
    if kind == "ray":
        from meltemi.fray.ray import RayCluster

        return RayCluster()
    return fray.LocalCluster()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    base = os.environ.get("BUILD_WORKING_DIRECTORY", "")

    def here(p: str) -> str:
        return p if os.path.isabs(p) or "://" in p or not base else os.path.join(base, p)

    try:
        config = PipelineConfig(
            inputs=tuple(here(p) for spec in args.input for p in spec.split(",") if p),
            output=here(args.output),
            text_key=args.text_key,
            max_run=args.max_run,
            exact_dedup=not args.no_exact_dedup,
            fuzzy_dedup=not args.no_fuzzy_dedup,
            near_duplicate_threshold=args.near_duplicate_threshold,
            shingle_size=args.shingle_size,
            num_perm=args.num_perm,
            quality=_quality(args.quality),
            tokenize=args.tokenize,
            tokenizer=args.tokenizer,
            shard_bytes=max(1, int(args.shard_mb * (1 << 20))),
            min_shards=args.min_shards,
            task_timeout_s=args.task_timeout_s,
            retries=args.retries,
        )
        cluster = _cluster(args.cluster, args.workers)
        try:
            report = run_pipeline(config, cluster=cluster, workers=args.workers,
                                  log=lambda m: print(m, file=sys.stderr, flush=True),
                                  inline_below_bytes=int(args.inline_below_mb * 1e6))  # fmt: skip
        finally:
            if cluster is not None:
                cluster.shutdown()
    except (PipelineError, QualityError, SourceError, StoreError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_report(report))
    mb = report["input_bytes"] / 1e6
    print(
        f"{report['documents']:,} documents in {config.output}/documents "
        f"({mb:.2f} MB of input, last run {report['last_run_seconds']:.1f} s); "
        f"report: {config.output}/report.json"
    )
    if report["quarantined_shards"]:
        print(f"quarantined shards: {report['quarantined_shards']} (see report.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
