r"""The trainer binary.

    ./bazelw run //levanter:train -- --config=levanter/configs/default.py
    ./bazelw run //levanter:train -- --config=levanter/configs/default.py:smoke \
        --config.trainer.seed=3 --print_config
    ./bazelw run //levanter:train -- --config=levanter/configs/marin_32b.py --dry_run

Exit status (one `error: ...` line on stderr for 2 and 74, never a traceback):

    0   the run finished
    2   a mistake in the flags or the config (also an exception in the config file's own
        code, named by file:line) or a checkpoint that does not fit the config
    74  an I/O failure: a full disk, a run directory that cannot be written (EX_IOERR); free
        space or fix the directory, then run the same command again to resume
    75  SIGTERM stopped the run after saving a checkpoint, or a multislice job fell below
        mesh.min_slices (EX_TEMPFAIL): run the same command again to resume
    1   a bug: a traceback
"""

from __future__ import annotations

import atexit
import os
import socket
from collections.abc import Sequence

from absl import flags

from meltemi.levanter.config import resolve_run_dir
from meltemi.levanter.main import _flags
from meltemi.levanter.main._hooks import training_hooks
from meltemi.levanter.multislice import launch_multislice
from meltemi.levanter.trainer import PREEMPTED_EXIT_CODE, Trainer, display_path, dry_run

_RESOLVED: dict = {}


def define_flags() -> None:
    """Registers the binary's flags (called only when it runs)."""
    _flags.define_config_flags(
        what="Config",
        dry_run_help="Lower and compile the train step on a virtual mesh; print memory and "
        "FLOPs; exit.",
        devices_help="Virtual CPU devices for --dry_run (0: mesh.* decides, min 1).",
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
    flags.DEFINE_integer(
        "dashboard_port",
        0,
        "Serve the run dashboard (//levanter:dashboard) on http://127.0.0.1:PORT/ while the run "
        "trains, over the folder holding the run directory; 0: off.",
    )


def _parse(argv: list[str]) -> list[str]:
    return _flags.parse(argv, _RESOLVED, example="levanter/configs/default.py")


def main(argv: Sequence[str]) -> int:
    """Runs the binary; returns its exit status (the module docstring's table)."""
    del argv
    return _flags.run_config(_RESOLVED["config"], _train)


def _train(spec) -> int:
    FLAGS = flags.FLAGS  # noqa: N806
    if FLAGS.dry_run:
        report = dry_run(
            spec, num_devices=FLAGS.dry_run_devices or None, hbm_gib=_flags.dry_run_hbm_gib()
        )
        print(report.format())
        return 0
    if FLAGS.dashboard_port and "MELTEMI_SLICE_INDEX" not in os.environ:
        _start_dashboard(spec.run_dir, FLAGS.dashboard_port)
    if spec.mesh.num_slices > 1 and "MELTEMI_SLICE_INDEX" not in os.environ:
        # A slice's error: one line and its status too. Each slice builds its own hooks.
        return launch_multislice(spec, hooks=training_hooks)
    trainer = Trainer(spec, hooks=training_hooks(spec))
    result = trainer.run()
    if FLAGS.export_hf and not result.preempted:
        directory = resolve_run_dir("", FLAGS.export_hf)  # relative to the user's cwd
        trainer.export_hf(directory)
        result.summary += f"\n  Hugging Face export: {display_path(directory)}"
    if FLAGS.export_peft and not result.preempted:
        directory = resolve_run_dir("", FLAGS.export_peft)
        trainer.export_peft(directory)
        result.summary += f"\n  PEFT adapter export: {display_path(directory)}"
    print(result.summary, flush=True)
    return PREEMPTED_EXIT_CODE if result.preempted else 0


def _start_dashboard(run_dir: object, port: int):
    """The dashboard over the run's parent folder, in a daemon thread of this process."""
    try:  # the `dashboard` extra (FastAPI, uvicorn): training itself never needs it
        from meltemi.levanter.dashboard import DashboardServer, free_port
    except ImportError as e:
        _flags.fail(
            f"--dashboard_port={port}: the dashboard needs {e.name!r} (pip install "
            "'meltemi-levanter[dashboard]'); or drop --dashboard_port."
        )
    folder = os.path.dirname(str(run_dir).rstrip("/"))
    if "://" not in folder:
        os.makedirs(folder, exist_ok=True)
    try:
        socket.create_server(("127.0.0.1", port)).close()
    except OSError as e:
        _flags.fail(
            f"--dashboard_port={port}: cannot listen there ({os.strerror(e.errno)}); pick another "
            f"port, e.g. --dashboard_port={free_port()}, or 0 for no dashboard."
        )
    server = DashboardServer(folder, port=port)
    print(f"dashboard: {server.start()} (the runs in {folder})", flush=True)
    # Stopped before the interpreter finalises: a uvicorn thread still running then can abort
    # the process (`PyGILState_Release`, exit -6) after a finished run.
    atexit.register(server.stop)
    return server


def run() -> None:
    """Entry point: defines the flags and runs `main`."""
    _flags.run(define_flags, main, _parse)


if __name__ == "__main__":
    run()
