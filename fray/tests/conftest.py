"""Fixtures shared by the fray tests: one `make_cluster` per backend present.

Tests that take `backend` run once per backend: inprocess, local, and ray when Ray imports.
Mark a test `@pytest.mark.backends("local", ...)` to run it on fewer. Ray starts once per
test file (it is slow to start); its tests are kept few.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # fray_test_actors, for actor processes too

from meltemi import fray  # noqa: E402

HAVE_RAY = importlib.util.find_spec("ray") is not None
ALL_BACKENDS = ("inprocess", "local", "ray") if HAVE_RAY else ("inprocess", "local")


def pytest_configure(config):
    config.addinivalue_line("markers", "backends(*names): run only on these backends")


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("backends")
        names = marker.args if marker else ALL_BACKENDS
        metafunc.parametrize("backend", [b for b in ALL_BACKENDS if b in names])


@pytest.fixture(scope="module")
def ray_started():
    """One Ray per test file, started by fray itself: its temp dir and auth token live in a
    fresh private directory (removed at the end), never under HOME or a fixed path."""
    from meltemi.fray.ray import RayCluster

    owner = RayCluster(num_cpus=2, configure_logging=False)  # later RayClusters join it
    yield
    owner.shutdown()


@pytest.fixture
def make_cluster(backend, request):
    """`make_cluster(**options)` builds a cluster of this test's backend, shut down after."""
    made = []

    def make(**options) -> fray.Cluster:
        if backend == "inprocess":
            options.pop("heartbeat_timeout_s", None)
            cluster = fray.InProcessCluster(**options)
        elif backend == "local":
            options.setdefault("heartbeat_interval_s", 0.2)
            cluster = fray.LocalCluster(**options)
        else:
            request.getfixturevalue("ray_started")
            from meltemi.fray.ray import RayCluster

            options.setdefault("heartbeat_interval_s", 0.5)
            cluster = RayCluster(**options)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.shutdown()
