"""Validation and arithmetic of Resources and RestartPolicy."""

from __future__ import annotations

import signal

import pytest

from meltemi import fray


def test_backoff_grows_geometrically_up_to_the_cap():
    policy = fray.RestartPolicy(backoff_initial_s=0.25, backoff_multiplier=3.0, backoff_max_s=5)
    assert [policy.backoff(n) for n in (1, 2, 3, 4)] == [0.25, 0.75, 2.25, 5.0]


def test_backoff_index_starts_at_one():
    with pytest.raises(ValueError, match="needs n >= 1, got 0"):
        fray.RestartPolicy().backoff(0)


def test_sigterm_and_listed_exit_codes_are_preemptions():
    policy = fray.RestartPolicy(preemption_exit_codes=(75,))
    assert policy.is_preemption(None, signal.SIGTERM)
    assert policy.is_preemption(75, None)
    assert not policy.is_preemption(1, None)
    assert not policy.is_preemption(None, signal.SIGKILL)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_failures": -1}, r"RestartPolicy.max_failures must be >= 0, got -1"),
        ({"max_preemptions": 1.5}, r"RestartPolicy.max_preemptions must be an int, got 1.5"),
        ({"backoff_multiplier": 0.5}, r"RestartPolicy.backoff_multiplier must be >= 1"),
    ],
)
def test_restart_policy_names_the_bad_field(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        fray.RestartPolicy(**kwargs)


def test_resources_name_the_bad_field():
    with pytest.raises(ValueError, match=r"Resources.gpus must be >= 0, got -2"):
        fray.Resources(gpus=-2)
    with pytest.raises(TypeError, match=r"Resources.custom\['tpu'\] must be a number"):
        fray.Resources(custom={"tpu": "one"})


def test_local_cluster_refuses_more_cpus_than_it_has():
    with fray.LocalCluster(cpus=3) as cluster:
        with pytest.raises(ValueError, match=r"only 3 of LocalCluster\(cpus=3\) are unreserved"):
            cluster.spawn_group(object, 2, resources=fray.Resources(cpus=2))


def test_cluster_options_are_validated():
    with pytest.raises(ValueError, match=r"InProcessCluster\(call_timeout=0\): must be a positive"):
        fray.InProcessCluster(call_timeout=0)
    with fray.InProcessCluster() as cluster:
        with pytest.raises(ValueError, match="max_concurrency=0: must be an int >= 1"):
            cluster.spawn(object, max_concurrency=0)
        with pytest.raises(ValueError, match="must be a non-empty str without '/'"):
            cluster.spawn(object, name="a/b")
        with pytest.raises(TypeError, match="pass the class, not an instance"):
            cluster.spawn(object())
