"""The scaling-law binary: isoflop sweep, fit, preregistered prediction, verification.

    ./bazelw run //levanter:isoflop -- --config=levanter/configs/isoflop.py
    ./bazelw run //levanter:isoflop -- --config=levanter/configs/isoflop.py --predict=1e13
    ./bazelw run //levanter:isoflop -- --config=levanter/configs/isoflop.py --verify
    ./bazelw run //levanter:isoflop -- --config=levanter/configs/isoflop.py --sweep=batch

Without flags: the sweep and its fit (`<run_dir>/isoflop.json`, `isoflop.png`). Rerunning
skips finished runs and resumes killed ones. `--cluster=ray` runs the workers on Ray.
Exit status: 0 done, 2 for a mistake in the config or flags (one `error:` line), 1 when
runs failed (the finished ones are kept; run the command again to resume).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from absl import flags
from absl import logging as absl_logging

from meltemi import data as md
from meltemi.levanter.checkpoint import CheckpointError
from meltemi.levanter.config import ConfigError
from meltemi.levanter.experiments import Experiment, SweepRunError
from meltemi.levanter.main import _flags

_RESOLVED: dict = {}


def define_flags() -> None:
    """Registers the binary's flags (called only when it runs)."""
    flags.DEFINE_string(
        "config",
        None,
        "Config file and variant: path/to/isoflop.py[:variant]; override "
        "fields with --config.section.key=value (e.g. --config.sweep.budgets='(1e11, 1e12)').",
    )
    flags.DEFINE_enum(
        "sweep",
        "isoflop",
        ["isoflop", "batch"],
        "isoflop: sizes at each budget; batch: batch sizes at fixed budgets.",
    )
    flags.DEFINE_float("predict", None, "Preregister a prediction at this budget (FLOPs).")
    flags.DEFINE_bool(
        "verify",
        False,
        "Sweep, fit, predict (at --predict, else sweep."
        "predict_factor x the largest budget) and train the prediction's model.",
    )
    flags.DEFINE_enum(
        "cluster",
        "local",
        ["local", "ray", "inprocess"],
        "Where the runs' workers live (fray backend).",
    )


def _parse(argv: list[str]) -> list[str]:
    return _flags.parse(
        argv, _RESOLVED, example="levanter/configs/isoflop.py", keep_overrides=False
    )


def main(argv: Sequence[str]) -> int:
    """Runs the binary; a config mistake is one `error:` line and status 2."""
    del argv
    FLAGS = flags.FLAGS  # noqa: N806
    if not FLAGS["verbosity"].present:
        absl_logging.set_verbosity(absl_logging.WARNING)
    try:
        if FLAGS.predict is not None and not FLAGS.predict > 0:
            raise ConfigError(f"--predict={FLAGS.predict}: a budget in FLOPs > 0, e.g. 1e13.")
        if FLAGS.sweep == "batch" and (FLAGS.verify or FLAGS.predict is not None):
            raise ConfigError("--sweep=batch does not predict; drop --verify / --predict.")
        experiment = Experiment(_RESOLVED["config"], cluster=FLAGS.cluster)
        if FLAGS.sweep == "batch":
            experiment.batch_sweep()
        elif FLAGS.verify:
            experiment.verify(FLAGS.predict)
        elif FLAGS.predict is not None:
            experiment.predict(FLAGS.predict)
        else:
            experiment.sweep_and_fit()
    except (ConfigError, CheckpointError, md.StoreError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SweepRunError as e:  # finished runs are kept: rerun the command to resume
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"isoflop: done; results in {experiment.run_dir}", flush=True)
    return 0


def run() -> None:
    """Entry point: defines the flags and runs `main`."""
    _flags.run(define_flags, main, _parse)


if __name__ == "__main__":
    run()
