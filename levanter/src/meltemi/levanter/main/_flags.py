"""Command-line parsing shared by the binaries (`train`, `rl`, `isoflop`, `eval`, `harness`).

Every binary reads `--config=path/to/file.py[:variant]` the same way: the path is taken relative
to the directory the user ran the command from (not bazel's runfiles tree), the config is loaded
with its `--config.section.key=value` overrides before absl parses the other flags, and a mistake
in either is one `error: ...` line on stderr and exit status 2, never a traceback.

Exit statuses (one table for every binary, `meltemi.levanter._exit`): 0 done; 1 a bug (a
traceback) or, for isoflop, failed runs; 2 a mistake in the flags or the config, including an
exception raised by the config file's own code (`error: file.py:LINE: ...`); 74 an I/O failure
(a full disk, a run directory that cannot be written: `error: I/O failure ...`); 75 preempted
(SIGTERM after saving) or fewer than `mesh.min_slices` slices: run the same command again.

Example:
    >>> config_arg(["train", "--config=levanter/configs/default.py:smoke", "--dry_run"])
    'levanter/configs/default.py:smoke'
    >>> config_arg(["eval", "--checkpoint=runs/a"]) is None
    True
"""

from __future__ import annotations

import os
import pathlib
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from meltemi.levanter import _exit
from meltemi.levanter.config import (
    ConfigError,
    RunSpec,
    load_config,
    parse_override_args,
    resolve,
    resolve_path,
    resolve_run_dir,
)

USAGE_EXIT_CODE = _exit.USAGE
IO_ERROR_EXIT_CODE = _exit.IO_ERROR
_HELP = ("--help", "-help", "-h", "-?", "--helpfull", "--helpshort")


