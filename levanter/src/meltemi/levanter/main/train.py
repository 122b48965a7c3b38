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

from meltemi.levanter.config import ConfigError, load_config, parse_override_args, resolve_path

_RESOLVED = {}


def config_arg(argv: Sequence[str]) -> str | None:
    """The value of `--config` in a command line (None if absent)."""
    args = list(argv)
    for i, arg in enumerate(args):
        for prefix in ("--config=", "-config="):
            if arg.startswith(prefix):
                return arg[len(prefix) :]
        if arg in ("--config", "-config") and i + 1 < len(args):
            return args[i + 1]
    return None


def _absolute_config(argv: list[str]) -> list[str]:
    # absl loads the file relative to the cwd, which under `bazel run` is the runfiles tree;
    # the user meant their own directory.
    out = []
    for arg in argv:
        if arg.startswith("--config="):
            spec = arg[len("--config=") :]
            path, sep, variant = spec.partition(".py:")
            path = path + ".py" if sep else spec
            resolved = str(resolve_path(path))
            arg = "--config=" + resolved + (":" + variant if sep else "")
        out.append(arg)
    return out


def define_flags() -> None:
    """Registers the binary's flags (called only when it runs)."""
    from absl import flags
    from ml_collections import config_flags

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
    flags.DEFINE_float(
        "dry_run_hbm_gib",
        0.0,
        "Device memory (GiB per device) --dry_run checks the total against, e.g. 95 (TPU v5p).",
    )


def _parse(argv: list[str]) -> list[str]:
    from absl import flags

    argv = _absolute_config(list(argv))
    spec = config_arg(argv)
    if spec is None:
        print("error: pass a config, e.g. --config=levanter/configs/default.py", file=sys.stderr)
        sys.exit(2)
    try:
        _RESOLVED["config"] = load_config(spec, parse_override_args(argv))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def main(argv: Sequence[str]) -> int:
    from absl import flags

    FLAGS = flags.FLAGS  # noqa: N806
    if not FLAGS["verbosity"].present:
        from absl import logging as absl_logging

        # orbax logs every file it renames at INFO; the progress bar is the run's voice.
        absl_logging.set_verbosity(absl_logging.WARNING)
    resolved = _RESOLVED["config"]
    if FLAGS.print_config:
        from meltemi.levanter.trainer import resolve_run_dir

        print(resolved.format())
        print(f"# run_dir resolves to {resolve_run_dir(resolved.config)}")
        return 0
    if FLAGS.dry_run:
        from meltemi.levanter.trainer import TrainerError, dry_run

        try:
            report = dry_run(
                resolved,
                num_devices=FLAGS.dry_run_devices or None,
                hbm_gib=FLAGS.dry_run_hbm_gib if FLAGS["dry_run_hbm_gib"].present else None,
            )
        except TrainerError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(report.format())
        return 0
    if resolved.config.mesh.num_slices > 1 and "MELTEMI_SLICE_INDEX" not in os.environ:
        from meltemi.levanter.trainer import launch_multislice

        return launch_multislice(resolved)
    from meltemi.levanter.trainer import PREEMPTED_EXIT_CODE, BuildError, train

    try:
        result = train(resolved)
    except BuildError as e:  # a data/model/optimizer setting: the message names the key
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(result.summary, flush=True)
    return PREEMPTED_EXIT_CODE if result.preempted else 0


def run() -> None:
    """Entry point: defines the flags and runs `main`."""
    from absl import app

    define_flags()
    app.run(lambda argv: sys.exit(main(argv)), flags_parser=_parse)


if __name__ == "__main__":
    run()
