"""Where build work runs: inline, on fray actors (the default for several workers), or in a
plain process pool.

The build only needs `map_unordered(fn, items)`: results come back as they finish, so the
caller can record each one in the ledger at once.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from meltemi.data._fray import FrayExecutor

__all__ = ["Executor", "FrayExecutor", "InlineExecutor", "ProcessExecutor", "make_executor"]


class Executor(Protocol):
    """Runs `fn(item)` for each item; yields results in completion order."""

    def map_unordered(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]: ...


class InlineExecutor:
    """Runs everything in the calling process (deterministic, easy to debug).

    >>> list(InlineExecutor().map_unordered(abs, [-1, 2]))
    [1, 2]
    """

    def map_unordered(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        for item in items:
            yield fn(item)


class ProcessExecutor:
    """A pool of `workers` local processes (spawned, so no state leaks from the parent)."""

    def __init__(self, workers: int):
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"ProcessExecutor(workers={workers!r}): need an int >= 1")
        self.workers = workers

    def map_unordered(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        ctx = multiprocessing.get_context("spawn")
        error: BaseException | None = None
        with cf.ProcessPoolExecutor(self.workers, mp_context=ctx) as pool:
            futures = [pool.submit(fn, item) for item in items]
            try:
                for fut in cf.as_completed(futures):
                    if fut.cancelled():
                        continue
                    try:
                        result = fut.result()
                    except Exception as e:  # finish what runs, start nothing new, then raise
                        error = error or e
                        for other in futures:
                            other.cancel()
                        continue
                    yield result
            finally:
                for fut in futures:
                    fut.cancel()
        if error is not None:
            raise error


def make_executor(workers: int) -> Executor:
    """`InlineExecutor()` for one worker, else `FrayExecutor(workers)` (a fray LocalCluster)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers={workers!r}: need an int >= 1 (1 builds in this process)")
    if workers == 1:
        return InlineExecutor()
    return FrayExecutor(workers)