def fail(message: str) -> NoReturn:
    """Prints `error: message` to stderr and exits with status 2 (a usage or config mistake)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(USAGE_EXIT_CODE)


def report(error: Exception, run_dir: object = None) -> int | None:
    """Prints a usage or I/O `error` as one `error: ...` line and returns its exit status.

    Returns None for any other error (a bug): the caller re-raises it, so it keeps its
    traceback. `run_dir` is named in an I/O failure's line.

    Example:
        >>> import errno
        >>> report(OSError(errno.ENOSPC, "No space left on device"), run_dir="runs/a")
        74
        >>> report(KeyError("a bug")) is None
        True
    """
    status = _exit.exit_status(error)
    if status not in (USAGE_EXIT_CODE, IO_ERROR_EXIT_CODE):
        return None
    print(f"error: {_exit.error_line(error, run_dir)}", file=sys.stderr, flush=True)
    return status


def user_path(text: str) -> str:
    """`text` relative to the directory the user ran the command from (not bazel's runfiles)."""
    path = pathlib.Path(text).expanduser()
    if text and not path.is_absolute():
        path = pathlib.Path(os.environ.get("BUILD_WORKING_DIRECTORY") or os.getcwd()) / path
    return str(path) if text else text


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


def absolute_config(spec: str) -> str:
    """`path.py[:variant]` with the path made absolute against the user's directory."""
    path, sep, variant = spec.partition(".py:")
    path = path + ".py" if sep else spec
    return str(resolve_path(path)) + (":" + variant if sep else "")


def _normalise(argv: Sequence[str]) -> list[str]:
    # `--config PATH` becomes `--config=ABSOLUTE`: absl loads config files relative to the cwd,
    # which under `bazel run` is the runfiles tree, not the directory the user meant.
    out: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("--config", "-config") and i + 1 < len(args):
            arg, i = "--config=" + args[i + 1], i + 1
        elif arg.startswith("-config="):
            arg = "-" + arg
        if arg.startswith("--config="):
            arg = "--config=" + absolute_config(arg[len("--config=") :])
        out.append(arg)
        i += 1
    return out


def parse(
    argv: Sequence[str],
    state: dict,
    *,
    example: str | None = None,
    keep_overrides: bool = True,
    flag_values: flags.FlagValues = flags.FLAGS,
) -> list[str]:
    """Loads `--config` (with its overrides) into `state["config"]`, then parses absl's flags.

    Args:
      argv: the command line, program name first.
      state: where the loaded config goes (`state["config"]`, left unset without `--config`).
      example: when given, `--config` is required and a missing one is an error naming this
        example config path.
      keep_overrides: pass the `--config.*` overrides on to absl too (for binaries whose
        `--config` flag is an `ml_collections` config-file flag); False drops them (for a
        plain string `--config` flag).
      flag_values: the absl flags to parse into (the global `flags.FLAGS` by default).

    Returns:
      The arguments absl left over (program name first). Exits with status 2 on a mistake.
    """
    argv = _normalise(argv)
    spec = config_arg(argv)
    wants_help = any(a.split("=")[0] in _HELP for a in argv[1:])
    if spec is None and example is not None and not wants_help:  # --help: absl prints the doc
        fail(f"pass a config, e.g. --config={example}")
    if spec is not None:
        try:
            state["config"] = load_config(spec, parse_override_args(argv))
        except ConfigError as e:
            fail(str(e))
    if not keep_overrides:
        argv = [a for a in argv if not a.startswith("--config.")]
    try:
        return flag_values(argv)
    except flags.Error as e:
        fail(str(e))


def run(
    define_flags: Callable[[], None],
    main: Callable[[list[str]], int],
    flags_parser: Callable[[list[str]], list[str]],
) -> None:
    """Defines a binary's flags, parses the command line and exits with `main`'s status."""
    define_flags()
    app.run(lambda argv: sys.exit(main(argv)), flags_parser=flags_parser)


def define_config_flags(*, what: str, dry_run_help: str, devices_help: str) -> None:
    """The flags of the binaries that run a config file (`train`, `rl`): `--config` (`what`
    names the file's kind), `--print_config`, `--dry_run` and its `--dry_run_devices` and
    `--dry_run_hbm_gib`."""
    config_flags.DEFINE_config_file(
        "config",
        None,
        f"{what} file and variant: path/to/config.py[:variant]; override fields with "
        "--config.section.key=value.",
        lock_config=True,
    )
    flags.DEFINE_bool("print_config", False, "Print the resolved config with provenance; exit.")
    flags.DEFINE_bool("dry_run", False, dry_run_help)
    flags.DEFINE_integer("dry_run_devices", 0, devices_help)
    flags.DEFINE_float(
        "dry_run_hbm_gib",
        0.0,
        "Device memory (GiB per device) --dry_run checks the total against, e.g. 95 (TPU v5p).",
    )


def dry_run_hbm_gib() -> float | None:
    """`--dry_run_hbm_gib` when given on the command line, else None (no memory check)."""
    return flags.FLAGS.dry_run_hbm_gib if flags.FLAGS["dry_run_hbm_gib"].present else None


def run_config(resolved, body: Callable[[RunSpec], int]) -> int:
    """A config binary's `main` around `body(spec)`: absl logging at WARNING unless
    `--verbosity` is given (orbax logs every file it renames at INFO; the progress bar is the
    run's voice), `--print_config` (the config with provenance and the run directory), the
    config resolved with every check before any data, model or mesh work, and a usage or I/O
    error reported as one line with its exit status (a bug raises: a traceback, status 1).

    Args:
      resolved: the loaded config (`parse`'s `state["config"]`).
      body: runs the binary on the resolved spec; returns the exit status.
    """
    if not flags.FLAGS["verbosity"].present:
        absl_logging.set_verbosity(absl_logging.WARNING)
    try:
        if flags.FLAGS.print_config:
            print(resolved.format())
            config = resolved.config
            print(f"# run_dir resolves to {resolve_run_dir(config.name, config.run_dir)}")
            return 0
        return body(resolve(resolved))
    except Exception as e:  # a usage or I/O error is one line and its status; a bug raises
        status = report(e, run_dir=_run_dir(resolved))
        if status is None:
            raise
        return status


def _run_dir(resolved) -> object:
    """The run directory an I/O failure is reported under (None if it does not resolve)."""
    try:
        return resolve_run_dir(resolved.config.name, resolved.config.run_dir)
    except ConfigError:
        return None
