"""lm-evaluation-harness tasks on a checkpoint, offline.

    ./bazelw run //levanter:harness -- --checkpoint=runs/default/checkpoints/step_400 \
        --tasks=meltemi_tiny_mc
    ./bazelw run //levanter:harness -- --checkpoint=hf/llama --tasks=hellaswag,arc_easy \
        --include_path=my_tasks --limit=100

The checkpoint is a run checkpoint, a run directory (its newest checkpoint) or a Hugging Face
directory; tasks come from lm-eval, `levanter/harness_tasks` and `--include_path`, and their
data must already be local (the Hub and `datasets` are kept offline). Prints lm-eval's table
and writes `harness.json` into the checkpoint directory (or `--output`). Exit status: 0 done;
2 with one `error:` line for a missing checkpoint or an unknown task; 74 with one
`error: I/O failure ...` line when a read or write fails (EX_IOERR); 1 for a bug.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from absl import flags
from absl import logging as absl_logging

from meltemi.levanter.main import _flags
from meltemi.levanter.main._flags import user_path


def define_flags() -> None:
    """Registers the binary's flags (called only when it runs)."""
    flags.DEFINE_string(
        "checkpoint",
        None,
        "A run checkpoint (runs/<name>/checkpoints/step_N), a run directory or a Hugging "
        "Face directory.",
    )
    flags.DEFINE_list("tasks", [], "lm-eval task or group names, comma-separated.")
    flags.DEFINE_list("include_path", [], "More task directories (YAML), comma-separated.")
    flags.DEFINE_float("limit", 0, "At most this many documents per task (0: all).")
    flags.DEFINE_integer("num_fewshot", -1, "Few-shot examples (-1: each task's default).")
    flags.DEFINE_integer("batch_size", 8, "Requests per forward pass.")
    flags.DEFINE_integer("max_length", 0, "Longest scored sequence (0: the model's).")
    flags.DEFINE_integer("seed", 0, "Seed of few-shot sampling and of sampled generation.")
    flags.DEFINE_string("output", "", "Where to write harness.json (default: the checkpoint).")


def _parse(argv: list[str]) -> list[str]:
    return _flags.parse(argv, {})


def main(argv: Sequence[str]) -> int:
    """Runs the binary; returns its exit status (the module docstring's list)."""
    FLAGS = flags.FLAGS  # noqa: N806
    if len(argv) > 1:
        print(f"error: unexpected arguments {argv[1:]}; flags take --name=value.", file=sys.stderr)
        return 2
    if not FLAGS["verbosity"].present:
        absl_logging.set_verbosity(absl_logging.WARNING)
    if not FLAGS.checkpoint or not FLAGS.tasks:
        print(
            "error: pass --checkpoint=DIR and --tasks=NAME[,NAME...], e.g. "
            "--tasks=meltemi_tiny_mc.",
            file=sys.stderr,
        )
        return 2
    if FLAGS.batch_size < 1:
        print(f"error: --batch_size={FLAGS.batch_size}: must be >= 1.", file=sys.stderr)
        return 2
    from meltemi.levanter.harness import MeltemiLM, harness_metrics, run_tasks

    try:
        lm = MeltemiLM(
            checkpoint=user_path(FLAGS.checkpoint),
            batch_size=FLAGS.batch_size,
            max_length=FLAGS.max_length or None,
            seed=FLAGS.seed,
        )
        results = run_tasks(
            lm,
            FLAGS.tasks,
            include_path=[user_path(p) for p in FLAGS.include_path],
            limit=FLAGS.limit or None,
            num_fewshot=None if FLAGS.num_fewshot < 0 else FLAGS.num_fewshot,
            seed=FLAGS.seed,
        )
        print(format_results(results))
        path = user_path(FLAGS.output) if FLAGS.output else str(lm.loaded.path / "harness.json")
        data = {
            "checkpoint": str(lm.loaded.path),
            "tasks": list(FLAGS.tasks),
            "metrics": harness_metrics(results),
            "results": results["results"],
            "n_samples": results.get("n-samples", {}),
        }
        with open(path, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True, default=str)
            f.write("\n")
    except Exception as e:  # a usage or I/O error is one line and its status; a bug raises
        status = _flags.report(e)
        if status is None:
            raise
        return status
    print(f"wrote {path}")
    return 0


def format_results(results: dict) -> str:
    """One row per task and metric: the value and the documents evaluated."""
    counts = results.get("n-samples", {})
    header = f"{'task':<28} {'metric':<12} {'value':>8} {'docs':>6}"
    lines = [header, "-" * len(header)]
    for task, metrics in results.get("results", {}).items():
        docs = counts.get(task, {}).get("effective", "")
        for key, value in metrics.items():
            name, _, _ = key.partition(",")
            if "_stderr" in name or name in ("alias", "sample_len") or not isinstance(value, float):
                continue
            lines.append(f"{task:<28} {name:<12} {value:>8.4f} {docs!s:>6}")
    return "\n".join(lines)


def run() -> None:
    """Entry point: defines the flags and runs `main`."""
    _flags.run(define_flags, main, _parse)


if __name__ == "__main__":
    run()
