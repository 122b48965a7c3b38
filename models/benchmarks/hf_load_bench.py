"""Peak host memory and time of `hf.load` onto 8 CPU devices with FSDP, against
`transformers`' `from_pretrained` on the same directory, measured in one run.

Each load runs in a fresh child process, twice per loader in the order ABBA (times: the
median of the runs; memory: the worst run); its baseline is the resident set after importing its
libraries (jax + meltemi, or torch + transformers), and its peak is the kernel's high-water mark
(`VmHWM`). The checkpoint (a bfloat16 Llama, two safetensors shards) is written tensor by
tensor into a temporary directory first.

`--processes 2` measures instead the pod-scale path: two processes of 4 CPU devices each,
joined by `jax.distributed` on 127.0.0.1 (gloo), load the same checkpoint with FSDP over all 8
devices. Each reports its time, the bytes of checkpoint rows it fetched over the checkpoint's
bytes (a tensor's rows are one contiguous byte range: what a ranged read fetches and what a
local read touches), and its peak RSS over the checkpoint (baseline: after
`jax.distributed.initialize`).

    python models/benchmarks/hf_load_bench.py [--quick] [--processes 2]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import ml_dtypes
import numpy as np

# hidden 2048, 16 layers, vocab 32000, GQA 16/4: 0.85B parameters = 1.7 GB in bfloat16.
FULL = dict(hidden_dim=2048, intermediate_dim=5632, num_layers=16, num_heads=16, num_kv_heads=4)
QUICK = dict(hidden_dim=512, intermediate_dim=1408, num_layers=4, num_heads=8, num_kv_heads=4)


def _status(field: str) -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def write_checkpoint(directory: pathlib.Path, quick: bool) -> int:
    """A random bfloat16 Llama checkpoint in two shards; returns its tensor bytes."""
    import meltemi.models as mm
    from meltemi.models.hf import _keys as _hf_keys
    from meltemi.models.hf._safetensors import PendingTensor, write_sharded

    cfg = mm.get_preset("tiny-llama").replace(
        vocab_size=32_000 if not quick else 8_000, head_dim=None, max_seq_len=2048,
        **(QUICK if quick else FULL),
    )  # fmt: skip
    rng = np.random.default_rng(0)
    bf16 = np.dtype(ml_dtypes.bfloat16)

    def produce(shape):
        return (0.02 * rng.standard_normal(shape, np.float32)).astype(bf16)

    shapes = _hf_keys.state_dict_shapes(cfg)
    tensors = [PendingTensor(k, s, bf16, lambda s=s: produce(s)) for k, s in shapes.items()]
    total = sum(t.nbytes for t in tensors)
    write_sharded(directory, tensors, max_shard_bytes=total // 2 + 1)
    hf_config = mm.to_hf_config(cfg) | {"dtype": "bfloat16", "torch_dtype": "bfloat16"}
    (directory / "config.json").write_text(json.dumps(hf_config))
    return total


def _child_meltemi(directory: str) -> dict:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax

    import meltemi.haliax as hax
    from meltemi.models import hf

    mesh = hax.partitioning.make_mesh({"data": 8})
    baseline = _status("VmRSS")
    start = time.perf_counter()
    model, _ = hf.load(directory, mesh=mesh, axis_mapping={"embed": "data"})
    jax.block_until_ready(jax.tree.leaves(model))
    return {"s": time.perf_counter() - start, "baseline": baseline, "peak": _status("VmHWM")}


def _count_fetched_bytes(counter: list[int]) -> None:
    """Adds to `counter[0]` the bytes of the checkpoint rows every `Checkpoint` read fetches."""
    import math

    from meltemi.models.hf import _safetensors

    def row_bytes(ckpt, name: str) -> int:
        info = ckpt.tensors[name]
        return math.prod(info.shape[1:]) * info.dtype.itemsize

    original_read = _safetensors.Checkpoint.read

    def read(self, name, index=()):
        rows = range(*(index[0] if index else slice(None)).indices(self.tensors[name].shape[0]))
        counter[0] += len(rows) * row_bytes(self, name)
        return original_read(self, name, index)

    _safetensors.Checkpoint.read = read
    original_rows = getattr(_safetensors.Checkpoint, "read_rows", None)
    if original_rows is not None:

        def read_rows(self, name, start=0, stop=None):
            stop = self.tensors[name].shape[0] if stop is None else stop
            counter[0] += (stop - start) * row_bytes(self, name)
            return original_rows(self, name, start, stop)

        _safetensors.Checkpoint.read_rows = read_rows


def _child_meltemi_distributed(directory: str, port: str, process: str) -> dict:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        f"127.0.0.1:{port}", num_processes=2, process_id=int(process), initialization_timeout=120
    )
    import meltemi.haliax as hax
    from meltemi.models import hf

    fetched = [0]
    _count_fetched_bytes(fetched)
    mesh = jax.make_mesh((8,), ("data",))
    baseline = _status("VmRSS")
    start = time.perf_counter()
    model, _ = hf.load(directory, mesh=mesh, axis_mapping={"embed": "data"})
    jax.block_until_ready(jax.tree.leaves(model))
    seconds = time.perf_counter() - start
    peak = _status("VmHWM")
    leaves = jax.tree.leaves(model, is_leaf=hax.is_named_array)
    assert not all(x.array.is_fully_addressable for x in leaves), "not split over the processes"
    return {"s": seconds, "baseline": baseline, "peak": peak, "fetched": fetched[0]}


def _child_transformers(directory: str) -> dict:
    import torch
    import transformers

    baseline = _status("VmRSS")
    start = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16
    return {"s": time.perf_counter() - start, "baseline": baseline, "peak": _status("VmHWM")}


def _run_child(kind: str, directory: pathlib.Path) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, str(directory)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# Which loader runs when: each goes first once (ABBA), so neither alone pays for whatever the
# machine does right after the checkpoint is written (fresh memory pages, writeback).
ORDER = ("meltemi", "transformers", "transformers", "meltemi")


def _median_run(runs: list[dict]) -> dict:
    times = sorted(r["s"] for r in runs)
    middle = len(times) // 2
    s = times[middle] if len(times) % 2 else (times[middle - 1] + times[middle]) / 2
    # The memory figure is the worst run's, not a median.
    worst = max(runs, key=lambda r: r["peak"] - r["baseline"])
    return {"s": s, "runs_s": [round(r["s"], 2) for r in runs]} | {
        k: worst[k] for k in ("baseline", "peak")
    }


def _run_distributed(directory: pathlib.Path) -> list[dict]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("XLA_FLAGS", None)
    argv = [sys.executable, __file__, "--child", "meltemi-2proc", str(directory), str(port)]
    procs = [
        subprocess.Popen([*argv, str(i)], env=env, stdout=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a loading process failed: {[p.returncode for p in procs]}")
    return [json.loads(out.strip().splitlines()[-1]) for out in outs]


def measure_distributed(quick: bool = False, repeats: int = 2) -> dict:
    """Two processes x 4 CPU devices, FSDP over 8: per process, the worst of `repeats` runs'
    memory and the median time."""
    with tempfile.TemporaryDirectory(prefix="hf_load_bench_") as tmp:
        directory = pathlib.Path(tmp)
        nbytes = write_checkpoint(directory, quick)
        os.sync()
        runs = [_run_distributed(directory) for _ in range(repeats)]
    per_process = [_median_run([run[i] for run in runs]) for i in range(2)]
    fetched = [max(run[i]["fetched"] for run in runs) for i in range(2)]
    return {
        "checkpoint_gb": round(nbytes / 1e9, 3),
        "hf_load_2proc_s": [round(p["s"], 2) for p in per_process],
        "hf_load_2proc_runs_s": [p["runs_s"] for p in per_process],
        "hf_load_2proc_read_over_checkpoint": [round(f / nbytes, 3) for f in fetched],
        "hf_load_2proc_peak_rss_over_checkpoint": [
            round((p["peak"] - p["baseline"]) / nbytes, 3) for p in per_process
        ],
    }


def measure(quick: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="hf_load_bench_") as tmp:
        directory = pathlib.Path(tmp)
        nbytes = write_checkpoint(directory, quick)
        os.sync()  # both loaders read a settled page cache, no writeback under one of them
        runs: dict[str, list[dict]] = {"meltemi": [], "transformers": []}
        for kind in ORDER:
            runs[kind].append(_run_child(kind, directory))
        ours, theirs = _median_run(runs["meltemi"]), _median_run(runs["transformers"])
    gb = 1e9
    return {
        "checkpoint_gb": round(nbytes / gb, 3),
        "hf_load_s": round(ours["s"], 2),
        "hf_load_runs_s": ours["runs_s"],
        "transformers_load_runs_s": theirs["runs_s"],
        "hf_load_peak_rss_over_checkpoint": round((ours["peak"] - ours["baseline"]) / nbytes, 3),
        "hf_load_baseline_rss_gb": round(ours["baseline"] / gb, 3),
        "hf_load_peak_rss_gb": round(ours["peak"] / gb, 3),
        "transformers_load_s": round(theirs["s"], 2),
        "transformers_peak_rss_over_checkpoint": round(
            (theirs["peak"] - theirs["baseline"]) / nbytes, 3
        ),
        "hf_load_vs_transformers_s": round(ours["s"] / theirs["s"], 3),
    }


def main() -> None:
    if len(sys.argv) >= 4 and sys.argv[1] == "--child":
        child = {
            "meltemi": _child_meltemi,
            "meltemi-2proc": _child_meltemi_distributed,
            "transformers": _child_transformers,
        }[sys.argv[2]]
        print(json.dumps(child(*sys.argv[3:])))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 0.1 GB checkpoint")
    parser.add_argument(
        "--processes", type=int, choices=(1, 2), default=1, help="2: two jax.distributed processes"
    )
    args = parser.parse_args()
    result = measure_distributed(args.quick) if args.processes == 2 else measure(args.quick)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
