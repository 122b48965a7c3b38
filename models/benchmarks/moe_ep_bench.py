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

`ragged` (`MoeConfig.ep_exchange="ragged"`, the all-to-all mapping): XLA:CPU cannot compile
`ragged_all_to_all`, so its bytes are not read from a compiled program but computed from the
routing of this batch, which is what the real op moves: the forward pass runs with the op
lowered by `meltemi.models.testing`'s emulator, and each device's send and receive sizes are
recorded in every layer. Per device and layer: its rows to other devices' experts plus the
result rows it returns to other devices, times `hidden * 4` bytes (the rows it keeps for itself
do not travel); the mean over layers (the dense counts above are per layer too), plus the wire
bytes of the program's other collectives (compiled with the emulator: the all-gather of the `n x
E` int32 counts, the router weights' gather, the loss' reductions; the emulator's own
all-to-alls are left out). Reported: the max and mean over the 8 devices, for the capacity path
(the config above: only kept rows travel) and dropless (every assignment travels), with the
static receive-buffer size.

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
    out["ragged"] = {
        dispatch: _ragged_traffic(cfg.replace(moe=cfg.moe.replace(dispatch=dispatch)), tokens)
        for dispatch in ("capacity", "dropless")
    }
    return out


def _ragged_traffic(cfg, tokens) -> dict:
    """Per EP size: bytes each device sends in the ragged exchange of `cfg` on `tokens`."""
    import equinox as eqx
    import jax
    import numpy as np

    import meltemi.haliax as hax
    import meltemi.models as mm
    from meltemi.models import testing
    from meltemi.models.moe import _ragged

    cfg = cfg.replace(moe=cfg.moe.replace(ep_exchange="ragged"))
    model = mm.init(cfg, key=jax.random.key(0))  # the same weights as the dense runs
    real = _ragged.dispatch
    out = {}
    for ep in (2, 4, 8):
        records, static = [], {}

        def spy(rows, lay, buffer_rows, axis, records=records, static=static):
            static.update(row_bytes=rows.shape[1] * rows.dtype.itemsize, buffer=buffer_rows)
            where = (jax.lax.axis_index("data"), jax.lax.axis_index(axis))
            record = lambda *arrays: records.append([np.asarray(a) for a in arrays])  # noqa: E731
            jax.debug.callback(record, *where, lay.send_sizes, lay.recv_sizes)
            return real(rows, lay, buffer_rows, axis)

        _ragged.dispatch = spy
        mapping = {"batch": ("data", "expert"), "experts": "expert"}
        mesh = hax.partitioning.make_mesh({"data": 8 // ep, "expert": ep})
        step = hax.named_jit(eqx.Partial(lambda m, t: m.loss(t)), mapping, mesh=mesh)
        sharded = hax.shard(model, mapping, mesh)
        try:
            with testing.ragged_all_to_all_on_cpu():
                hlo = step.lower(sharded, tokens).lowered.compile().as_text()
                jax.block_until_ready(step(sharded, tokens))
        finally:
            _ragged.dispatch = real
        # The program's other collectives (the counts' all-gather, the router weights' gather,
        # the loss' reductions): its all-to-alls are the emulator's, replaced by `rows` below.
        other = sum(v for k, v in breakdown(hlo)["wire"].items() if k != "all-to-all")
        per_device: dict[tuple[int, int], list[float]] = {}
        sent = 0
        assignments = tokens.array.size // 8 * cfg.moe.top_k  # per device and layer
        dropless = cfg.moe.dispatch == "dropless"
        for data, me, send, recv in records:
            # Dropless sends every assignment, the capacity path at most all of them.
            assert send.sum() == assignments if dropless else send.sum() <= assignments
            sent += int(send.sum())
            own = slice(int(me) * len(send) // ep, (int(me) + 1) * len(send) // ep)
            # To other devices' experts, then the results of other devices' rows back.
            rows = send.sum() - send[own].sum() + recv.sum() - recv[own].sum()
            per_device.setdefault((int(data), int(me)), []).append(float(rows))
        assert len(per_device) == 8 and len({len(v) for v in per_device.values()}) == 1
        # Mean over layers, in bytes, plus the other collectives.
        wire = [sum(v) / len(v) * static["row_bytes"] + other for v in per_device.values()]
        out[ep] = {
            "max": round(max(wire)),
            "mean": round(sum(wire) / len(wire)),
            "other_collectives": other,
            "kept_fraction": round(sent / (len(records) * assignments), 3),
            "receive_buffer_bytes": static["buffer"] * static["row_bytes"],
        }
    return out


def measure() -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run(
        [sys.executable, __file__, "--child"], env=env, check=True, capture_output=True, text=True
    )
    raw = json.loads(proc.stdout.strip().splitlines()[-1])
    ragged = raw.pop("ragged")
    result = {k: {ep: sum(v["result"].values()) for ep, v in raw[k].items()} for k in raw}
    wire = {k: {ep: sum(v["wire"].values()) for ep, v in raw[k].items()} for k in raw}
    before8 = wire["before"]["8"]
    return {
        "moe_ep_collective_bytes_per_device": result["all_to_all"],
        "moe_ep_collective_bytes_per_device_before": result["before"],
        "moe_ep8_over_before": round(result["all_to_all"]["8"] / result["before"]["8"], 3),
        "moe_ep_wire_bytes_per_device": wire["all_to_all"],
        "moe_ep_wire_bytes_per_device_before": wire["before"],
        "moe_ep8_wire_over_before": round(wire["all_to_all"]["8"] / wire["before"]["8"], 3),
        "moe_ep8_bytes_by_kind": {k: raw[k]["8"] for k in raw},
        "moe_ep_ragged_wire_bytes_per_device": ragged["capacity"],
        "moe_ep8_ragged_wire_over_before": round(ragged["capacity"]["8"]["max"] / before8, 3),
        "moe_ep_ragged_dropless_wire_bytes_per_device": ragged["dropless"],
        "moe_ep8_ragged_dropless_wire_over_before": round(
            ragged["dropless"]["8"]["max"] / before8, 3
        ),
    }


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        print(json.dumps(_child()))
    else:
        print(json.dumps(measure(), indent=2))
