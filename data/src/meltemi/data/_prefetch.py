"""A background prefetcher: computes `fn(step)` for upcoming steps in a thread, k ahead."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["Prefetcher"]

_DONE = object()


class Prefetcher:
    """Iterates `(step, transform(fn(step)))` over `steps`, keeping `depth` results ready.

    Work happens in one daemon thread (numpy and tensorstore release the GIL while they read
    and copy). An exception raised by `fn`, or by the `steps` iterator, is re-raised by the
    iterator where it happened. Use it as a context manager, or call `close()` (from any
    thread: a consumer waiting for the next result then stops), to stop the thread early.

    >>> with Prefetcher(lambda s: s * s, range(4), depth=2) as p:
    ...     list(p)
    [(0, 0), (1, 1), (2, 4), (3, 9)]
    """

    def __init__(
        self,
        fn: Callable[[int], Any],
        steps: Iterable[int],
        *,
        depth: int = 2,
        transform: Callable[[Any], Any] | None = None,
    ):
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"Prefetcher(depth={depth!r}): need an int >= 1, e.g. depth=2")
        self._fn = fn
        self._transform = transform or (lambda x: x)
        self._steps = iter(steps)
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="meltemi-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    step = next(self._steps)
                except StopIteration:
                    return
                except BaseException as e:  # the steps iterator itself failed: re-raise it
                    self._put((None, None, e))
                    return
                try:
                    item = (step, self._transform(self._fn(step)), None)
                except BaseException as e:  # re-raised in the consumer thread
                    self._put((step, None, e))
                    return
                if not self._put(item):
                    return
        finally:
            self._put(_DONE)

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        while True:
            item = self._queue.get()
            if item is _DONE:
                return
            step, value, error = item
            if error is not None:
                self.close()
                raise error
            yield step, value

    def close(self) -> None:
        """Stops the worker thread (pending results are dropped) and ends the iteration."""
        self._stop.set()
        self._thread.join(timeout=5)
        while True:  # drop pending results, then leave the end marker for a waiting consumer
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._queue.put_nowait(_DONE)

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
