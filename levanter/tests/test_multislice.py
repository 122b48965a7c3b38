"""Multislice on one machine: 2 slice processes (fray) joined by jax.distributed on loopback.

LocalCluster: a slice process is killed mid-run (the gang restarts and resumes from the last
checkpoint), then the launcher gets SIGTERM (every slice saves and stops, exit status 75), then
the job is started again; it ends with every step logged once and the losses of an
uninterrupted single-process run of the same 2-slice layout (1e-5). Ray: the same launcher.
Every rank of a gang reads its compiled programs from the persistent cache the second time.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
)

import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from _subprocess import DEFAULT  # noqa: E402
from _subprocess import env as subprocess_env  # noqa: E402

from meltemi import fray  # noqa: E402
from meltemi.levanter.config import load_config  # noqa: E402
from meltemi.levanter.mesh import make_mesh  # noqa: E402
from meltemi.levanter.multislice import launch_multislice  # noqa: E402
from meltemi.levanter.tracking import read_metrics  # noqa: E402
from meltemi.levanter.trainer import Trainer, build_parts  # noqa: E402

STEPS = 12
KILL_AT = 3
TERM_AT = 5


def _resolved(run_dir, cache):
    return load_config(
        f"{DEFAULT}:multislice",
        [
            ("run_dir", str(run_dir)),
            ("data.cache_dir", str(cache)),
            ("trainer.num_train_steps", str(STEPS)),
            ("trainer.train_batch_size", "4"),
            ("trainer.progress_bar", "false"),
            ("data.seq_len", "32"),
            ("model.hidden_dim", "32"),
            ("model.intermediate_dim", "48"),
            ("model.num_layers", "2"),
            ("model.head_dim", "8"),
            ("eval.num_batches", "0"),
            ("checkpoint.save_every_steps", "1"),
        ],
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The same 2-slice layout in this process (2 fake devices), never interrupted."""
    root = tmp_path_factory.mktemp("reference")
    single = _resolved(root / "single", root / "cache")
    mesh = make_mesh({"data": 1}, {"data": -1}, num_slices=2, devices=jax.devices()[:2])
    result = Trainer(single, build_parts(single.config), mesh).run()
    return [result.losses[s] for s in range(1, STEPS + 1)], root / "cache"


def _when_step(run_dir, step, action):
    def watch():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            steps = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")]
            if steps and max(steps) >= step:
                action(max(steps))
                return
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()


def test_killed_slice_restarts_the_gang_and_sigterm_stops_it(tmp_path, reference):
    losses, cache = reference
    run_dir = tmp_path / "multi"
    resolved = _resolved(run_dir, cache)
    events = []

    def interrupt(cluster, group, attempt):
        if attempt == 0:  # a slice process dies: the gang restarts and resumes

            def kill(step):
                pid = next(a.pid for a in cluster.actors() if a.name == "slice-1")
                os.kill(pid, signal.SIGKILL)
                events.append(("killed", step))

            _when_step(run_dir, KILL_AT, kill)
        elif attempt == 1:  # the job is preempted: every slice saves and stops

            def term(step):
                events.append(("sigterm", step))
                os.kill(os.getpid(), signal.SIGTERM)

            _when_step(run_dir, TERM_AT, term)

    with fray.LocalCluster(heartbeat_timeout_s=600.0) as cluster:
        status = launch_multislice(resolved, cluster=cluster, on_start=interrupt)
    assert status == 75, events
    assert [e[0] for e in events] == ["killed", "sigterm"]
    stopped_at = max(r["step"] for r in read_metrics(run_dir / "metrics.jsonl"))
    assert stopped_at < STEPS, events

    with fray.LocalCluster(heartbeat_timeout_s=600.0) as cluster:
        assert launch_multislice(resolved, cluster=cluster) == 0
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    np.testing.assert_allclose([r["train/loss"] for r in records], losses, rtol=1e-5, atol=1e-5)


def test_the_same_launcher_runs_on_ray(tmp_path, reference):
    from meltemi.fray.ray import RayCluster

    losses, cache = reference
    run_dir = tmp_path / "ray"
    with RayCluster(num_cpus=2, include_dashboard=False) as cluster:
        assert launch_multislice(_resolved(run_dir, cache), cluster=cluster) == 0
    records = read_metrics(run_dir / "metrics.jsonl")
    np.testing.assert_allclose([r["train/loss"] for r in records], losses, rtol=1e-5, atol=1e-5)


# One process of a 2-process gang: compiles a sharded sum (the persistent cache in argv[3])
# and prints how many programs it read from the cache.
_CACHE_PROBE = """
import sys
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from meltemi.levanter.multislice import write_compile_cache_from_every_rank
rank, port, cache, every_rank = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "1"
hits = []
jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event.endswith("/cache_hits") else None)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.config.update("jax_compilation_cache_dir", cache)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
jax.config.update("jax_num_cpu_devices", 1)
if every_rank:
    assert write_compile_cache_from_every_rank()
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=rank)
mesh = jax.make_mesh((2,), ("d",))
x = jax.make_array_from_process_local_data(
    NamedSharding(mesh, PartitionSpec("d")), np.full((1, 5), rank + 1.0, np.float32))
total = jax.jit(lambda x: (x * 3).sum(), out_shardings=NamedSharding(mesh, PartitionSpec()))(x)
assert float(total) == 45.0, total
print("hits", len(hits))
jax.distributed.shutdown()
"""


def _gang_cache_hits(cache, every_rank: bool) -> list[int]:
    from meltemi import fray

    port = str(fray.free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CACHE_PROBE, str(rank), port, str(cache), str(int(every_rank))],
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for rank in range(2)
    ]
    hits = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        hits.append(int(out.split("hits")[-1]))
    return hits


def test_every_rank_of_a_gang_reads_its_programs_from_the_compile_cache(tmp_path):
    cache = tmp_path / "cache"
    assert _gang_cache_hits(cache, every_rank=False) == [0, 0]  # JAX alone fills the cache
    # ... but rank 1's key differs from rank 0's (the CPU topology fingerprint) and only rank
    # 0 writes: the next gang compiles again on rank 1 (the control). The hook writes it now.
    second = _gang_cache_hits(cache, every_rank=True)
    assert second[0] > 0 and second[1] == 0, second
    third = _gang_cache_hits(cache, every_rank=True)
    assert third[0] > 0 and third[1] == third[0], third
