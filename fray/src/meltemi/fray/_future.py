"""The result of a call in flight: `Future`.

One lock per future and no thread per call: the thread that completes a call (a backend's
I/O or executor thread) releases the lock, the waiting thread acquires it. Replies arrive
encoded and are decoded in the thread that asks for the value, so a slow unpickle never stalls
the I/O thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from meltemi.fray._config import check_timeout
from meltemi.fray._errors import ActorDied, ActorRestarted, CallTimeout, ConnectionLost, FrayError
from meltemi.fray._loop import IOLoop

__all__ = ["Future", "wait_all"]

_PENDING, _RAW, _VALUE, _ERROR = range(4)


class Future:
    """The eventual result of `handle.method.remote(...)`.

    `result()` blocks until the call finishes or its deadline passes. Methods marked
    `idempotent` are retried there (same request id, deduplicated by the actor) when their
    actor died or restarted.

    Example:
        >>> from meltemi.fray import InProcessCluster
        >>> class Doubler:
        ...     def double(self, x):
        ...         return 2 * x
        >>> with InProcessCluster() as cluster:
        ...     future = cluster.spawn(Doubler).double.remote(21)
        ...     future.result(), future.done()
        (42, True)
    """

    __slots__ = (
        "_lock",
        "_state",
        "_value",
        "_decoder",
        "_callbacks",
        "_mutex",
        "_name",
        "_method",
        "_deadline",
        "_timeout",
        "_resolver",
        "_retry",
        "_on_expire",
        "__weakref__",
    )

    def __init__(
        self,
        name: str,
        method: str,
        deadline: float | None,
        timeout: float | None = None,
    ):
        self._lock = threading.Lock()
        self._lock.acquire()
        self._state = _PENDING
        self._value: Any = None
        self._decoder: Callable[[Any], Any] | None = None
        self._callbacks: list | None = None
        self._mutex = threading.Lock()
        self._name = name
        self._method = method
        self._deadline = deadline  # absolute time.monotonic()
        self._timeout = timeout
        self._resolver: Callable[[ConnectionLost], FrayError] | None = None
        self._retry: Callable[[], Future] | None = None
        self._on_expire: Callable[[], None] | None = None

    # -- completion (called by backends) -------------------------------------------------
    def _complete(self, state: int, value: Any, decoder=None) -> bool:
        with self._mutex:
            if self._state != _PENDING:
                return False
            self._state, self._value, self._decoder = state, value, decoder
            callbacks, self._callbacks = self._callbacks, None
        self._lock.release()
        if callbacks:
            for cb in callbacks:
                cb(self)
        return True

    def _set_value(self, value: Any) -> bool:
        return self._complete(_VALUE, value)

    def _set_error(self, error: BaseException) -> bool:
        return self._complete(_ERROR, error)

    def _set_raw(self, raw: Any, decoder: Callable[[Any], Any]) -> bool:
        """Completes with an encoded reply; `decoder(raw)` returns the value or raises."""
        return self._complete(_RAW, raw, decoder)

    def _expire(self) -> None:
        if self._complete(_ERROR, CallTimeout(self._name, self._method, self._timeout or 0.0)):
            if self._on_expire is not None:
                self._on_expire()

    # -- consumer API --------------------------------------------------------------------
    def done(self) -> bool:
        """Whether the call has finished (successfully or not)."""
        return self._state != _PENDING

    def _wait(self, timeout: float | None) -> bool:
        if self._state != _PENDING:
            return True
        limit = None
        if self._deadline is not None:
            limit = max(0.0, self._deadline - time.monotonic())
        if timeout is not None:
            limit = timeout if limit is None else min(limit, timeout)
        if self._lock.acquire(timeout=-1 if limit is None else limit):
            self._lock.release()
            return True
        if self._deadline is not None and time.monotonic() >= self._deadline:
            self._expire()
            return True
        return False

    def _outcome(self) -> Any:
        """Returns the value or raises, decoding once; the future must be done."""
        with self._mutex:
            if self._state == _RAW:
                try:
                    self._value = self._decoder(self._value)
                    self._state = _VALUE
                except BaseException as e:  # the decoder raises the remote failure
                    self._value, self._state = e, _ERROR
                self._decoder = None
            if self._state == _ERROR and isinstance(self._value, ConnectionLost):
                if self._resolver is not None:
                    self._value = self._resolver(self._value)
            state, value = self._state, self._value
        if state == _ERROR:
            raise value
        return value

    def result(self, timeout: float | None = None) -> Any:
        """Waits for the call and returns its value or raises its failure.

        Args:
            timeout: seconds to wait at most; None (or inf) waits until the call's own
                deadline.

        Raises:
            CallTimeout: the call's deadline passed.
            TimeoutError: `timeout` passed first (the call goes on; ask again later).
            RemoteError, ActorDied, ActorRestarted: see their docs.
        """
        timeout = check_timeout(f"{self._name}.{self._method}().result(timeout", timeout,
                                allow_zero=True)  # fmt: skip
        if not self._wait(timeout):
            raise TimeoutError(
                f"{self._name}.{self._method}() still running after result(timeout={timeout})"
            )
        try:
            return self._outcome()
        except FrayError as e:
            retry = self._retry
            if retry is None or not _retryable(e):
                raise
            return retry().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Waits like `result` and returns the failure, or None on success."""
        try:
            self.result(timeout)
        except TimeoutError as e:
            if not isinstance(e, CallTimeout):
                raise
            return e
        except BaseException as e:
            return e
        return None

    def add_done_callback(self, fn: Callable[[Future], None]) -> None:
        """Calls `fn(self)` once the call finishes (at once if it has).

        The callback runs in a backend thread: keep it short and non-blocking. The call's
        deadline is enforced by a timer, so a callback always fires.
        """
        with self._mutex:
            if self._state == _PENDING:
                if self._callbacks is None:
                    self._callbacks = []
                    if self._deadline is not None:
                        IOLoop.get().call_at(self._deadline, self._expire)
                self._callbacks.append(fn)
                return
        fn(self)

    def __await__(self):
        return self._as_asyncio().__await__()

    async def _as_asyncio(self) -> Any:
        import asyncio  # ~20 ms to import: only asyncio callers pay for it

        loop = asyncio.get_running_loop()
        waiter = loop.create_future()

        def transfer(_):
            loop.call_soon_threadsafe(lambda: waiter.done() or waiter.set_result(None))

        self.add_done_callback(transfer)
        await waiter
        # Decoding, resolving a lost connection or retrying may block: keep them off the loop
        # unless the value is already plain.
        if self._state == _VALUE:
            return self._value
        return await loop.run_in_executor(None, self.result)

    def __repr__(self) -> str:
        state = ("pending", "done", "done", "failed")[self._state]
        return f"<fray.Future {self._name}.{self._method}() {state}>"


def _retryable(error: FrayError) -> bool:
    if isinstance(error, ActorDied):
        return error.will_restart
    return isinstance(error, (ActorRestarted, CallTimeout, ConnectionLost))


def wait_all(futures: list[Future], timeout: float | None = None) -> list[Any]:
    """Returns the results of `futures` in order, raising the first failure.

    Example:
        >>> from meltemi.fray import InProcessCluster
        >>> class Doubler:
        ...     def double(self, x):
        ...         return 2 * x
        >>> with InProcessCluster() as cluster:
        ...     doubler = cluster.spawn(Doubler)
        ...     wait_all([doubler.double.remote(i) for i in range(3)])
        [0, 2, 4]
    """
    timeout = check_timeout("wait_all(timeout", timeout, allow_zero=True)
    end = None if timeout is None else time.monotonic() + timeout
    out = []
    for f in futures:
        left = None if end is None else max(0.0, end - time.monotonic())
        out.append(f.result(left))
    return out
