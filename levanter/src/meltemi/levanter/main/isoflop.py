r"""The scaling-law binary: isoflop sweep, fit, preregistered prediction, verification.

    ./bazelw run //levanter:isoflop -- --config=levanter/configs/isoflop.py
    ./bazelw run //levanter:isoflop -- --config=levanter/configs/isoflop.py --predict=1e13
    ./bazelw run //levanter:isoflop -- --config=levanter/configs/isoflop.py --verify
    ./bazelw run //levanter:isoflop -- --config=levanter/configs/isoflop.py --predict=1e13 \
        --verify --expect_prediction_sha256=<hex of the `preregistered:` line --predict printed>
    ./bazelw run //levanter:isoflop -- --config=levanter/configs/isoflop.py --sweep=batch

Without flags: the sweep and its fit (`<run_dir>/isoflop.json`, `isoflop.png`). Rerunning
skips finished runs and resumes killed ones. `--cluster=ray` runs the workers on Ray.
Writing a prediction prints one `preregistered: prediction sha256=...` line on stdout: keep
it; `--verify` of that prediction in a later command needs its digest back.
Exit status: 0 done, 2 for a mistake in the config or flags (one `error:` line; also an
exception in the config file's code, named by file:line), 74 for an I/O failure such as a
full disk (one `error: I/O failure ...` line; run the command again to resume), 1 when runs
failed (the finished ones are kept; run the command again to resume) or for a bug.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from absl import flags
from absl import logging as absl_logging

from meltemi.levanter.config import ConfigError
from meltemi.levanter.experiments import Experiment, SweepRunError, parse_digest
from meltemi.levanter.main import _flags
from meltemi.levanter.main._hooks import training_hooks

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
    flags.DEFINE_string(
        "expect_prediction_sha256",
        None,
        "With --verify of a prediction written by an earlier command: the digest of the "
        "`preregistered:` line it printed; --verify refuses a prediction.json that differs.",
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
    """Runs the binary; returns its exit status (the module docstring's list)."""
    del argv
    FLAGS = flags.FLAGS  # noqa: N806
    if not FLAGS["verbosity"].present:
        absl_logging.set_verbosity(absl_logging.WARNING)
    try:
        if FLAGS.predict is not None and not FLAGS.predict > 0:
            raise ConfigError(f"--predict={FLAGS.predict}: a budget in FLOPs > 0, e.g. 1e13.")
        if FLAGS.sweep == "batch" and (FLAGS.verify or FLAGS.predict is not None):
            raise ConfigError("--sweep=batch does not predict; drop --verify / --predict.")
        expect = FLAGS.expect_prediction_sha256
        if expect is not None and not FLAGS.verify:
            raise ConfigError(
                f"--expect_prediction_sha256={expect}: only --verify checks a prediction; add "
                "--verify or drop the flag."
            )
        expect = parse_digest(expect) if expect is not None else None
        experiment = Experiment(_RESOLVED["config"], cluster=FLAGS.cluster, hooks=training_hooks)
        if FLAGS.sweep == "batch":
            experiment.batch_sweep()
        elif FLAGS.verify:
            experiment.verify(FLAGS.predict, expect_sha256=expect)
        elif FLAGS.predict is not None:
            experiment.predict(FLAGS.predict)
        else:
            experiment.sweep_and_fit()
    except SweepRunError as e:  # finished runs are kept: rerun the command to resume
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a usage or I/O error is one line and its status; a bug raises
        status = _flags.report(e, run_dir=_RESOLVED["config"].config.run_dir or None)
        if status is None:
            raise
        return status
    print(f"isoflop: done; results in {experiment.run_dir}", flush=True)
    return 0


def run() -> None:
    """Entry point: defines the flags and runs `main`."""
    _flags.run(define_flags, main, _parse)


if __name__ == "__main__":
    run()
