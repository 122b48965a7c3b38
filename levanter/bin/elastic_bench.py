"""`bazel run //levanter:elastic_bench`: how fast an elastic multislice job shrinks and grows.

Runs the smoke model (`configs/default.py:smoke`) on `--slices` slice processes (fray
LocalCluster, `mesh.min_slices = slices - 1`), SIGKILLs slice 1 (pid from status.json) once
`--kill_at` steps are logged, and lets the replacement rejoin. Prints one JSON object:

    elastic_shrink_s: the kill -> the first step completed on fewer slices (goal: <= 20 s),
        with the launcher's warm standby pool (one spare process per slice, imports done);
    elastic_shrink_cold_s, shrink_speedup: the same without the pool (every process of the
        new gang starts cold), measured in the same run (skip it with --no_cold);
    elastic_grow_s: the replacement up -> the first step completed on all slices again;
    reference_start_s: launch -> the first step of the first gang (a cold start, compiling);
    steps_once, hashes_equal: every step logged once, and the same `data/batch_hash` as an
        uninterrupted run (checked here against the in-process layout of `--slices` devices);
    date_utc, machine, load_avg_1m: when, where (CPUs, platform) and under what load (the
        1-minute load average at the start and the end) the figures were measured.

`elastic_shrink_s` and `elastic_grow_s` are the figures the README quotes: the exit status is 1
when either was not measured (or a step was lost or repeated), so a run that prints them
succeeded.

The re-formed gangs use a persistent compilation cache (`--compile_cache`, default: in the
bench's directory); `--warm` first runs the job once at every size so the timed run measures
re-forming rather than compiling (what an operator sees after the first preemption of a job).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import signal
import sys
import tempfile
import threading
import time

DEFAULT = pathlib.Path(__file__).resolve().parent.parent / "configs" / "default.py"


def _config(run_dir: pathlib.Path, cache: pathlib.Path, args, slices: int, min_slices: int):
    from meltemi.levanter.config import load_config

    batch = 6 if slices <= 3 else 12
    return load_config(
        f"{DEFAULT}:smoke",
        [
            ("run_dir", str(run_dir)),
            ("data.cache_dir", str(cache)),
            ("mesh.num_slices", str(slices)),
            ("mesh.min_slices", str(min_slices)),
            ("trainer.num_train_steps", str(args.steps)),
            ("trainer.train_batch_size", str(batch)),
            ("trainer.peak_flops_per_device", "1e9"),
            ("eval.num_batches", "0"),
            ("checkpoint.save_every_steps", "1"),
        ],
    )


def _steps(run_dir: pathlib.Path) -> list[dict]:
    from meltemi.levanter.tracking import read_metrics

    path = run_dir / "metrics.jsonl"
    return read_metrics(path) if path.exists() else []


def _watch(run_dir, until, action):
    def loop():
        while True:
            records = _steps(run_dir)
            if records and until(records):
                action(records)
                return
            time.sleep(0.05)

    threading.Thread(target=loop, daemon=True).start()


def _elastic_run(root: pathlib.Path, args, standby: bool = True) -> dict:
    from meltemi import fray
    from meltemi.levanter.multislice import launch_multislice, read_status

    run_dir = root / ("elastic" if standby else "elastic-cold")
    times: dict[str, float] = {}
    start = time.monotonic()

    def kill(records):
        pid = next(s["pid"] for s in read_status(run_dir)["slices"] if s["index"] == 1)
        times["kill"] = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        _watch(run_dir, lambda r: any(x["mesh/num_slices"] < args.slices for x in r),
               lambda r: times.setdefault("shrunk", time.monotonic()))  # fmt: skip

    def grown(records):
        small = [x["step"] for x in records if x["mesh/num_slices"] < args.slices]
        return bool(small) and records[-1]["step"] > max(small)

    def on_start(cluster, handles, generation):
        if generation == 0:
            _watch(run_dir, lambda r: True, lambda r: times.setdefault("first", time.monotonic()))
            _watch(run_dir, lambda r: r[-1]["step"] >= args.kill_at, kill)
        elif "shrunk" in times or "kill" in times:
            _watch(run_dir, grown, lambda r: times.setdefault("grown", time.monotonic()))

    with fray.LocalCluster(heartbeat_timeout_s=600.0) as cluster:
        status = launch_multislice(
            _config(run_dir, root / "cache", args, args.slices, args.slices - 1),
            cluster=cluster,
            on_start=on_start,
            standby=standby,
        )
    events = read_status(run_dir)["events"]
    rejoined = next((e["time"] for e in events if e["kind"] == "rejoining"), None)
    grown_wall = None
    if "grown" in times:
        grown_wall = time.time() - (time.monotonic() - times["grown"])
    return {
        "exit_status": status,
        "elastic_shrink_s": times["shrunk"] - times["kill"] if "shrunk" in times else None,
        "elastic_grow_s": (grown_wall - rejoined) if grown_wall and rejoined else None,
        "reference_start_s": times["first"] - start if "first" in times else None,
        "records": _steps(run_dir),
    }


def _warm(root: pathlib.Path, args) -> None:
    """Runs the job at every size from slices-1 to slices, filling the compilation cache
    (the same `--steps`: the step's program depends on the schedule's length)."""
    from meltemi import fray
    from meltemi.levanter.multislice import launch_multislice

    for n in (args.slices - 1, args.slices):
        run_dir = root / f"warm-{n}"
        with fray.LocalCluster(heartbeat_timeout_s=600.0) as cluster:
            launch_multislice(_config(run_dir, root / "cache", args, n, n), cluster=cluster,
                              standby=False)  # fmt: skip


def _reference_hashes(root: pathlib.Path, args) -> list[int]:
    import jax

    from meltemi.levanter.mesh import make_mesh
    from meltemi.levanter.trainer import Trainer, build_parts

    resolved = _config(root / "reference", root / "cache", args, args.slices, args.slices - 1)
    mesh = make_mesh({"data": 1}, {"data": -1}, num_slices=args.slices,
                     devices=jax.devices()[: args.slices])  # fmt: skip
    Trainer(resolved, build_parts(resolved.config), mesh).run()
    return [r["data/batch_hash"] for r in _steps(root / "reference")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slices", type=int, default=3)
    # Enough steps on the smaller gang for the replacement (a cold process) to come and join.
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--kill_at", type=int, default=2)
    parser.add_argument("--warm", action="store_true", help="fill the compile cache first")
    parser.add_argument("--no_cold", action="store_true", help="skip the run without standbys")
    parser.add_argument("--compile_cache", default="", help="default: <dir>/compile_cache")
    parser.add_argument("--dir", default="", help="work directory (default: a temp dir)")
    parser.add_argument("--out", default="", help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.slices < 2:
        print(f"error: --slices={args.slices}: needs at least 2 (one is lost)", file=sys.stderr)
        return 2
    if not 1 <= args.kill_at < args.steps - 2:
        print(f"error: --kill_at={args.kill_at}: must be in 1..{args.steps - 3} for "
              f"--steps={args.steps} (room to shrink and grow)", file=sys.stderr)  # fmt: skip
        return 2
    root = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="elastic-bench-"))
    cache = args.compile_cache or str(root / "compile_cache")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = cache
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.slices}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    load_at_start = os.getloadavg()[0]
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    if args.warm:
        _warm(root, args)
    reference = _reference_hashes(root, args)
    result = _elastic_run(root, args)
    records = result.pop("records")
    cold = {}
    if not args.no_cold:
        cold = _elastic_run(root, args, standby=False)
        cold_records = cold.pop("records")
        cold = {
            "elastic_shrink_cold_s": cold["elastic_shrink_s"],
            "elastic_grow_cold_s": cold["elastic_grow_s"],
            "shrink_speedup": (
                cold["elastic_shrink_s"] / result["elastic_shrink_s"]
                if cold["elastic_shrink_s"] and result["elastic_shrink_s"]
                else None
            ),  # fmt: skip
            "cold_hashes_equal": [r["data/batch_hash"] for r in cold_records] == reference,
        }
    out = {
        **result,
        **cold,
        "date_utc": date,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "load_avg_1m": [load_at_start, os.getloadavg()[0]],  # at the start and the end
        "slices": args.slices,
        "min_slices": args.slices - 1,
        "warm_compile_cache": args.warm,
        "steps_once": [r["step"] for r in records] == list(range(1, args.steps + 1)),
        "hashes_equal": [r["data/batch_hash"] for r in records] == reference,
        "num_slices_by_step": [r["mesh/num_slices"] for r in records],
        "goal_elastic_shrink_s": 20.0,
    }
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text + "\n")
    return 0 if _succeeded(out) else 1


def _succeeded(out: dict) -> bool:
    """Both README figures measured, every step once with the reference's batches, status 0."""
    measured = out["elastic_shrink_s"] is not None and out["elastic_grow_s"] is not None
    return measured and out["steps_once"] and out["hashes_equal"] and out["exit_status"] == 0


if __name__ == "__main__":
    sys.exit(main())
