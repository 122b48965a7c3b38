"""Deaths, restarts, budgets, gangs and heartbeats, on every backend that supports them."""

from __future__ import annotations

import os
import signal
import time

import pytest
from fray_test_actors import BrokenInit, Counter

from meltemi import fray


def _wait_alive(cluster, name: str, epoch: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = {r.name: r for r in cluster.actors()}
        if rows[name].state == "alive" and rows[name].epoch >= epoch:
            return
        time.sleep(0.02)
    raise AssertionError(f"{name} did not come back at epoch {epoch}: {cluster.actors()}")


def test_exit_is_reported_as_actor_died_with_its_exit_code(make_cluster):
    counter = make_cluster().spawn(Counter)
    with pytest.raises(fray.ActorDied, match=r"exit code 7\); it will not be restarted") as info:
        counter.exit(7, "last words before exit")
    assert info.value.exit_code == 7
    assert not info.value.will_restart
    with pytest.raises(fray.ActorDied, match="exit code 7"):
        counter.noop()  # a dead actor stays dead


@pytest.mark.backends("local")
def test_actor_died_carries_the_last_lines_of_its_log(make_cluster):
    counter = make_cluster().spawn(Counter)
    with pytest.raises(fray.ActorDied, match="last words before exit") as info:
        counter.exit(3, "last words before exit")
    assert info.value.log_tail[-1] == "last words before exit"


@pytest.mark.backends("local")
def test_death_by_signal_is_reported_with_the_signal(make_cluster):
    counter = make_cluster().spawn(Counter)
    with pytest.raises(fray.ActorDied, match="killed by SIGKILL") as info:
        counter.kill_self(signal.SIGKILL)
    assert info.value.signal == signal.SIGKILL and info.value.exit_code is None


def test_restarts_stop_when_the_failure_budget_is_spent(make_cluster):
    cluster = make_cluster()
    policy = fray.RestartPolicy(max_failures=2, backoff_initial_s=0.01)
    counter = cluster.spawn(Counter, 10, name="c", restart=policy)
    for _ in range(2):
        assert counter.add(1) == 11  # each incarnation starts from the constructor
        with pytest.raises(fray.ActorDied, match="will be restarted"):
            counter.exit(1)
    assert counter.add(1) == 11
    with pytest.raises(fray.ActorDied, match="will not be restarted"):
        counter.exit(1)
    with pytest.raises(fray.ActorDied):
        counter.add(1)
    (row,) = cluster.actors()
    assert (row.state, row.epoch, row.failures) == ("dead", 2, 2)


@pytest.mark.backends("inprocess", "local")
def test_preemptions_spend_their_own_budget(make_cluster):
    cluster = make_cluster()
    policy = fray.RestartPolicy(
        max_failures=0, max_preemptions=2, preemption_exit_codes=(75,), backoff_initial_s=0.01
    )
    counter = cluster.spawn(Counter, name="p", restart=policy)
    for _ in range(2):
        with pytest.raises(fray.ActorDied, match="preemption.*will be restarted"):
            counter.exit(75)
    with pytest.raises(fray.ActorDied, match="will not be restarted"):
        counter.exit(1)  # a failure: its budget was 0 all along
    (row,) = cluster.actors()
    assert (row.failures, row.preemptions, row.state) == (0, 2, "dead")


@pytest.mark.backends("local")
def test_sigterm_counts_as_a_preemption(make_cluster):
    cluster = make_cluster()
    policy = fray.RestartPolicy(max_preemptions=1, backoff_initial_s=0.01)
    counter = cluster.spawn(Counter, name="t", restart=policy)
    with pytest.raises(fray.ActorDied, match="SIGTERM.*preemption.*will be restarted"):
        counter.kill_self(signal.SIGTERM)
    assert counter.add(1) == 1


@pytest.mark.backends("inprocess", "local")  # backend-agnostic: spare Ray
def test_restart_waits_for_the_backoff(make_cluster):
    cluster = make_cluster()
    policy = fray.RestartPolicy(max_failures=1, backoff_initial_s=0.6)
    counter = cluster.spawn(Counter, name="slow", restart=policy)
    with pytest.raises(fray.ActorDied):
        counter.exit(1)
    died = time.monotonic()
    assert counter.add(1) == 1
    assert time.monotonic() - died >= 0.6


@pytest.mark.backends("inprocess", "local")  # backend-agnostic: spare Ray
def test_other_handles_are_told_of_a_restart_once(make_cluster):
    cluster = make_cluster()
    policy = fray.RestartPolicy(max_failures=1, backoff_initial_s=0.01)
    first = cluster.spawn(Counter, name="r", restart=policy)
    second = cluster.get("r")
    assert second.add(4) == 4
    with pytest.raises(fray.ActorDied):
        first.exit(1)
    _wait_alive(cluster, "r", 1)
    with pytest.raises(fray.ActorRestarted, match=r"epoch 0 -> 1"):
        second.value()
    assert second.value() == 0  # told once; the new incarnation starts fresh
    assert second.epoch == 1


@pytest.mark.backends("inprocess", "local")
def test_idempotent_calls_go_through_restarts(make_cluster):
    cluster = make_cluster()
    policy = fray.RestartPolicy(max_failures=1, backoff_initial_s=0.01)
    counter = cluster.spawn(Counter, name="i", restart=policy)
    with pytest.raises(fray.ActorDied):
        counter.exit(1)
    assert counter.add_idempotent(2) == 2


def test_gang_restarts_every_member_when_one_dies(make_cluster):
    cluster = make_cluster()
    policy = fray.RestartPolicy(max_failures=1, backoff_initial_s=0.01)
    group = cluster.spawn_group(Counter, 3, name="gang", restart=policy)
    fray.wait_all(group.call("add", 5))
    with pytest.raises(fray.ActorDied, match="gang/1"):
        group[1].exit(1)
    _wait_alive(cluster, "gang/0", 1)
    with pytest.raises(fray.ActorRestarted, match="gang restart: gang/1 died"):
        group[0].value()
    values = [group[0].value(), group[1].value()]
    with pytest.raises(fray.ActorRestarted):
        group[2].value()
    assert values + [group[2].value()] == [0, 0, 0]
    assert {r.epoch for r in cluster.actors()} == {1}


@pytest.mark.backends("inprocess", "local")
def test_gang_with_spent_budget_stops_every_member(make_cluster):
    group = make_cluster().spawn_group(Counter, 3, name="g")
    with pytest.raises(fray.ActorDied, match="will not be restarted"):
        group[2].exit(1)
    for member in (group[0], group[1]):
        with pytest.raises(fray.ActorDied, match="group member 'g/2' died"):
            member.value()


@pytest.mark.backends("local")
def test_in_flight_calls_of_gang_members_are_told(make_cluster):
    cluster = make_cluster()
    policy = fray.RestartPolicy(max_failures=1, backoff_initial_s=0.01)
    group = cluster.spawn_group(Counter, 2, name="inflight", restart=policy)
    slow = group[0].sleep.remote(5.0)
    with pytest.raises(fray.ActorDied):
        group[1].exit(1)
    with pytest.raises(fray.ActorRestarted, match="epoch 0 -> 1"):
        slow.result()


@pytest.mark.backends("local")
def test_hung_actor_is_killed_after_missed_heartbeats(make_cluster):
    cluster = make_cluster(heartbeat_interval_s=0.1, heartbeat_timeout_s=0.6)
    counter = cluster.spawn(Counter, name="hung")
    with pytest.raises(fray.ActorDied, match="hung: no heartbeat reply"):
        counter.hang()


@pytest.mark.backends("local", "ray")
def test_long_method_is_not_mistaken_for_a_hang(make_cluster, backend):
    slow = backend == "ray"  # Ray's pings take longer: give them room, keep the ratio
    timeout = 3.0 if slow else 0.8
    cluster = make_cluster(heartbeat_interval_s=0.05, heartbeat_timeout_s=timeout)
    counter = cluster.spawn(Counter)
    assert counter.sleep(3 * timeout) == 3 * timeout  # pings are answered while it runs
    assert counter.add(1) == 1  # the same incarnation


@pytest.mark.backends("local")
def test_death_is_found_even_when_a_forked_child_holds_the_life_line(make_cluster):
    cluster = make_cluster(heartbeat_interval_s=0.05)
    counter = cluster.spawn(Counter)
    with pytest.raises(fray.ActorDied, match="exit code 4"):
        counter.fork_then_exit(4)


def test_constructor_failure_fails_the_spawn(make_cluster):
    cluster = make_cluster()
    with pytest.raises(fray.ActorDied, match="constructor raised ValueError: bad config 17"):
        cluster.spawn(BrokenInit, "bad config 17", name="broken")
    with pytest.raises(KeyError):
        cluster.get("broken")  # the name is free again


@pytest.mark.backends("inprocess", "local")  # backend-agnostic: spare Ray
def test_killed_actor_stays_dead(make_cluster):
    cluster = make_cluster()
    policy = fray.RestartPolicy(max_failures=5)
    counter = cluster.spawn(Counter, name="k", restart=policy)
    cluster.kill(counter)
    with pytest.raises(fray.ActorDied, match="killed by cluster.kill"):
        counter.noop()


@pytest.mark.backends("local")
def test_shutdown_ends_every_actor_process(make_cluster):
    cluster = make_cluster()
    pids = [h.pid() for h in cluster.spawn_group(Counter, 2)]
    cluster.shutdown()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
