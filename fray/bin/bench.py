"""`bazel run //fray:bench`: fray's backends measured side by side in one run, as JSON.

For each backend present (inprocess, local, ray): actor start, no-op call latency p50/p99,
pipelined calls per second, and 1 MiB / 10 MiB echo round trips; plus the ratio of Ray's
no-op latency to LocalCluster's, measured in the same run.

Flags: --backends=inprocess,local,ray  --quick (tiny counts, for the smoke test)
--out=PATH (default under `bazel run`: fray/bench_results.json in the workspace, which the
README's table is copied from).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

from meltemi import fray


class Bench:
    def noop(self) -> None:
        return None

    def echo(self, x):
        return x


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(cluster: fray.Cluster, counts: dict[str, int]) -> dict[str, float]:
    starts = []
    for _ in range(counts["starts"]):
        t = time.perf_counter()
        handle = cluster.spawn(Bench)
        handle.noop()  # started means: constructed and answering calls
        starts.append(time.perf_counter() - t)
        cluster.kill(handle)
    actor = cluster.spawn(Bench, name="bench")
    for _ in range(counts["warmup"]):
        actor.noop()
    latencies = []
    for _ in range(counts["noop"]):
        t = time.perf_counter()
        actor.noop()
        latencies.append(time.perf_counter() - t)
    t = time.perf_counter()
    futures = [actor.noop.remote() for _ in range(counts["pipelined"])]
    fray.wait_all(futures)
    pipelined = counts["pipelined"] / (time.perf_counter() - t)
    echo = {}
    cases = (("1mib", 1 << 20, counts["echo1"]), ("10mib", 10 << 20, counts["echo10"]))
    for label, size, reps in cases:
        payload = np.ones(size, dtype=np.uint8)
        actor.echo(payload)
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            back = actor.echo(payload)
            times.append(time.perf_counter() - t)
        if back.nbytes != size:
            raise RuntimeError(f"echo returned {back.nbytes} bytes, sent {size}")
        echo[label] = statistics.median(times)
    return {
        "actor_start_ms": round(statistics.median(starts) * 1e3, 1),
        "noop_p50_us": round(_percentile(latencies, 0.5) * 1e6, 1),
        "noop_p99_us": round(_percentile(latencies, 0.99) * 1e6, 1),
        "pipelined_calls_per_s": round(pipelined),
        "echo_1mib_ms": round(echo["1mib"] * 1e3, 2),
        "echo_10mib_ms": round(echo["10mib"] * 1e3, 2),
    }


FULL = {"starts": 5, "warmup": 300, "noop": 3000, "pipelined": 20000, "echo1": 30, "echo10": 10}
RAY = {"starts": 3, "warmup": 50, "noop": 500, "pipelined": 2000, "echo1": 10, "echo10": 5}
QUICK = {"starts": 1, "warmup": 5, "noop": 50, "pipelined": 200, "echo1": 2, "echo10": 1}


def make_cluster(backend: str) -> fray.Cluster:
    if backend == "inprocess":
        return fray.InProcessCluster()  # the default: values pickled, as between processes
    if backend == "local":
        return fray.LocalCluster()
    from meltemi.fray.ray import RayCluster

    return RayCluster(num_cpus=2, include_dashboard=False, log_to_driver=False)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    have_ray = importlib.util.find_spec("ray") is not None
    default = "inprocess,local,ray" if have_ray else "inprocess,local"
    parser.add_argument("--backends", default=default)
    parser.add_argument("--quick", action="store_true")
    workspace = os.environ.get("BUILD_WORKSPACE_DIRECTORY")
    default_out = os.path.join(workspace, "fray", "bench_results.json") if workspace else None
    parser.add_argument("--out", default=default_out)
    args = parser.parse_args(argv)
    results: dict = {}
    for backend in args.backends.split(","):
        counts = QUICK if args.quick else (RAY if backend == "ray" else FULL)
        print(f"bench: {backend} ...", file=sys.stderr, flush=True)
        with make_cluster(backend) as cluster:
            results[backend] = measure(cluster, counts)
    if "ray" in results and "local" in results:
        results["ratios"] = {
            "ray_over_local_noop_p50": round(
                results["ray"]["noop_p50_us"] / results["local"]["noop_p50_us"], 1
            ),
            "ray_over_local_actor_start": round(
                results["ray"]["actor_start_ms"] / results["local"]["actor_start_ms"], 1
            ),
        }
    results["meta"] = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()}-core {platform.machine()} {platform.system()}",
        "python": platform.python_version(),
        "quick": args.quick,
    }
    text = json.dumps(results, indent=1)
    print(text)
    if args.out and not args.quick:
        with open(args.out, "w") as f:
            f.write(text + "\n")
        print(f"bench: wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
