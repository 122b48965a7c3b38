"""`bazel run //levanter:dashboard_bench`: how fast the dashboard opens a 1,000,000-step run.

Writes a `metrics.jsonl` of `--lines` lines shaped like the trainer's (the tiny default run's
16 keys, eval keys every 100 steps, ~450 bytes a line) into a temporary runs folder, then asks
the dashboard's app (in process, through Starlette's test client: no network, the same code a
browser reaches through uvicorn) what the browser asks when a person opens the run. Prints one
JSON object:

    open_cold_s: a server that has never read the run: the runs list, then the run page
        (`/api/runs/ID` and `/api/runs/ID/metrics` for every key, at most 2000 points each).
        The goal is < 2 s. These answers are the sampled preview (`partial`: exact last
        values, sampled curves) while the file is parsed in the background;
    open_cold_cpu_s: the process's CPU seconds over those requests (load inflates wall time
        on a shared machine, CPU time much less);
    exact_s, exact_cpu_s: from the first request until the page's poll gets the exact view
        (every line parsed, min/max downsampling): what the page shows next, unprompted;
    reference_s, open_cold_ratio: reading the file and counting its lines (`wc -l`), timed
        in the same run, and open_cold_s over it;
    open_warm_s: the same requests again (another tab, a reload): only new lines are read;
    index_s, open_indexed_s: a new server parsing the folder in its background thread (what
        `//levanter:dashboard` does when it starts), then the page opened on it;
    pyarrow: whether pyarrow's JSON reader parsed the blocks (else `json`, line by line);
    live_refresh_s: one more line appended, then `/metrics?since_step=N` (the live poll);
    points_sent, preview_points: points of the run page's exact metrics reply (min/max-preserving
        downsampling) and of its preview;
    file_mb, lines: the file's size and lines;
    date_utc, machine, load_avg_1m: when, where (CPUs, platform) and under what load (the
        1-minute load average at the start and the end) the figures were measured.

`--file` reuses an existing metrics file instead of writing one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import resource
import shutil
import sys
import tempfile
import time

import numpy as np

#: One line of the tiny default run (levanter/configs/default.py:smoke), keys in its order.
TEMPLATE = (
    '{{"step": {step}, "batch_size": 4, "optim/grad_clip_norm": {gn}, "optim/grad_clip_threshold": '
    '1.0, "optim/grad_clipped": 1.0, "optim/grad_norm": {gn}, "optim/learning_rate": {lr}, '
    '"optim/skipped": 0.0, "optim/update_norm": {un}, "optim/weight_decay": 0.10000000149011612, '
    '"train/loss": {loss}, "throughput/tokens_per_second": {tps}, "data/batch_hash": {h}, '
    '"mesh/num_slices": 1, "throughput/mfu": {mfu}{extra}}}\n'
)


def write_metrics(path: pathlib.Path, lines: int, seed: int = 0) -> None:
    """`lines` trainer-shaped lines (eval keys every 100 steps), written in chunks."""
    rng = np.random.default_rng(seed)
    chunk = 50_000
    with open(path, "w") as f:
        for start in range(1, lines + 1, chunk):
            steps = np.arange(start, min(lines, start + chunk - 1) + 1)
            loss = 6.0 / (1 + steps * 1e-4) + rng.normal(0, 0.05, steps.size)
            gn = np.abs(rng.normal(1.0, 0.3, steps.size))
            out = []
            for i, s in enumerate(steps.tolist()):
                ev = float(loss[i]) + 0.1
                extra = (
                    f', "eval/stdlib/loss": {ev!r}, "eval/stdlib/bpb": {ev * 1.44!r}'
                    if s % 100 == 0
                    else ""
                )
                out.append(
                    TEMPLATE.format(
                        step=s,
                        gn=repr(float(gn[i])),
                        lr=repr(3e-3 * (1 - s / (lines + 1))),
                        un=repr(float(gn[i]) * 0.02),
                        loss=repr(float(loss[i])),
                        tps=repr(8000.0 + (s % 97)),
                        h=(s * 2654435761) % (1 << 63),
                        mfu=repr(0.15 + (s % 13) * 1e-3),
                        extra=extra,
                    )
                )
            f.write("".join(out))


def _cpu_s() -> float:
    """CPU seconds of this process so far (all threads: the background parse included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--file", default="", help="an existing metrics.jsonl to open instead")
    parser.add_argument("--max_points", type=int, default=2000)
    args = parser.parse_args(argv)

    from fastapi.testclient import TestClient

    from meltemi.levanter.dashboard import create_app
    from meltemi.levanter.dashboard._metrics import pj

    pyarrow_used = pj is not None

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="dashboard-bench-"))
    try:
        run = tmp / "runs" / "big"
        run.mkdir(parents=True)
        if args.file:
            shutil.copyfile(args.file, run / "metrics.jsonl")
        else:
            write_metrics(run / "metrics.jsonl", args.lines)
        (run / "config.json").write_text(
            json.dumps(
                {
                    "config": {
                        "name": "big",
                        "trainer": {"num_train_steps": 2 * args.lines, "train_batch_size": 4},
                        "data": {"seq_len": 32},
                    },
                    "provenance": {},
                    "spec": "bench",
                    "overrides": [],
                }
            )
        )
        load_at_start = os.getloadavg()[0]
        t = time.perf_counter()
        with open(run / "metrics.jsonl", "rb") as f:
            newlines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))
        reference = time.perf_counter() - t
        assert newlines >= args.lines, newlines
        client = TestClient(create_app(tmp / "runs", index_in_background=False))

        def open_page() -> tuple[float, dict]:
            t = time.perf_counter()
            listed = client.get("/api/runs").json()
            assert [r["id"] for r in listed["runs"]] == ["big"], listed
            detail = client.get("/api/runs/big")
            assert detail.status_code == 200, detail.text
            metrics = client.get(f"/api/runs/big/metrics?max_points={args.max_points}").json()
            return time.perf_counter() - t, metrics

        cpu, start = _cpu_s(), time.perf_counter()
        cold, preview = open_page()
        cold_cpu = _cpu_s() - cpu
        assert preview["partial"], "the cold open was not a preview: is the file that small?"
        while True:  # the page polls until the background parse is done
            metrics = client.get(f"/api/runs/big/metrics?max_points={args.max_points}").json()
            if not metrics["partial"]:
                break
            time.sleep(0.05)
        exact = time.perf_counter() - start
        exact_cpu = _cpu_s() - cpu
        warm, _ = open_page()
        last = metrics["last_step"]
        with open(run / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": last + 1, "train/loss": 1.0}) + "\n")
        t = time.perf_counter()
        live = client.get(f"/api/runs/big/metrics?since_step={last}").json()
        live_s = time.perf_counter() - t
        assert live["series"]["train/loss"]["steps"] == [last + 1], live
        # A server that indexed the folder in the background since it started.
        t = time.perf_counter()
        indexed = create_app(tmp / "runs", index_in_background=False)
        indexed.state.runs.index_all()
        index_s = time.perf_counter() - t
        client = TestClient(indexed)
        open_indexed, _ = open_page()
        out = {
            "open_cold_s": round(cold, 3),
            "open_cold_cpu_s": round(cold_cpu, 3),
            "preview_points": sum(len(s["steps"]) for s in preview["series"].values()),
            "exact_s": round(exact, 3),
            "exact_cpu_s": round(exact_cpu, 3),
            "reference_s": round(reference, 3),
            "open_cold_ratio": round(cold / reference, 2),
            "open_warm_s": round(warm, 3),
            "index_s": round(index_s, 3),
            "open_indexed_s": round(open_indexed, 3),
            "pyarrow": pyarrow_used,
            "live_refresh_s": round(live_s, 4),
            "goal_open_s": 2.0,
            "points_sent": sum(len(s["steps"]) for s in metrics["series"].values()),
            "keys": len(metrics["series"]),
            "lines": metrics["lines"],
            "skipped_lines": metrics["skipped_lines"],
            "file_mb": round((run / "metrics.jsonl").stat().st_size / 2**20, 1),
            "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "load_avg_1m": [round(load_at_start, 2), round(os.getloadavg()[0], 2)],
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out, indent=1))
    return 0 if out["lines"] >= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
