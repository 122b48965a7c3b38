"""The background prefetcher: order, bounded look-ahead, errors, early close."""

from __future__ import annotations

import threading
import time

import pytest

from meltemi.data import Prefetcher


def test_prefetcher_yields_every_step_in_order():
    with Prefetcher(lambda s: s * 3, range(7), depth=3) as p:
        assert list(p) == [(s, s * 3) for s in range(7)]


def test_prefetcher_keeps_at_most_depth_results_ahead():
    calls = []
    p = Prefetcher(lambda s: calls.append(s) or s, range(100), depth=2)
    time.sleep(0.2)
    # depth queued + one computed and waiting to be queued
    assert len(calls) <= 3
    p.close()


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
