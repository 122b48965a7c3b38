"""Preemption: SIGTERM becomes a flag the loop reads after every step; all processes agree."""

from __future__ import annotations

import signal
import threading

import jax
import numpy as np
from jax.experimental import multihost_utils

from meltemi.levanter import _exit

#: Exit status of a run stopped by SIGTERM after saving its checkpoint: "try again later"
#: (the table of every status: `meltemi.levanter._exit`).
PREEMPTED_EXIT_CODE = _exit.PREEMPTED

# Set by SIGTERM. A process whose training runs outside the main thread (a fray actor)
# installs the handler from its main thread with `install_sigterm_handler()`.
_SIGTERM = threading.Event()


def install_sigterm_handler() -> bool:
    """Makes SIGTERM request a checkpoint-and-stop; True if installed (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, lambda signum, frame: _SIGTERM.set())
    return True


class Preemption:
    """A context in which SIGTERM sets a flag instead of killing the process."""

    def __init__(self):
        self._previous = None

    def __enter__(self) -> Preemption:
        _SIGTERM.clear()
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, lambda signum, frame: _SIGTERM.set())
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    @property
    def requested(self) -> bool:
        return _SIGTERM.is_set()

    def agreed(self) -> bool:
        """Whether any process was asked to stop (all processes must stop at the same step)."""
        if jax.process_count() == 1:
            return self.requested
        flags = multihost_utils.process_allgather(np.int32(self.requested))
        return bool(np.max(flags))
