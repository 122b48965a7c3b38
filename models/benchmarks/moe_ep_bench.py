"""Bytes moved by collectives per device in the forward loss of an MoE model, for expert
parallelism of 1, 2, 4 and 8 on 8 CPU devices at a fixed global batch (32 x 128 tokens), read
from the compiled program (exact). The forward pass isolates the token traffic: a train step
adds the same gradient reductions of the dense parameters to every layout.

`all_to_all`: the batch split over `data x expert`, `experts -> expert` (tokens exchanged with
all-to-all). `before`: the mapping that was called expert parallelism before (batch over
`data` only, experts sharded), where the compiler moves tokens with gathers and reductions.
Collectives inside the scanned layer stack are counted once (one layer), for both.

Two counts per collective. *Result bytes* (`moe_ep_collective_bytes_per_device`): the size of
its result, as before. *Wire bytes* (`moe_ep_wire_bytes_per_device`): what a device sends under
the standard bandwidth model, with n the size of its replica group: a ring all-reduce sends
2(n-1)/n x its size, an all-gather (n-1)/n x its result, a reduce-scatter (n-1)/n x its input,
an all-to-all (n-1)/n x its size (the chunk for itself stays), a collective-permute its size.

    python models/benchmarks/moe_ep_bench.py
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

ARRAY = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")
OPS = "all-to-all|all-reduce|all-gather|reduce-scatter|collective-permute"
BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1}


def _group_size(line: str, devices: int) -> int:
    """n of a collective: its replica group's size, in any of the three HLO spellings."""
    m = re.search(r"replica_groups=mesh\[([^\]]*)\] \{([^}]*)\}", line)
    if m:  # mesh['axis_0'=8,'axis_1'=1] {'axis_0'}: the product of the named axes
        sizes = {k: int(v) for k, v in re.findall(r"'([^']+)'=(\d+)", m.group(1))}
        return math.prod(sizes[a] for a in re.findall(r"'([^']+)'", m.group(2)))
    m = re.search(r"replica_groups=\[([0-9,]+)\]<=", line)
    if m:  # iota: [groups, size]<=[devices]
        return int(m.group(1).split(",")[-1])
    m = re.search(r"replica_groups=\{\{([0-9,]*)\}", line)
    if m:  # explicit {{0,1,...},{...}}
        return len(m.group(1).split(","))
    return devices  # replica_groups={}: every device


def collectives(hlo: str, devices: int = 8) -> list[tuple[str, int, int]]:
    """`(kind, result bytes, group size n)` of every collective in a compiled HLO module."""
    found = []
    for line in hlo.splitlines():
        m = re.search(rf"= (.+?) ({OPS})(-start)?\(", line)
        if not m:
            continue
        size = 0
        for kind, dims in ARRAY.findall(m.group(1)):
            size += math.prod(int(d) for d in filter(None, dims.split(","))) * BYTES.get(kind, 4)
        found.append((m.group(2), size, _group_size(line, devices)))
    return found


def wire_bytes(kind: str, size: int, n: int) -> float:
    """Bytes one device sends for a collective of result `size` over `n` devices."""
    if kind == "collective-permute":
        return size
    share = (n - 1) / n
    return {"all-reduce": 2 * share, "reduce-scatter": share * n}.get(kind, share) * size


def collective_bytes(hlo: str) -> int:
    """Sum of the result sizes of every collective in a compiled (per-device) HLO module."""
    return sum(size for _, size, _ in collectives(hlo))


def breakdown(hlo: str) -> dict[str, dict[str, int]]:
    """Result and wire bytes per collective kind."""
    out: dict[str, dict[str, int]] = {"result": {}, "wire": {}}
    for kind, size, n in collectives(hlo):
        out["result"][kind] = out["result"].get(kind, 0) + size
        out["wire"][kind] = round(out["wire"].get(kind, 0) + wire_bytes(kind, size, n))
    return out


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
            out[name][ep] = breakdown(hlo)
    return out


def measure() -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run(
        [sys.executable, __file__, "--child"], env=env, check=True, capture_output=True, text=True
    )
    raw = json.loads(proc.stdout.strip().splitlines()[-1])
    result = {k: {ep: sum(v["result"].values()) for ep, v in raw[k].items()} for k in raw}
    wire = {k: {ep: sum(v["wire"].values()) for ep, v in raw[k].items()} for k in raw}
    return {
        "moe_ep_collective_bytes_per_device": result["all_to_all"],
        "moe_ep_collective_bytes_per_device_before": result["before"],
        "moe_ep8_over_before": round(result["all_to_all"]["8"] / result["before"]["8"], 3),
        "moe_ep_wire_bytes_per_device": wire["all_to_all"],
        "moe_ep_wire_bytes_per_device_before": wire["before"],
        "moe_ep8_wire_over_before": round(wire["all_to_all"]["8"] / wire["before"]["8"], 3),
        "moe_ep8_bytes_by_kind": {k: raw[k]["8"] for k in raw},
    }


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        print(json.dumps(_child()))
    else:
        print(json.dumps(measure(), indent=2))
