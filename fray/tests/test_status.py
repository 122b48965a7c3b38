"""The `fray:status` tool reads a running cluster through its authenticated controller."""

from __future__ import annotations

import json
import time

from fray_test_actors import Counter

from meltemi import fray
from meltemi.fray import _status


def test_status_lists_a_running_clusters_actors(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("FRAY_ROOT", str(tmp_path))
    with fray.LocalCluster(heartbeat_interval_s=0.05) as cluster:
        counter = cluster.spawn(Counter, name="counter")
        for _ in range(3):
            counter.noop()
        time.sleep(0.3)
        assert _status.list_clusters() == [cluster.dir]
        assert _status.main([]) == 0
        table = capsys.readouterr().out
        assert _status.main(["--cluster", cluster.dir, "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)[cluster.dir]
    assert "counter" in table and "alive" in table
    assert [(r["name"], r["state"], r["calls"]) for r in rows] == [("counter", "alive", 3)]


def test_status_without_clusters_says_so(capsys, tmp_path):
    assert _status.main(["--root", str(tmp_path)]) == 0
    assert "no running fray LocalCluster under" in capsys.readouterr().out
