r"""The evaluation binary: loss and bits per byte of a checkpoint on every evaluation set.

    ./bazelw run //levanter:eval -- --checkpoint=runs/default/checkpoints/step_400
    ./bazelw run //levanter:eval -- --checkpoint=runs/default \
        --eval_files=wiki=data/wiki_val.jsonl,code=data/code_val.jsonl
    ./bazelw run //levanter:eval -- --checkpoint=hf/llama --eval_files=web=web.jsonl \
        --seq_len=2048

A run checkpoint is evaluated with its run's config (`<run_dir>/config.json`, or `--config`)
on the config's evaluation sets, exactly as the trainer evaluates it; a Hugging Face directory
on the `--config`'s sets (if given) and `--eval_files`. Prints a table and writes `eval.json`
into the checkpoint directory (or `--output`). Exit status: 0 done; 2 with one `error:` line
for a missing checkpoint, a bad `--eval_files` or a config error (also an exception in the
config file's code, named by file:line); 74 with one `error: I/O failure ...` line when a
read or write fails (EX_IOERR); 1 for a bug (a traceback).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags

from meltemi.levanter.main import _flags
from meltemi.levanter.main._flags import user_path

_STATE: dict = {}


def define_flags() -> None:
    """Registers the binary's flags (called only when it runs)."""
    config_flags.DEFINE_config_file(
        "config",
        None,
        "The run's config (path/to/config.py[:variant], with --config.section.key=value "
        "overrides); default: the run directory's config.json.",
        lock_config=True,
    )
    flags.DEFINE_string(
        "checkpoint",
        None,
        "A run checkpoint (runs/<name>/checkpoints/step_N), a run directory (its newest "
        "checkpoint) or a Hugging Face directory (config.json + *.safetensors).",
    )
    flags.DEFINE_string(
        "eval_files", "", "Extra evaluation sets: NAME=PATH[,NAME=PATH...] (text/jsonl/parquet)."
    )
    flags.DEFINE_integer("seq_len", 0, "Tokens per row (0: the config's data.seq_len, or 1024).")
    flags.DEFINE_integer("batch_size", 0, "Rows per batch (0: the config's eval.batch_size, or 8).")
    flags.DEFINE_integer(
        "num_batches", 0, "Batches per set (0: the config's eval.num_batches, or 4)."
    )
    flags.DEFINE_string("output", "", "Where to write eval.json (default: the checkpoint's dir).")


def _parse(argv: list[str]) -> list[str]:
    return _flags.parse(argv, _STATE)


def main(argv: Sequence[str]) -> int:
    """Runs the binary; returns its exit status (the module docstring's list)."""
    from meltemi.levanter.evaluation import evaluate_checkpoint, format_table

    FLAGS = flags.FLAGS  # noqa: N806
    if len(argv) > 1:
        print(f"error: unexpected arguments {argv[1:]}; flags take --name=value.", file=sys.stderr)
        return 2
    if not FLAGS["verbosity"].present:
        absl_logging.set_verbosity(absl_logging.WARNING)
    if not FLAGS.checkpoint:
        print(
            "error: pass --checkpoint=DIR (runs/<name>/checkpoints/step_N, a run directory or "
            "a Hugging Face directory).",
            file=sys.stderr,
        )
        return 2
    for name in ("seq_len", "batch_size", "num_batches"):
        if FLAGS[name].value < 0:
            print(f"error: --{name}={FLAGS[name].value}: must be >= 0 (0: the default).",
                  file=sys.stderr)  # fmt: skip
            return 2
    files = []
    for entry in FLAGS.eval_files.split(","):
        name, sep, path = entry.partition("=")
        files.append(f"{name}={user_path(path.strip())}" if sep and path.strip() else entry)
    try:
        data, path = evaluate_checkpoint(
            user_path(FLAGS.checkpoint),
            config=_STATE.get("config"),
            eval_files=",".join(files),
            seq_len=FLAGS.seq_len,
            batch_size=FLAGS.batch_size,
            num_batches=FLAGS.num_batches,
            output=user_path(FLAGS.output) or None,
        )
    except Exception as e:  # a usage or I/O error is one line and its status; a bug raises
        status = _flags.report(e)
        if status is None:
            raise
        return status
    step = f" (step {data['step']})" if data.get("step") is not None else ""
    print(f"{data['checkpoint']}{step}: {data['kind']} checkpoint, {data['seq_len']}-token rows, "
          f"{data['num_batches']} x {data['batch_size']} rows per set")  # fmt: skip
    print(format_table(data["sets"]))
    print(f"wrote {path}")
    return 0


def run() -> None:
    """Entry point: defines the flags and runs `main`."""
    _flags.run(define_flags, main, _parse)


if __name__ == "__main__":
    run()
