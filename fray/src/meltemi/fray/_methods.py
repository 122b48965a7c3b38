"""What an actor exposes, and how one call is run on the actor's side.

Shared by every backend: the method table (public methods, which are idempotent), the
invocation (sync or async methods, exceptions turned into text tracebacks), per-actor call
statistics and the request-id deduplication that makes retries of idempotent methods safe.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import pickle
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from meltemi.fray._errors import RemoteError

__all__ = ["Dispatcher", "MethodInfo", "idempotent", "method_table"]

_DEDUP_KEEP = 4096


def idempotent(fn: Callable | None = None, *, retries: int = 3):
    """Marks an actor method as safe to run more than once.

    Calls to idempotent methods are retried (up to `retries` times, with the same request id)
    when the actor dies and is restarted, restarts, or the call times out. The actor remembers
    the request ids it has served, so a retry that reaches the incarnation that already ran
    the call gets the recorded result instead of running it again. Other methods are called
    at most once.

    Example:
        >>> class Store:
        ...     @idempotent
        ...     def get(self, key):
        ...         return key
        >>> method_table(Store)["get"].idempotent
        True
    """

    def mark(f):
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"idempotent(retries=...) must be an int >= 0, got {retries!r}")
        f.__fray_idempotent__ = retries
        return f

    return mark if fn is None else mark(fn)


@dataclasses.dataclass(frozen=True)
class MethodInfo:
    """One public method of an actor class."""

    name: str
    idempotent: bool
    retries: int
    is_async: bool


def method_table(cls: type) -> dict[str, MethodInfo]:
    """The public methods (no leading underscore) that handles to `cls` may call."""
    table = {}
    for name in dir(cls):
        if name.startswith("_"):
            continue
        attr = inspect.getattr_static(cls, name)
        if isinstance(attr, (staticmethod, classmethod)):
            attr = attr.__func__
        if not callable(attr) or isinstance(attr, type):
            continue
        retries = getattr(attr, "__fray_idempotent__", None)
        table[name] = MethodInfo(
            name=name,
            idempotent=retries is not None,
            retries=retries or 0,
            is_async=inspect.iscoroutinefunction(attr),
        )
    return table


def error_info(exc: BaseException) -> tuple[str, str, str, bytes | None]:
    """(type name, message, traceback text, pickled exception or None).

    Never raises: an exception whose `__str__` (or pickling) raises is still reported, by its
    type name and traceback, so a badly written exception class cannot kill the actor.
    """
    kind = type(exc)
    type_name = kind.__qualname__
    if kind.__module__ not in ("builtins", "__main__"):
        type_name = f"{kind.__module__}.{type_name}"
    try:
        message = str(exc)
    except BaseException as e:  # user code: anything may come out of __str__
        message = f"<str() of the exception raised {type(e).__name__}>"
    try:
        text = "".join(traceback.format_exception(exc))
    except BaseException:  # formatting calls __str__ too
        frames = "".join(traceback.format_tb(exc.__traceback__))
        text = f"Traceback (most recent call last):\n{frames}{type_name}: {message}\n"
    try:
        blob = pickle.dumps(exc, protocol=5)
        pickle.loads(blob)  # refuse exceptions that do not round-trip
    except BaseException:  # __reduce__ of user code
        blob = None
    return type_name, message, text, blob


def remote_error(name: str, method: str, info: tuple) -> RemoteError:
    type_name, message, text, blob = info
    cause = None
    if blob is not None:
        try:
            cause = pickle.loads(blob)
        except Exception:
            cause = None
    return RemoteError(name, method, type_name, message, text, cause)


class _Stats:
    __slots__ = ("calls", "errors", "latencies_us", "lock")

    def __init__(self):
        self.calls = 0
        self.errors = 0
        self.latencies_us: collections.deque = collections.deque(maxlen=2048)
        self.lock = threading.Lock()

    def snapshot(self) -> dict[str, float]:
        with self.lock:
            lat = sorted(self.latencies_us)
        pick = lambda q: float(lat[min(len(lat) - 1, int(q * len(lat)))]) if lat else 0.0
        return {
            "calls": self.calls,
            "errors": self.errors,
            "p50_us": pick(0.5),
            "p99_us": pick(0.99),
        }


class Dispatcher:
    """Runs calls on one actor instance; thread-safe.

    Example:
        >>> class Adder:
        ...     def add(self, a, b):
        ...         return a + b
        >>> d = Dispatcher(Adder(), "adder")
        >>> d.invoke("add", (2, 3), {})
        (True, 5)
    """

    def __init__(self, instance: Any, name: str):
        self.instance = instance
        self.name = name
        self.methods = method_table(type(instance))
        self.stats = _Stats()
        self._aio = None  # an asyncio loop thread, started by the first async method
        self._lock = threading.Lock()
        self._done: collections.OrderedDict = collections.OrderedDict()
        self._running: dict[Any, list] = {}

    def invoke(self, method: str, args: tuple, kwargs: dict) -> tuple[bool, Any]:
        """Runs one call: (True, value) or (False, error_info). SystemExit propagates."""
        info = self.methods.get(method)
        if info is None:
            exc = AttributeError(
                f"actor {self.name!r} ({type(self.instance).__name__}) has no public method "
                f"{method!r}"
            )
            return False, error_info(exc)
        try:
            value = getattr(self.instance, method)(*args, **kwargs)
            if info.is_async or inspect.isawaitable(value):
                value = self._run_coroutine(value)
            return True, value
        except SystemExit:
            raise
        except BaseException as e:
            return False, error_info(e)

    def _run_coroutine(self, coro) -> Any:
        import asyncio  # ~20 ms to import: only actors with async methods pay for it

        with self._lock:
            if self._aio is None:
                self._aio = asyncio.new_event_loop()
                threading.Thread(
                    target=self._aio.run_forever, name=f"fray-aio-{self.name}", daemon=True
                ).start()
        return asyncio.run_coroutine_threadsafe(_as_coroutine(coro), self._aio).result()

    def record(self, ok: bool, started: float) -> None:
        stats = self.stats
        with stats.lock:
            stats.calls += 1
            stats.errors += not ok
            stats.latencies_us.append((time.perf_counter() - started) * 1e6)

    # -- deduplication of idempotent requests ------------------------------------------
    def dedup_begin(self, key: Any, respond: Callable[[Any], None]) -> bool:
        """True when the caller should run request `key`.

        `respond(reply)` is called with the reply of `key`: at once if it is recorded, else
        when the request that runs it calls `dedup_finish`.
        """
        with self._lock:
            if key in self._done:
                reply = self._done[key]
            elif key in self._running:
                self._running[key].append(respond)
                return False
            else:
                self._running[key] = [respond]
                return True
        respond(reply)
        return False

    def dedup_finish(self, key: Any, reply: Any) -> None:
        """Records the reply of request `key` and sends it to requests that waited for it."""
        with self._lock:
            waiters = self._running.pop(key, [])
            self._done[key] = reply
            while len(self._done) > _DEDUP_KEEP:
                self._done.popitem(last=False)
        for respond in waiters:
            respond(reply)


async def _as_coroutine(awaitable):
    return await awaitable
