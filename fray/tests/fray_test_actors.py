"""Actor classes shared by the fray tests (importable by actor processes too)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time

from meltemi import fray


class Counter:
    """Holds a list and a counter; the workhorse of the call tests."""

    def __init__(self, start: int = 0):
        self.n = start
        self.items: list = []
        self.active = 0
        self.peak = 0
        self.lock = threading.Lock()

    def add(self, k: int = 1) -> int:
        self.n += k
        return self.n

    def value(self) -> int:
        return self.n

    def append(self, x) -> None:
        self.items.append(x)

    def get_items(self) -> list:
        return list(self.items)

    def echo(self, x):
        return x

    def noop(self) -> None:
        return None

    def zero_first(self, array):
        array[0] = 0
        return array

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    def busy(self, seconds: float) -> int:
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        time.sleep(seconds)
        with self.lock:
            self.active -= 1
        return self.peak

    def get_peak(self) -> int:
        return self.peak

    def fail(self, message: str) -> None:
        raise ValueError(message)

    def fail_unprintably(self) -> None:
        raise UnprintableError()

    def blob(self, n: int) -> bytes:
        return b"x" * n

    def size_of(self, value) -> int:
        return len(value)

    @fray.idempotent
    def slow_add(self, k: int, seconds: float) -> int:
        time.sleep(seconds)
        self.n += k
        return self.n

    @fray.idempotent
    def add_idempotent(self, k: int) -> int:
        self.n += k
        return self.n

    async def async_double(self, x: int) -> int:
        await asyncio.sleep(0.001)
        return 2 * x

    def context(self) -> tuple:
        ctx = fray.actor_context()
        return (ctx.name, ctx.rank, ctx.group_size, ctx.group, ctx.epoch, ctx.backend)

    def port(self) -> int:
        return fray.free_port()

    def pid(self) -> int:
        return os.getpid()

    def exit(self, code, last_words: str = "") -> None:
        if last_words:
            print(last_words, file=sys.stderr, flush=True)
        sys.exit(code)

    def kill_self(self, signum: int) -> None:
        os.kill(os.getpid(), signum)
        time.sleep(10)

    def fork_then_exit(self, code: int) -> None:
        if os.fork() == 0:  # the child keeps every inherited descriptor open for a while
            time.sleep(3)
            os._exit(0)
        sys.exit(code)

    def hang(self) -> None:
        os.kill(os.getpid(), signal.SIGSTOP)


class UnprintableError(Exception):
    """An exception whose `__str__` raises (and so does formatting its traceback)."""

    def __str__(self):
        raise RuntimeError("__str__ is broken too")


class CountsPickles:
    """Counts how often it is pickled in this process (each `__reduce__` is one pickling)."""

    pickled = 0

    def __init__(self, payload: bytes = b""):
        self.payload = payload

    def __reduce__(self):
        CountsPickles.pickled += 1
        return (CountsPickles, (self.payload,))

    def __len__(self) -> int:
        return len(self.payload)


class BrokenInit:
    def __init__(self, message: str):
        raise ValueError(message)

    def noop(self) -> None:
        return None
