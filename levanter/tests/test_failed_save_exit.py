"""A failed asynchronous save ends the process promptly, with one error line.

Orbax's commit threads of a failed save wait for a signal that never comes (for its 300 s
coordination timeout) and, being non-daemon threads, used to keep the trainer alive after
`main` returned; `Checkpointer` now releases them on the error path.
"""

import threading
import time

import _subprocess
import jax.numpy as jnp
import pytest
from _one_error import one_error_line

from meltemi.levanter.checkpoint import Checkpointer, CheckpointError


def _orbax_waiters():
    return [t for t in threading.enumerate() if type(t).__name__ == "_SignalingThread"]


def _block(checkpoints, step):
    """A dangling symlink where orbax creates the step's temporary directory: orbax does not
    see it as a leftover to remove (it does not exist), and creating the directory fails."""
    (checkpoints / f"step_{step:08d}.orbax-checkpoint-tmp").symlink_to(checkpoints / "nowhere")


def test_a_failed_save_leaves_no_orbax_thread_waiting(tmp_path):
    ckpt = Checkpointer(tmp_path / "ckpt")
    _block(tmp_path / "ckpt", 4)
    with pytest.raises(CheckpointError, match=r"^saving the checkpoint of step 4 .* failed"):
        ckpt.save(4, {"w": jnp.arange(3.0)}, config_json="{}")
        ckpt.wait()
    ckpt.close()
    deadline = time.monotonic() + 20
    while _orbax_waiters() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _orbax_waiters()


def test_the_binary_exits_promptly_and_nonzero_after_a_failed_save(tmp_path):
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    _block(checkpoints, 1)
    start = time.monotonic()
    # Before the fix the process outlived `main` by orbax's 300 s timeout: this timeout is
    # far below it and far above a two-step run.
    proc = _subprocess.run(tmp_path / "run", tmp_path / "cache", "--config.eval.num_batches=0",
                           timeout=240)  # fmt: skip
    assert proc.returncode == 74, proc.stderr[-3000:]  # an I/O failure (EX_IOERR), not a usage one
    line = one_error_line(proc.stderr)
    assert line.startswith("error: I/O failure: saving the checkpoint of step 1"), line
    assert time.monotonic() - start < 240
