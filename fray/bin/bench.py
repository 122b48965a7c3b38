"""`bazel run //fray:bench`: fray's backends measured side by side in one run, as JSON.

For each backend present (inprocess, local, ray): actor start, no-op call latency p50/p99,
pipelined calls per second, 1 MiB / 10 MiB echo round trips, and a group call to 4 members
with a list of 1M floats (`group.call`, which pickles the arguments once, against one
`.remote` per member, which pickles them per member; ratios per-member / once, for the whole
call and for the caller's share, until every call is sent); plus
the ratio of Ray's no-op latency to LocalCluster's, measured in the same run.

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

    def size(self, x) -> int:
        return len(x)


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
    group = cluster.spawn_group(Bench, _GROUP_SIZE, name="fan")
    items = [float(i) for i in range(counts["fan_items"])]  # pickling it costs real time
    ways = {
        "once": lambda: group.call("size", items),
        "per_member": lambda: [h.size.remote(items) for h in group],
    }
    fan: dict[str, list[float]] = {way: [] for way in ways}
    sent: dict[str, list[float]] = {way: [] for way in ways}
    for start in ways.values():
        fray.wait_all(start())  # warm up: connections, imports
    for _ in range(counts["fan"]):
        for way, start in ways.items():  # interleaved, so load drifts hit both alike
            t = time.perf_counter()
            futures = start()
            sent[way].append(time.perf_counter() - t)  # the caller's share: pickling, sending
            sizes = fray.wait_all(futures)
            fan[way].append(time.perf_counter() - t)
            if sizes != [len(items)] * _GROUP_SIZE:
                raise RuntimeError(f"group call returned {sizes}")
    once, per_member = (statistics.median(fan[w]) for w in ("once", "per_member"))
    send_once, send_each = (statistics.median(sent[w]) for w in ("once", "per_member"))
    return {
        "actor_start_ms": round(statistics.median(starts) * 1e3, 1),
        "noop_p50_us": round(_percentile(latencies, 0.5) * 1e6, 1),
        "noop_p99_us": round(_percentile(latencies, 0.99) * 1e6, 1),
        "pipelined_calls_per_s": round(pipelined),
        "echo_1mib_ms": round(echo["1mib"] * 1e3, 2),
        "echo_10mib_ms": round(echo["10mib"] * 1e3, 2),
        "group_call_once_ms": round(once * 1e3, 1),
        "group_call_per_member_ms": round(per_member * 1e3, 1),
        "group_per_member_over_once": round(per_member / once, 2),
        "group_send_once_ms": round(send_once * 1e3, 1),
        "group_send_per_member_ms": round(send_each * 1e3, 1),
        "group_send_per_member_over_once": round(send_each / send_once, 2),
    }


_GROUP_SIZE = 4
_BASE = {"fan_items": 1_000_000, "fan": 7}
FULL = {"starts": 5, "warmup": 300, "noop": 3000, "pipelined": 20000, "echo1": 30, "echo10": 10,
        **_BASE}  # fmt: skip
RAY = {"starts": 3, "warmup": 50, "noop": 500, "pipelined": 2000, "echo1": 10, "echo10": 5,
       **_BASE, "fan": 3}  # fmt: skip
QUICK = {"starts": 1, "warmup": 5, "noop": 50, "pipelined": 200, "echo1": 2, "echo10": 1,
         "fan_items": 10_000, "fan": 1}  # fmt: skip


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
        try:
            with make_cluster(backend) as cluster:
                results[backend] = measure(cluster, counts)
        except fray.FrayError as e:  # a setup problem (e.g. Ray's token): one line, exit 2
            print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
            return 2
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
