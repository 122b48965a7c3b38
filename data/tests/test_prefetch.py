"""The background prefetcher: order, bounded look-ahead, errors, early close."""

from __future__ import annotations

import threading
import time

import pytest

from meltemi.data import Prefetcher


def test_prefetcher_yields_every_step_in_order():
    with Prefetcher(lambda s: s * 3, range(7), depth=3) as p:
        assert list(p) == [(s, s * 3) for s in range(7)]


def _wait_for(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_prefetcher_runs_exactly_depth_plus_one_steps_ahead():
    calls = []
    p = Prefetcher(lambda s: calls.append(s) or s, range(100), depth=2)
    _wait_for(lambda: len(calls) >= 3)
    time.sleep(0.2)  # and then no further
    assert calls == [0, 1, 2]  # depth queued + one computed and waiting to be queued
    it = iter(p)
    assert next(it) == (0, 0)
    _wait_for(lambda: len(calls) >= 4)
    time.sleep(0.2)
    assert calls == [0, 1, 2, 3]
    p.close()


def test_an_error_of_the_steps_iterator_is_raised_not_swallowed():
    def steps():
        yield 0
        yield 1
        raise OSError("lost the step list")

    got = []
    with pytest.raises(OSError, match="lost the step list"):
        for step, _ in Prefetcher(lambda s: s, steps()):
            got.append(step)
    assert got == [0, 1]


def test_close_from_another_thread_wakes_a_waiting_consumer():
    p = Prefetcher(lambda s: time.sleep(0.3) or s, range(10**6), depth=1)
    got, finished = [], threading.Event()

    def consume():
        for step, _ in p:
            got.append(step)
        finished.set()

    threading.Thread(target=consume, daemon=True).start()
    _wait_for(lambda: len(got) >= 1)
    p.close()
    assert finished.wait(timeout=5), "the consumer is still blocked after close()"


def test_prefetcher_reraises_the_error_of_its_step():
    def fn(step):
        if step == 2:
            raise RuntimeError("bad step 2")
        return step

    got = []
    with pytest.raises(RuntimeError, match="bad step 2"):
        for step, _ in Prefetcher(fn, range(5)):
            got.append(step)
    assert got == [0, 1]


def test_prefetcher_close_stops_the_thread():
    p = Prefetcher(lambda s: s, iter(range(10**9)), depth=1)
    next(iter(p))
    p.close()
    assert not any(t.name == "meltemi-prefetch" and t.is_alive() for t in threading.enumerate())


def test_prefetcher_applies_transform():
    with Prefetcher(lambda s: s, range(3), transform=lambda x: -x) as p:
        assert [v for _, v in p] == [0, -1, -2]


def test_prefetcher_rejects_bad_depth():
    with pytest.raises(ValueError, match=r"depth=0.*need an int >= 1"):
        Prefetcher(lambda s: s, range(3), depth=0)
