"""meltemi.data.pipeline: raw files -> normalised, deduplicated, filtered documents -> tokens.

Each stage is a set of shard tasks on fray actors (retried, then quarantined: the job always
finishes), each shard's output a Parquet file, with a ledger so that a killed run resumes and
a finished one is not redone. See `run_pipeline` and docs/design/data.md.

>>> import tempfile, json
>>> from meltemi.data.pipeline import PipelineConfig, QualityConfig, run_pipeline
>>> d = tempfile.mkdtemp()
>>> with open(f"{d}/in.jsonl", "w") as f:
...     _ = f.write("".join(json.dumps({"text": t}) + "\\n" for t in ["a b", "a  b", "c d e"]))
>>> cfg = PipelineConfig([f"{d}/in.jsonl"], f"{d}/out", quality=QualityConfig(enabled=False))
>>> report = run_pipeline(cfg)
>>> report["documents"], report["stages"][1]["dropped"]
(2, {'exact_duplicate': 1})
"""

from meltemi.data.pipeline._minhash import lsh_params, minhash_signatures, near_duplicate_drops
from meltemi.data.pipeline._normalize import normalize_text
from meltemi.data.pipeline._pipeline import (
    INLINE_BELOW_BYTES,
    PipelineConfig,
    PipelineError,
    format_report,
    run_pipeline,
)
from meltemi.data.pipeline._quality import RULES, QualityConfig, QualityError, quality_reason

__all__ = [
    "INLINE_BELOW_BYTES",
    "RULES",
    "PipelineConfig",
    "PipelineError",
    "QualityConfig",
    "QualityError",
    "format_report",
    "lsh_params",
    "minhash_signatures",
    "near_duplicate_drops",
    "normalize_text",
    "quality_reason",
    "run_pipeline",
]
