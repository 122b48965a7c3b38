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

from meltemi.levanter.config import rl_spec
from meltemi.levanter.main import _flags
from meltemi.levanter.rl import RLTrainer, rl_dry_run
from meltemi.levanter.trainer import PREEMPTED_EXIT_CODE

_RESOLVED: dict = {}


def define_flags() -> None:
    """Registers the binary's flags (called only when it runs)."""
    _flags.define_config_flags(
        what="RL config",
        dry_run_help="Plan the trainer's step on a virtual mesh and the rollout workers' "
        "engines (devices, KV pool, sync bytes); print it; exit.",
        devices_help="Virtual trainer devices for --dry_run.",
    )


def main(argv: Sequence[str]) -> int:
    """Runs the binary; returns its exit status."""
    del argv
    resolved = _RESOLVED["config"]
    return _flags.run_config(resolved, lambda spec: _rl(spec, rl_spec(resolved.config)))


def _rl(spec, rl) -> int:
    FLAGS = flags.FLAGS  # noqa: N806
    if FLAGS.dry_run:
        devices = FLAGS.dry_run_devices or None
        print(rl_dry_run(spec, rl, num_devices=devices, hbm_gib=_flags.dry_run_hbm_gib()))
        return 0
    result = RLTrainer(spec, rl).run()
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
