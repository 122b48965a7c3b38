"""Bytes moved by collectives per device in the forward loss of an MoE model, for expert
parallelism of 1, 2, 4 and 8 on 8 CPU devices at a fixed global batch (32 x 128 tokens), read
from the compiled program (exact). The forward pass isolates the token traffic: a train step
adds the same gradient reductions of the dense parameters to every layout.

`all_to_all`: the batch split over `data x expert`, `experts -> expert` (tokens exchanged with
all-to-all). `before`: the mapping that was called expert parallelism before (batch over
`data` only, experts sharded), where the compiler moves tokens with gathers and reductions.
Collectives inside the scanned layer stack are counted once (one layer), for both.

    python models/benchmarks/moe_ep_bench.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

ARRAY = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")
OPS = "all-to-all|all-reduce|all-gather|reduce-scatter|collective-permute"
BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1}


def collective_bytes(hlo: str) -> int:
    """Sum of the result sizes of every collective in a compiled (per-device) HLO module."""
    total = 0
    for line in hlo.splitlines():
        m = re.search(rf"= (.+?) ({OPS})(-start)?\(", line)
        if not m:
            continue
        for kind, dims in ARRAY.findall(m.group(1)):
            size = 1
            for d in filter(None, dims.split(",")):
                size *= int(d)
            total += size * BYTES.get(kind, 4)
    return total


def _child() -> dict:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import warnings

    import equinox as eqx
    import jax
    import numpy as np

    import meltemi.haliax as hax
    import meltemi.models as mm

    warnings.simplefilter("ignore")  # the `before` mapping warns that it falls back
    base = mm.get_preset("tiny-mixtral")
    cfg = base.replace(
        vocab_size=1024, hidden_dim=128, num_heads=4, num_kv_heads=2, head_dim=32, num_layers=2,
        intermediate_dim=128, max_seq_len=512,
        moe=base.moe.replace(num_experts=8, top_k=2, expert_dim=128, dispatch="capacity"),
    )  # fmt: skip
    model = mm.init(cfg, key=jax.random.key(0))
    rng = np.random.default_rng(0)
    tokens = hax.named(rng.integers(0, 1024, (32, 128)).astype(np.int32), ("batch", "position"))
    forward = eqx.Partial(lambda m, t: m.loss(t))
    out: dict = {"all_to_all": {}, "before": {}}
    for ep in (1, 2, 4, 8):
        mesh = hax.partitioning.make_mesh({"data": 8 // ep, "expert": ep})
        layouts = {"all_to_all": {"batch": ("data", "expert"), "experts": "expert"}}
        if ep > 1:
            layouts["before"] = {"batch": "data", "experts": "expert"}
        for name, mapping in layouts.items():
            step = hax.named_jit(forward, mapping, mesh=mesh)
            sharded = hax.shard(model, mapping, mesh)
            hlo = step.lower(sharded, tokens).lowered.compile().as_text()
            out[name][ep] = collective_bytes(hlo)
    return out


def measure() -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run(
        [sys.executable, __file__, "--child"], env=env, check=True, capture_output=True, text=True
    )
    raw = json.loads(proc.stdout.strip().splitlines()[-1])
    ours, before = raw["all_to_all"], raw["before"]
    return {
        "moe_ep_collective_bytes_per_device": ours,
        "moe_ep_collective_bytes_per_device_before": before,
        "moe_ep8_over_before": round(ours["8"] / before["8"], 3),
    }


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        print(json.dumps(_child()))
    else:
        print(json.dumps(measure(), indent=2))
