"""Guards for the private JAX and orbax APIs that levanter reaches into.

Two behaviours have no public call (JAX 0.10, orbax-checkpoint 0.12):

- `multislice._slice_worker.write_compile_cache_from_every_rank` replaces
  `jax._src.compiler._cache_write` and calls `jax._src.compilation_cache.put_executable_and_time`,
  reading `jax._src.distributed.global_state.process_id`;
- `checkpoint._manager.release_orbax_threads` cancels and signals orbax's
  `orbax.checkpoint._src.futures.future._SignalingThread`s through their `_receive_signals` and
  `_operation_id` attributes and `future.set_signals`.

Each is bounded above in `levanter/pyproject.toml` at the tested minor version, and its exact
signature or attributes are checked before first use. On a mismatch the caller keeps the public
behaviour and `fallback` warns once per process (a `PrivateApiWarning`) naming what changed.
"""

from __future__ import annotations

import inspect
import threading
import warnings
from collections.abc import Callable

__all__ = ["PrivateApiWarning", "fallback", "parameter_names"]


class PrivateApiWarning(UserWarning):
    """A private API levanter relies on is not as tested: the public behaviour is used."""


_warned: set[str] = set()
_lock = threading.Lock()


def parameter_names(fn: Callable) -> tuple[str, ...] | None:
    """The names of `fn`'s parameters in order, or None when they cannot be read."""
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def fallback(api: str, found: str, effect: str) -> None:
    """Warns, once per process for each `api`, that the public behaviour is used instead.

    Args:
        api: the private name that is not as tested (e.g. "jax._src.compiler._cache_write").
        found: what was found instead (a signature, "missing").
        effect: the public behaviour used, and what the user loses by it.
    """
    with _lock:
        if api in _warned:
            return
        _warned.add(api)
    warnings.warn(
        f"{api} is not as tested ({found}); {effect}. Install the versions levanter is tested "
        "with (the bounds in meltemi-levanter's requirements), or report this with your "
        "jax and orbax-checkpoint versions",
        PrivateApiWarning,
        stacklevel=3,
    )
