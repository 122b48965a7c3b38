"""One I/O thread per process: a selector loop that reads every fray socket and fires timers.

Writes do not go through the loop: the thread that has something to send sends it (under the
connection's send lock), so a call costs one syscall to send and one wake-up to receive.
"""

from __future__ import annotations

import heapq
import itertools
import os
import selectors
import socket
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable

__all__ = ["IOLoop"]


class IOLoop:
    """The process-wide selector loop (`IOLoop.get()`); a daemon thread started on first use.

    Example:
        >>> import threading
        >>> done = threading.Event()
        >>> IOLoop.get().call_soon(done.set)
        >>> done.wait(5)
        True
    """

    _instance: IOLoop | None = None
    _instance_lock = threading.Lock()

    @classmethod
    def get(cls) -> IOLoop:
        loop = cls._instance
        if loop is None:
            with cls._instance_lock:
                if cls._instance is None:
                    cls._instance = IOLoop()
                loop = cls._instance
        return loop

    def __init__(self):
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._drain_wake)
        self._calls: deque[Callable[[], None]] = deque()
        self._timers: list = []
        self._timer_lock = threading.Lock()
        self._seq = itertools.count()
        self._next_wake = float("inf")
        self._thread = threading.Thread(target=self._run, name="fray-io", daemon=True)
        self._thread.start()

    def in_loop(self) -> bool:
        return threading.current_thread() is self._thread

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # a wake-up is already pending (or the process is exiting)

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Runs `fn()` on the loop thread."""
        self._calls.append(fn)
        self._wake()

    def call_at(self, when: float, fn: Callable[[], None]) -> list:
        """Runs `fn()` on the loop thread at `time.monotonic() >= when`; returns a cancel token."""
        entry = [when, next(self._seq), fn]
        with self._timer_lock:
            heapq.heappush(self._timers, entry)
            wake = when < self._next_wake
        if wake:
            self._wake()
        return entry

    @staticmethod
    def cancel(entry: list) -> None:
        entry[2] = None

    def add_reader(self, sock, callback: Callable[[], None]) -> None:
        """Calls `callback()` on the loop thread whenever `sock` is readable."""
        if self.in_loop():
            self._selector.register(sock, selectors.EVENT_READ, callback)
        else:
            self.call_soon(lambda: self._selector.register(sock, selectors.EVENT_READ, callback))

    def remove_reader(self, sock) -> None:
        def remove():
            try:
                self._selector.unregister(sock)
            except (KeyError, ValueError):
                pass

        if self.in_loop():
            remove()
        else:
            self.call_soon(remove)

    def _run(self) -> None:
        select = self._selector.select
        calls = self._calls
        while True:
            with self._timer_lock:
                timeout = None
                while self._timers and self._timers[0][2] is None:
                    heapq.heappop(self._timers)
                if self._timers:
                    self._next_wake = self._timers[0][0]
                    timeout = max(0.0, self._next_wake - time.monotonic())
                else:
                    self._next_wake = float("inf")
            if calls:
                timeout = 0.0
            for key, _ in select(timeout):
                try:
                    key.data()
                except Exception:  # a broken callback must not kill the loop
                    _report(key.data)
            while calls:
                fn = calls.popleft()
                try:
                    fn()
                except Exception:
                    _report(fn)
            if self._timers:
                now = time.monotonic()
                due = []
                with self._timer_lock:
                    while self._timers and self._timers[0][0] <= now:
                        due.append(heapq.heappop(self._timers)[2])
                for fn in due:
                    if fn is not None:
                        try:
                            fn()
                        except Exception:
                            _report(fn)


def _report(fn) -> None:
    traceback.print_exc()
    print(f"fray: I/O loop callback {fn!r} failed (above); continuing", flush=True)


def _reset_after_fork() -> None:
    # A forked child has no loop thread: it must build its own on first use.
    IOLoop._instance = None
    IOLoop._instance_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)
