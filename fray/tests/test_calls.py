"""Calls through handles, on every backend: ordering, futures, asyncio, deadlines, payloads."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
from fray_test_actors import Counter

from meltemi import fray


def _refuse(message):
    raise ValueError(message)


class _FailsToUnpickle:
    def __reduce__(self):
        return (_refuse, ("unpickle me? no",))


def test_calls_through_one_handle_run_in_order(make_cluster):
    counter = make_cluster().spawn(Counter)
    futures = [counter.append.remote(i) for i in range(37)]
    fray.wait_all(futures)
    assert counter.get_items() == list(range(37))


def test_remote_returns_a_future_that_resolves(make_cluster):
    counter = make_cluster().spawn(Counter, 5)
    future = counter.add.remote(3)
    assert isinstance(future, fray.Future)
    assert future.result() == 8
    assert future.done()


@pytest.mark.backends("inprocess", "local")  # backend-agnostic: spare Ray
def test_aio_call_can_be_awaited(make_cluster):
    counter = make_cluster().spawn(Counter)

    async def main():
        return await asyncio.gather(counter.add.aio(2), counter.echo.aio("x"))

    assert asyncio.run(main()) == [2, "x"]


@pytest.mark.backends("inprocess", "local")  # backend-agnostic: spare Ray
def test_async_methods_are_run_to_completion(make_cluster):
    counter = make_cluster().spawn(Counter)
    assert counter.async_double(21) == 42


def test_call_past_its_deadline_raises_call_timeout(make_cluster):
    counter = make_cluster().spawn(Counter)
    with pytest.raises(fray.CallTimeout, match=r"sleep\(\) did not finish within 0.2 s"):
        counter.sleep.options(timeout=0.2)(2.0)


@pytest.mark.backends("inprocess", "local")  # backend-agnostic: spare Ray
def test_cluster_default_deadline_applies_to_every_call(make_cluster):
    counter = make_cluster(call_timeout=0.2).spawn(Counter)
    with pytest.raises(fray.CallTimeout, match="call_timeout"):
        counter.sleep(2.0)


@pytest.mark.backends("inprocess", "local")  # backend-agnostic: spare Ray
def test_timeout_none_waits_without_a_deadline(make_cluster):
    counter = make_cluster(call_timeout=0.1).spawn(Counter)
    assert counter.sleep.options(timeout=None)(0.4) == 0.4


@pytest.mark.backends("inprocess", "local")
def test_call_whose_deadline_passes_in_the_queue_never_runs(make_cluster):
    counter = make_cluster().spawn(Counter)
    blocker = counter.sleep.remote(0.5)
    late = counter.add.options(timeout=0.1).remote(1)
    with pytest.raises(fray.CallTimeout):
        late.result()
    blocker.result()
    assert counter.value() == 0


def test_large_arrays_round_trip_unchanged(make_cluster):
    counter = make_cluster().spawn(Counter)
    array = np.arange(3 * 2**20 + 7, dtype=np.uint8)
    back = counter.echo(array)
    np.testing.assert_array_equal(back, array)
    assert back.dtype == np.uint8


@pytest.mark.backends("inprocess", "local")
def test_arguments_and_results_are_copies(make_cluster):
    counter = make_cluster().spawn(Counter)
    array = np.ones(70_001, dtype=np.int32)  # large enough to travel out of band
    back = counter.zero_first(array)
    assert array[0] == 1 and back[0] == 0


def test_remote_exception_carries_type_message_and_traceback(make_cluster):
    counter = make_cluster().spawn(Counter)
    with pytest.raises(fray.RemoteError, match="fail\\(\\) raised ValueError: no 13") as info:
        counter.fail("no 13")
    assert "def fail" in info.value.traceback or "in fail" in info.value.traceback
    assert isinstance(info.value.cause, ValueError)
    assert counter.add(1) == 1  # the actor survives its method's exception


@pytest.mark.backends("inprocess", "local")  # backend-agnostic: spare Ray
def test_unpicklable_constructor_argument_fails_the_spawn_and_frees_the_name(make_cluster):
    cluster = make_cluster()
    with pytest.raises(TypeError, match="pickle"):
        cluster.spawn(Counter, threading.Lock(), name="locked")
    assert cluster.spawn(Counter, 3, name="locked").value() == 3


@pytest.mark.backends("local")
def test_argument_that_cannot_be_unpickled_in_the_actor_is_a_remote_error(make_cluster):
    counter = make_cluster().spawn(Counter)
    with pytest.raises(fray.RemoteError, match="unpickle me"):
        counter.echo(_FailsToUnpickle())
    assert counter.add(1) == 1


@pytest.mark.backends("inprocess", "local")  # backend-agnostic: spare Ray
def test_unknown_method_names_the_closest_one(make_cluster):
    counter = make_cluster().spawn(Counter)
    with pytest.raises(AttributeError, match="no public method 'ehco'; did you mean 'echo'"):
        counter.ehco(1)


@pytest.mark.backends("inprocess", "local")  # backend-agnostic: spare Ray
def test_named_actor_can_be_found_by_name(make_cluster):
    cluster = make_cluster()
    cluster.spawn(Counter, 11, name="store")
    assert cluster.get("store").value() == 11
    with pytest.raises(KeyError, match="did you mean 'store'"):
        cluster.get("stor")
    with pytest.raises(ValueError, match="'store' already exists"):
        cluster.spawn(Counter, name="store")


@pytest.mark.backends("inprocess", "local")
def test_max_concurrency_bounds_calls_running_at_once(make_cluster):
    cluster = make_cluster()
    serial = cluster.spawn(Counter)
    pair = cluster.spawn(Counter, max_concurrency=2)
    for actor, limit in ((serial, 1), (pair, 2)):
        fray.wait_all([actor.busy.remote(0.25) for _ in range(5)])
        assert actor.get_peak() == limit


@pytest.mark.backends("inprocess", "local")
def test_retried_idempotent_call_runs_once(make_cluster):
    counter = make_cluster().spawn(Counter)
    # The first attempt times out after 0.3 s; the retry carries the same request id, so the
    # actor answers it with the first attempt's result instead of adding again.
    assert counter.slow_add.options(timeout=0.3, retries=2)(5, 0.5) == 5
    assert counter.value() == 5


@pytest.mark.backends("inprocess", "local")  # backend-agnostic: spare Ray
def test_retries_are_refused_for_methods_not_marked_idempotent(make_cluster):
    counter = make_cluster().spawn(Counter)
    with pytest.raises(ValueError, match="only methods marked @fray.idempotent may be retried"):
        counter.add.options(retries=1)


def test_group_members_know_their_rank(make_cluster):
    group = make_cluster().spawn_group(Counter, 3, name="workers")
    contexts = fray.wait_all(group.call("context"))
    assert [c[:4] for c in contexts] == [(f"workers/{r}", r, 3, "workers") for r in range(3)]


@pytest.mark.backends("local")
def test_handle_address_is_a_loopback_port(make_cluster):
    counter = make_cluster().spawn(Counter)
    host, port = counter.address
    assert host == "127.0.0.1" and 0 < port < 65536


@pytest.mark.backends("inprocess", "local")
def test_actor_can_pick_a_free_port(make_cluster):
    counter = make_cluster().spawn(Counter)
    assert 0 < counter.port() < 65536


@pytest.mark.backends("inprocess", "local")
def test_status_rows_count_calls(make_cluster):
    cluster = make_cluster(heartbeat_interval_s=0.05)
    counter = cluster.spawn(Counter, name="counted")
    for _ in range(7):
        counter.noop()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        (row,) = cluster.actors()
        if row.calls >= 7:
            break
        time.sleep(0.05)
    assert (row.name, row.state, row.calls) == ("counted", "alive", 7)
    assert row.p99_us >= row.p50_us > 0
