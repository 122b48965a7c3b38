"""Elastic multislice without processes: `mesh.min_slices` checks, the batch fingerprint, the
status file and its table (`//levanter:status`)."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=6"
)

import hashlib  # noqa: E402
import json  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from _subprocess import DEFAULT  # noqa: E402
from absl import flags  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

from meltemi.levanter.config import ConfigError, load_config, resolve  # noqa: E402
from meltemi.levanter.main import status as status_main  # noqa: E402
from meltemi.levanter.multislice import (  # noqa: E402
    JobStatus,
    SliceStatus,
    format_status,
    read_status,
)
from meltemi.levanter.trainer._fingerprint import (  # noqa: E402
    batch_fingerprint,
    fingerprint_value,
)


def _spec(*overrides):
    return resolve(load_config(f"{DEFAULT}:multislice", list(overrides)))


def test_min_slices_defaults_to_num_slices():
    assert _spec(("mesh.num_slices", "3"), ("trainer.train_batch_size", "6")).mesh.min_slices == 3


def test_min_slices_above_num_slices_is_an_error_naming_the_fix():
    with pytest.raises(ConfigError, match=r"mesh.min_slices=4: more than mesh.num_slices=3.*"
                                          r"--config.mesh.min_slices=2"):  # fmt: skip
        _spec(("mesh.num_slices", "3"), ("mesh.min_slices", "4"))


def test_a_batch_that_does_not_split_over_every_size_is_an_error_naming_the_fix():
    with pytest.raises(ConfigError, match=r"batch size 4 does not split over 3 slices.*"
                                          r"multiple of 6.*train_batch_size=6"):  # fmt: skip
        _spec(("mesh.num_slices", "3"), ("mesh.min_slices", "2"),
              ("trainer.train_batch_size", "4"))  # fmt: skip
    spec = _spec(("mesh.num_slices", "3"), ("mesh.min_slices", "2"),
                 ("trainer.train_batch_size", "6"))  # fmt: skip
    assert (spec.mesh.num_slices, spec.mesh.min_slices) == (3, 2)


def test_a_fixed_dcn_cannot_shrink():
    with pytest.raises(ConfigError, match=r"mesh.min_slices=1 < mesh.num_slices=2.*dcn.data=-1"):
        _spec(("mesh.min_slices", "1"), ("mesh.dcn.data", "2"))


def _sharded(tokens, n):
    mesh = Mesh(np.array(jax.devices()[:n]), ("data",))
    return jax.device_put(tokens, NamedSharding(mesh, PartitionSpec("data")))


def test_the_fingerprint_is_the_same_on_any_number_of_devices_and_sees_every_row():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 259, size=(6, 13), dtype=np.int32)
    value = fingerprint_value(batch_fingerprint(tokens))
    # Sharded over 1, 2, 3 and 6 devices: reduction trees differ, the value does not.
    for n in (1, 2, 3, 6):
        assert fingerprint_value(batch_fingerprint(_sharded(tokens, n))) == value
    swapped = tokens[[1, 0, 2, 3, 4, 5]]
    changed = tokens.copy()
    changed[5, 12] += 1
    others = {fingerprint_value(batch_fingerprint(t)) for t in (swapped, changed, tokens[:5])}
    assert value not in others and len(others) == 3
    assert 0 <= value < 2**64


def test_fingerprints_of_distinct_batches_do_not_collide():
    # Compared with a cryptographic hash of the same bytes as the independent reference:
    # whenever the SHA-256 differs, the fingerprint must too (500 random batches).
    rng = np.random.default_rng(1)
    seen, digests = set(), set()
    for _ in range(500):
        t = rng.integers(0, 7, size=(3, 5), dtype=np.int32)
        digests.add(hashlib.sha256(t.tobytes()).hexdigest())
        seen.add(fingerprint_value(batch_fingerprint(t)))
    assert len(seen) == len(digests)


def _status(tmp_path):
    job = JobStatus("running", target_slices=3, min_slices=2, num_slices=2, step=7,
                    generation=2, launcher_pid=11)  # fmt: skip
    job.slices = [
        SliceStatus(0, "running", pid=101, started_at=1000.0, peak_rss_mb=512.4, standby_pid=201),
        SliceStatus(
            1, "lost", pid=102, restarts=1, last_exit="SIGKILL", started_at=1000.0, ended_at=1042.0
        ),  # fmt: skip
        SliceStatus(2, "running", pid=103, started_at=1000.0),
    ]
    job.events.append({"time": 1042.5, "kind": "shrink", "reason": "slice(s) [1] lost"})
    job.write(tmp_path)
    return job


def test_the_status_file_round_trips_and_prints_one_row_per_slice(tmp_path):
    _status(tmp_path)
    raw = json.loads((tmp_path / "status.json").read_text())
    assert raw == read_status(tmp_path)
    assert [s["state"] for s in raw["slices"]] == ["running", "lost", "running"]
    assert raw["slices"][1]["duration_s"] == 42.0
    lines = format_status(raw).splitlines()
    assert lines[0].startswith("job running: 2/3 slices (min 2), step 7, gang #2")
    assert lines[1].split() == ["index", "state", "pid", "restarts", "last_exit", "started",
                                "duration", "peak_mb", "standby"]  # fmt: skip
    row = lines[3].split()
    assert row[:5] == ["1", "lost", "102", "1", "SIGKILL"] and row[6] == "42s"
    assert row[-1] == "-"  # no spare process for a lost slice
    assert lines[2].split()[-2:] == ["512", "201"]
    assert lines[-1].endswith("shrink: slice(s) [1] lost")


def test_the_status_binary_prints_the_table_and_names_a_missing_file(tmp_path, capsys):
    _status(tmp_path)
    flags.FLAGS.unparse_flags()
    for name in ("run_dir", "watch", "interval"):
        if name in flags.FLAGS:
            delattr(flags.FLAGS, name)
    flags.DEFINE_string("run_dir", None, "")
    flags.DEFINE_bool("watch", False, "")
    flags.DEFINE_float("interval", 2.0, "")
    flags.FLAGS(["status", f"--run_dir={tmp_path}"])
    assert status_main.main([]) == 0
    assert "job running: 2/3 slices" in capsys.readouterr().out
    flags.FLAGS(["status", f"--run_dir={tmp_path / 'nope'}"])
    assert status_main.main([]) == 1
    err = capsys.readouterr().err
    assert "nope/status.json: no status file" in err and "Check --run_dir" in err
