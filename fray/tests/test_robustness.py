"""Actors survive what they cannot report; deadlines, names and group calls behave as stated."""

from __future__ import annotations

import math
import os
import pickle
import signal
import time

import numpy as np
import pytest
from fray_test_actors import Counter, CountsPickles

from meltemi import fray


@pytest.mark.backends("inprocess", "local")
def test_exception_whose_str_raises_is_reported_and_the_actor_keeps_serving(make_cluster):
    counter = make_cluster(call_timeout=20).spawn(Counter)
    with pytest.raises(fray.RemoteError, match=r"raised fray_test_actors\.UnprintableError") as e:
        counter.fail_unprintably()
    assert "fail_unprintably" in e.value.traceback
    assert counter.add(1) == 1  # same incarnation, still serving
    assert counter.add(1) == 2


@pytest.mark.backends("local")
def test_result_over_max_frame_bytes_names_size_and_limit_and_the_actor_lives(make_cluster):
    counter = make_cluster(max_frame_bytes=1 << 20).spawn(Counter)
    with pytest.raises(
        fray.RemoteError,
        match=r"blob\(\) returned 20971\d\d bytes, more than max_frame_bytes=1048576; return",
    ):
        counter.blob(2 << 20)
    assert counter.add(1) == 1
    assert len(counter.blob(1000)) == 1000


@pytest.mark.backends("local")
def test_remote_gives_up_sending_when_its_deadline_passes(make_cluster):
    counter = make_cluster(heartbeat_timeout_s=10).spawn(Counter)
    pid = counter.pid()
    payload = np.ones(64 << 20, dtype=np.uint8)  # far more than the socket buffers hold
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        future = counter.size_of.options(timeout=1.0).remote(payload)
        with pytest.raises(fray.CallTimeout, match=r"size_of\(\) did not finish within 1 s"):
            future.result()
        elapsed = time.monotonic() - start
    finally:
        os.kill(pid, signal.SIGCONT)
    assert elapsed < 2.5
    assert counter.add(1) == 1  # a fresh connection serves the next call


@pytest.mark.backends("inprocess", "local")
@pytest.mark.parametrize("where", ["cluster", "options"])
def test_nan_timeout_is_refused_with_the_fix(make_cluster, where):
    nan = float("nan")
    if where == "cluster":
        with pytest.raises(ValueError, match=r"Cluster\(call_timeout=nan\): must be a positive"):
            make_cluster(call_timeout=nan)
        return
    counter = make_cluster().spawn(Counter)
    with pytest.raises(ValueError, match=r"add.options\(timeout=nan\): .* use None"):
        counter.add.options(timeout=nan)


@pytest.mark.backends("inprocess", "local")
@pytest.mark.parametrize("forever", [math.inf, 1e10])
def test_infinite_or_huge_timeouts_mean_no_deadline(make_cluster, forever):
    counter = make_cluster(call_timeout=forever).spawn(Counter)
    assert counter.add(2) == 2
    assert counter.add.options(timeout=forever)(3) == 5
    future = counter.sleep.options(timeout=forever).remote(0.05)
    assert future.result(timeout=forever) == 0.05
    assert fray.wait_all([counter.value.remote()], timeout=forever) == [5]


@pytest.mark.backends("inprocess", "local")
def test_killed_actor_gives_up_its_name_and_leaves_the_listing(make_cluster):
    cluster = make_cluster()
    old = cluster.spawn(Counter, 1, name="w")
    cluster.kill(old)
    assert [r.name for r in cluster.actors()] == []
    new = cluster.spawn(Counter, 7, name="w")
    assert new.value() == 7
    assert cluster.get("w").value() == 7
    with pytest.raises(fray.ActorDied, match="killed by cluster.kill"):
        old.value()


@pytest.mark.backends("inprocess", "local")
def test_killed_group_gives_up_its_name(make_cluster):
    cluster = make_cluster()
    cluster.kill(cluster.spawn_group(Counter, 2, name="g"))
    assert cluster.actors() == []
    group = cluster.spawn_group(Counter, 3, 4, name="g")
    assert fray.wait_all(group.call("value")) == [4, 4, 4]


@pytest.mark.backends("inprocess", "local")
def test_actor_dead_for_good_gives_up_its_name(make_cluster):
    cluster = make_cluster()
    counter = cluster.spawn(Counter, name="once")
    with pytest.raises(fray.ActorDied, match="will not be restarted"):
        counter.exit(3)
    deadline = time.monotonic() + 10
    while cluster.actors()[0].state != "dead" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert cluster.spawn(Counter, 5, name="once").value() == 5


@pytest.mark.backends("inprocess", "local")
def test_pickling_a_handle_gives_advice_that_works(make_cluster):
    counter = make_cluster().spawn(Counter)
    with pytest.raises(TypeError, match=r"only in the process that made the cluster.*other.m"):
        pickle.dumps(counter)
    with pytest.raises(TypeError, match="cannot be pickled"):
        counter.echo(counter)
    assert counter.echo(counter.add(2)) == 2  # the advice: pass the result, not the handle


def test_group_call_pickles_its_arguments_once(make_cluster):
    group = make_cluster().spawn_group(Counter, 3, name="fan")
    value = CountsPickles(b"z" * 100_000)
    before = CountsPickles.pickled
    assert fray.wait_all(group.call("size_of", value)) == [100_000] * 3
    assert CountsPickles.pickled - before == 1
    before = CountsPickles.pickled
    fray.wait_all([h.size_of.remote(value) for h in group])  # one call per member: per member
    assert CountsPickles.pickled - before == 3
