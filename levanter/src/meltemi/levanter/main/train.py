"""The trainer binary.

    ./bazelw run //levanter:train -- --config=levanter/configs/default.py
    ./bazelw run //levanter:train -- --config=levanter/configs/default.py:smoke \
        --config.trainer.seed=3 --print_config
    ./bazelw run //levanter:train -- --config=levanter/configs/marin_32b.py --dry_run

Exit status: 0 when the run finished, 75 when SIGTERM stopped it after saving a checkpoint
(run the same command again to resume), 2 for a config error.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags

from meltemi import data as md
from meltemi.levanter.checkpoint import CheckpointError
from meltemi.levanter.config import ConfigError, resolve, resolve_run_dir
from meltemi.levanter.main import _flags
from meltemi.levanter.trainer import (
    PREEMPTED_EXIT_CODE,
    Trainer,
    display_path,
    dry_run,
    launch_multislice,
)

_RESOLVED: dict = {}


def define_flags() -> None:
    """Registers the binary's flags (called only when it runs)."""
    config_flags.DEFINE_config_file(
        "config",
        None,
        "Config file and variant: path/to/config.py[:variant]; override fields with "
        "--config.section.key=value.",
        lock_config=True,
    )
    flags.DEFINE_bool("print_config", False, "Print the resolved config with provenance; exit.")
    flags.DEFINE_bool(
        "dry_run",
        False,
        "Lower and compile the train step on a virtual mesh; print memory and FLOPs; exit.",
    )
    flags.DEFINE_integer(
        "dry_run_devices", 0, "Virtual CPU devices for --dry_run (0: mesh.* decides, min 1)."
    )
    flags.DEFINE_string(
        "export_hf",
        "",
        "After training (or for a finished run), write the final parameters as a Hugging Face "
        "checkpoint in this directory (config.json + safetensors; transformers loads it).",
    )
    flags.DEFINE_string(
        "export_peft",
        "",
        "After training with model.lora.rank > 0, write the LoRA adapters in this directory "
        "as a PEFT adapter (adapter_config.json + adapter_model.safetensors).",
    )
    flags.DEFINE_float(
        "dry_run_hbm_gib",
        0.0,
        "Device memory (GiB per device) --dry_run checks the total against, e.g. 95 (TPU v5p).",
    )


def _parse(argv: list[str]) -> list[str]:
    return _flags.parse(argv, _RESOLVED, example="levanter/configs/default.py")


def main(argv: Sequence[str]) -> int:
    """Runs the binary; a config (or checkpoint) mistake is one `error:` line and status 2."""
    del argv
    FLAGS = flags.FLAGS  # noqa: N806
    if not FLAGS["verbosity"].present:
        # orbax logs every file it renames at INFO; the progress bar is the run's voice.
        absl_logging.set_verbosity(absl_logging.WARNING)
    resolved = _RESOLVED["config"]
    try:
        if FLAGS.print_config:
            print(resolved.format())
            config = resolved.config
            print(f"# run_dir resolves to {resolve_run_dir(config.name, config.run_dir)}")
            return 0
        spec = resolve(resolved)  # every check, before any data, model or mesh work
        if FLAGS.dry_run:
            report = dry_run(
                spec,
                num_devices=FLAGS.dry_run_devices or None,
                hbm_gib=FLAGS.dry_run_hbm_gib if FLAGS["dry_run_hbm_gib"].present else None,
            )
            print(report.format())
            return 0
        if spec.mesh.num_slices > 1 and "MELTEMI_SLICE_INDEX" not in os.environ:
            return launch_multislice(spec)
        trainer = Trainer(spec)
        result = trainer.run()
        if FLAGS.export_hf and not result.preempted:
            directory = resolve_run_dir("", FLAGS.export_hf)  # relative to the user's cwd
            trainer.export_hf(directory)
            result.summary += f"\n  Hugging Face export: {display_path(directory)}"
        if FLAGS.export_peft and not result.preempted:
            directory = resolve_run_dir("", FLAGS.export_peft)
            trainer.export_peft(directory)
            result.summary += f"\n  PEFT adapter export: {display_path(directory)}"
    except (ConfigError, CheckpointError, md.StoreError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(result.summary, flush=True)
    return PREEMPTED_EXIT_CODE if result.preempted else 0


def run() -> None:
    """Entry point: defines the flags and runs `main`."""
    _flags.run(define_flags, main, _parse)


if __name__ == "__main__":
    run()
