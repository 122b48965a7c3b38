"""`bazel run //levanter:long_context_bench`: step time and memory per device against length.

The trainer's own step (`plan` of `configs/long_context.py:smoke`: a tiny Llama, YaRN) on
one packed row of `L` tokens, three ways: unsplit on one device (`none`), and split over a
`sequence` mesh axis of `--devices` fake CPU devices with the all-gather or the ring
strategy. For each length and strategy: the median wall time of `--steps` steps, and the
peak bytes per device of the compiled step (`memory_analysis`: arguments + temporaries +
unaliased outputs). Prints one JSON object with the figures, the crossovers (the first length
from which the ring is faster than / needs less memory than the all-gather, and from which
a split step is faster than the unsplit one), and date, machine and load. CPU devices share
the host's cores, so the times measure the work per step, not a speed-up.

    ./bazelw run //levanter:long_context_bench -- --lengths=512,2048,8192
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

STRATEGIES = ("none", "all_gather", "ring")


def _args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="512,2048,8192", help="comma-separated lengths")
    parser.add_argument("--devices", type=int, default=8, help="fake CPU devices of the split")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per point")
    parser.add_argument("--run_dir", default="/tmp/meltemi-long-context-bench")
    return parser.parse_args(argv)


def _point(strategy: str, length: int, args) -> dict:
    import time

    import jax
    import numpy as np

    from meltemi.levanter.config import as_spec, load_config
    from meltemi.levanter.mesh import make_mesh
    from meltemi.levanter.trainer import plan

    config = os.path.join(os.path.dirname(__file__), "..", "configs", "long_context.py")
    overrides = {
        "run_dir": args.run_dir,
        "data.seq_len": length,
        "model.max_seq_len": length,
        "model.sequence_parallel": "ring" if strategy == "none" else strategy,
        "model.hidden_dim": 64,
        "model.intermediate_dim": 128,
        "model.remat": "full",
        "mesh.ici.sequence": 1,
        "trainer.train_batch_size": 1,
    }
    spec = as_spec(load_config(f"{config}:smoke", [(k, str(v)) for k, v in overrides.items()]))
    if strategy == "none":  # one device holds the whole row
        mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    else:
        mesh = make_mesh({"data": 1, "sequence": args.devices})
    p = plan(spec, mesh=mesh)
    compiled = p.compile(1)
    memory = compiled.memory_analysis()
    peak = (
        memory.argument_size_in_bytes
        + memory.temp_size_in_bytes
        + memory.output_size_in_bytes
        - memory.alias_size_in_bytes
    )
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, spec.model.vocab_size, (1, length), dtype=np.int32)
    # Packed documents of uneven lengths (some crossing the split's chunk boundaries).
    segments = np.cumsum(rng.random(length) < 4.0 / length).astype(np.int32)[None]
    batch = {
        "tokens": tokens,
        "targets": np.roll(tokens, -1, axis=1),
        "loss_mask": np.ones((1, length), np.float32),
        "segment_ids": segments,
        "positions": np.arange(length, dtype=np.int32)[None],
    }
    batch = {k: jax.device_put(v, p.batch_sharding) for k, v in batch.items()}
    state = p.init_state(jax.random.key(0))
    state, metrics = compiled(state, batch)  # warm-up
    jax.block_until_ready(metrics)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        state, metrics = compiled(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    return {"step_s": round(float(np.median(times)), 4), "peak_bytes": int(peak)}


def _first(lengths, better) -> int | None:
    """The first length from which `better(i)` holds at every longer length too."""
    for i, length in enumerate(lengths):
        if all(better(j) for j in range(i, len(lengths))):
            return length
    return None


def main(argv=None) -> int:
    args = _args(sys.argv[1:] if argv is None else argv)
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.devices}"
    )
    import json
    import platform

    lengths = [int(x) for x in args.lengths.split(",")]
    load = [os.getloadavg()[0]]
    out = {s: {"step_s": [], "peak_bytes": []} for s in STRATEGIES}
    for length in lengths:
        for strategy in STRATEGIES:
            point = _point(strategy, length, args)
            for key, value in point.items():
                out[strategy][key].append(value)
            print(f"{strategy:>10} L={length}: {point}", file=sys.stderr, flush=True)
    load.append(os.getloadavg()[0])
    ring, gather, none = out["ring"], out["all_gather"], out["none"]
    report = {
        "lengths": lengths,
        "devices": args.devices,
        **out,
        "crossover": {
            "ring_faster_than_all_gather_from": _first(
                lengths, lambda i: ring["step_s"][i] < gather["step_s"][i]
            ),
            "ring_less_memory_than_all_gather_from": _first(
                lengths, lambda i: ring["peak_bytes"][i] < gather["peak_bytes"][i]
            ),
            "split_faster_than_none_from": _first(
                lengths,
                lambda i: min(ring["step_s"][i], gather["step_s"][i]) < none["step_s"][i],
            ),
        },
        "memory_ratio_none_over_ring": [
            round(n / r, 2) for n, r in zip(none["peak_bytes"], ring["peak_bytes"], strict=True)
        ],
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
        "machine": f"{os.cpu_count()} CPUs, {platform.platform()}",
        "load_avg_1m": [round(x, 2) for x in load],
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
