r"""The RL binary: GRPO / RLOO / on-policy distillation with fray rollout workers.

    ./bazelw run //levanter:train -- --config=levanter/configs/rl_arithmetic.py:sft  # format
    ./bazelw run //levanter:rl -- --config=levanter/configs/rl_arithmetic.py
    ./bazelw run //levanter:rl -- --config=levanter/configs/rl_math.py --dry_run

The config is a trainer config plus an `rl` section (`meltemi.levanter.config.rl_section`).
Exit statuses are the trainer's: 0 done, 2 a mistake in the flags or the config (one
`error:` line), 74 an I/O failure, 75 stopped by SIGTERM after saving a checkpoint (run it
again), 1 a bug (a traceback). Running the same command again
resumes from the newest checkpoint with the same prompt order.
"""

from __future__ import annotations

from collections.abc import Sequence

from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags

from meltemi.levanter.config import resolve, resolve_run_dir, rl_spec
from meltemi.levanter.main import _flags
from meltemi.levanter.rl import RLTrainer, rl_dry_run
from meltemi.levanter.trainer import PREEMPTED_EXIT_CODE

_RESOLVED: dict = {}


def define_flags() -> None:
    """Registers the binary's flags (called only when it runs)."""
    config_flags.DEFINE_config_file(
        "config", None, "RL config file and variant: path/to/config.py[:variant]; override "
        "fields with --config.section.key=value.", lock_config=True,
    )  # fmt: skip
    flags.DEFINE_bool("print_config", False, "Print the resolved config with provenance; exit.")
    flags.DEFINE_bool(
        "dry_run", False, "Plan the trainer's step on a virtual mesh and the rollout workers' "
        "engines (devices, KV pool, sync bytes); print it; exit.",
    )  # fmt: skip
    flags.DEFINE_integer("dry_run_devices", 0, "Virtual trainer devices for --dry_run.")
    flags.DEFINE_float("dry_run_hbm_gib", 0.0, "Device memory (GiB) --dry_run checks against.")


def main(argv: Sequence[str]) -> int:
    """Runs the binary; returns its exit status."""
    del argv
    FLAGS = flags.FLAGS  # noqa: N806
    if not FLAGS["verbosity"].present:
        absl_logging.set_verbosity(absl_logging.WARNING)
    resolved = _RESOLVED["config"]
    try:
        if FLAGS.print_config:
            print(resolved.format())
            return 0
        spec = resolve(resolved)
        rl = rl_spec(resolved.config)
        if FLAGS.dry_run:
            print(rl_dry_run(spec, rl, num_devices=FLAGS.dry_run_devices or None,
                             hbm_gib=FLAGS.dry_run_hbm_gib or None))  # fmt: skip
            return 0
        result = RLTrainer(spec, rl).run()
    except Exception as e:  # a usage or I/O error is one line and its status; a bug raises
        c = resolved.config
        status = _flags.report(e, run_dir=resolve_run_dir(c.name, c.run_dir))
        if status is None:
            raise
        return status
    print(result.summary(), flush=True)
    return PREEMPTED_EXIT_CODE if result.run.preempted else 0


def run() -> None:
    """Entry point: defines the flags and runs `main`."""
    _flags.run(
        define_flags, main,
        lambda argv: _flags.parse(argv, _RESOLVED, example="levanter/configs/rl_arithmetic.py"),
    )  # fmt: skip


if __name__ == "__main__":
    run()
