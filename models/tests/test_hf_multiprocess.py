"""`hf.save` and `hf.load` in a multi-process run: saving, every process contributes its pieces
and only process 0 writes; loading, every process reads only the rows its devices need.

Two CPU processes (4 virtual devices each) join with `jax.distributed.initialize` on
127.0.0.1; the model is sharded over all 8 devices, so no process holds a whole tensor.
"""

import json
import os
import pathlib
import re
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from model_testing import store_tied_head

import meltemi.models as mm
from meltemi.models import hf
from meltemi.models.hf import _safetensors

# Both workers start as process `pid` of 2 (4 CPU devices each, gloo), with `path` their
# checkpoint directory.
PROLOGUE = r"""
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
port, pid, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid,
                           initialization_timeout=120)
"""

WORKER = (
    PROLOGUE
    + r"""
import meltemi.haliax as hax
from meltemi.models import hf
from test_hf_multiprocess import MAPPING, random_model
mesh = jax.make_mesh((8,), ("data",))
import numpy as np
def put(x):
    spec = hax.partitioning.pspec_for_axis(x.axes, MAPPING, mesh)
    a = np.asarray(x.array)
    sharding = jax.sharding.NamedSharding(mesh, spec)
    return hax.NamedArray(jax.make_array_from_callback(a.shape, sharding, lambda i: a[i]), x.axes)
model = jax.tree.map(put, random_model(), is_leaf=lambda x: isinstance(x, hax.NamedArray))
leaf = model.blocks.stacked.mlp.down_proj.weight.array
assert not leaf.is_fully_addressable, "the test needs arrays split over both processes"
hf.save(model, None, path)
print("saved", jax.process_index(), flush=True)
"""
)

LOAD_WORKER = (
    PROLOGUE
    + r"""
import json
import numpy as np
import meltemi.haliax as hax
from meltemi.models import hf
from meltemi.models.hf import _safetensors
from test_hf_multiprocess import LOADS, random_model
reads = []
original = _safetensors.Checkpoint.read_rows
def counting(self, name, start=0, stop=None):
    out = original(self, name, start, stop)
    reads[-1].append((name, start, start + len(out)))
    return out
_safetensors.Checkpoint.read_rows = counting
mesh = jax.make_mesh((8,), ("data",))
is_named = lambda x: isinstance(x, hax.NamedArray)
for kind, (config, mapping) in LOADS.items():
    reads.append([])
    model, _ = hf.load(os.path.join(path, kind), mesh=mesh, axis_mapping=mapping)
    split = 0
    for got, want in zip(jax.tree.leaves(model, is_leaf=is_named),
                         jax.tree.leaves(random_model(config), is_leaf=is_named), strict=True):
        spec = hax.partitioning.pspec_for_axis(got.axes, mapping, mesh)
        assert got.array.sharding == jax.sharding.NamedSharding(mesh, spec), got.axes
        split += not got.array.is_fully_addressable
        for shard in got.array.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), want.array[shard.index])
    assert split >= 3, (kind, split)
print(json.dumps(dict(zip(LOADS, reads))), flush=True)
"""
)


def _run_two(script, *args) -> list[str]:
    """Runs `script` as processes 0 and 1 of a 2-process job; their outputs."""
    port = _free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(pathlib.Path(__file__).parent), *sys.path])
    env.pop("XLA_FLAGS", None)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(port), str(i), *(str(a(i)) for a in args)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=600)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log[-3000:]
    return logs


CONFIG = mm.get_preset("tiny-llama").replace(
    hidden_dim=32, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_dim=48
)
MAPPING = {"embed": "data", "mlp": "data"}
MOE_CONFIG = CONFIG.replace(
    family="mixtral",
    intermediate_dim=16,
    moe=mm.get_preset("tiny-mixtral").moe.replace(num_experts=8, expert_dim=16),
)
# What the load test loads: FSDP (row- and column-sharded tensors), and experts split over the
# processes (each process needs only its own experts' tensors).
LOADS = {"dense": (CONFIG, MAPPING), "moe": (MOE_CONFIG, {"experts": "data"})}


def random_model(config=CONFIG):
    """Seeded numpy weights (no compiled initialiser: fast, and equal in every process)."""
    shapes = jax.eval_shape(lambda k: mm.init(config, key=k), jax.random.key(0))
    rng = np.random.default_rng(0)
    return jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(s.dtype), shapes)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_save_one_checkpoint(tmp_path):
    outs = [tmp_path / f"out{i}" for i in range(2)]
    _run_two(WORKER, lambda i: outs[i])
    # Process 1 contributed to the gathers but wrote nothing; process 0 wrote everything.
    assert not outs[1].exists()
    index = json.loads((outs[0] / "model.safetensors.index.json").read_text())
    assert index["weight_map"]
    expect = hf.state_dict(random_model())
    got = _safetensors.read_all(outs[0])
    assert sorted(got) == sorted(expect)
    for k, v in expect.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


@pytest.fixture(scope="module")
def two_process_loads(tmp_path_factory):
    """Both processes' reads (`(tensor, start row, stop row)`) per checkpoint of `LOADS`; the
    workers themselves check that each gets exactly the checkpoint's values on its devices."""
    root = tmp_path_factory.mktemp("loads")
    for kind, (config, _) in LOADS.items():
        hf.save(random_model(config), None, root / kind)
    logs = _run_two(LOAD_WORKER, lambda i: root)
    reads = [json.loads(log.strip().splitlines()[-1]) for log in logs]
    return root, {kind: [process[kind] for process in reads] for kind in LOADS}


def test_two_processes_load_each_only_the_rows_of_its_devices(two_process_loads):
    """Each process reads every tensor at most once, and of a tensor split by rows (`o_proj`,
    `down_proj`: rows = `embed`) only its half: together they read each such tensor once."""
    root, loads = two_process_loads
    ckpt = _safetensors.Checkpoint(root / "dense")
    reads = loads["dense"]
    row_bytes = {k: t.dtype.itemsize * int(np.prod(t.shape[1:])) for k, t in ckpt.tensors.items()}
    total = sum(int(np.prod(t.shape)) * t.dtype.itemsize for t in ckpt.tensors.values())
    for process in reads:
        names = [name for name, _, _ in process]
        assert sorted(names) == sorted(ckpt.tensors)  # each tensor once
        fetched = sum((stop - start) * row_bytes[name] for name, start, stop in process)
        assert fetched < total
    by_rows = [
        name for name in ckpt.tensors if name.endswith(("o_proj.weight", "down_proj.weight"))
    ]
    assert by_rows
    for name in by_rows:
        rows = ckpt.tensors[name].shape[0]
        halves = [next((a, b) for n, a, b in process if n == name) for process in reads]
        assert halves == [(0, rows // 2), (rows // 2, rows)], (name, halves)


def test_two_processes_read_only_their_own_experts(two_process_loads):
    """Experts split over the processes: each reads only its 4 experts' tensors (whole) and
    router rows, and every other tensor (replicated) once."""
    root, loads = two_process_loads
    ckpt = _safetensors.Checkpoint(root / "moe")
    experts = MOE_CONFIG.moe.num_experts
    for process, reads in enumerate(loads["moe"]):
        names = [name for name, _, _ in reads]
        assert len(names) == len(set(names))
        own = range(process * experts // 2, (process + 1) * experts // 2)
        for n, a, b in reads:  # the router's rows are the experts: only its own; others whole
            router = n.endswith("block_sparse_moe.gate.weight")
            want = (own.start, own.stop) if router else (0, ckpt.tensors[n].shape[0])
            assert (a, b) == want, (n, a, b)

        def wanted(name, own=own):
            if ".experts." not in name:
                return True
            return int(name.split(".experts.")[1].split(".")[0]) in own

        assert sorted(names) == sorted(n for n in ckpt.tensors if wanted(n))
        assert any(".experts." in n for n in names)


def test_non_writing_processes_produce_every_tensor_and_write_nothing(tmp_path):
    """The other processes' half of the protocol, in one process: with `write=False` every
    tensor is still produced (its gathers run in the same order) but no file appears."""
    f32 = np.dtype("float32")
    produced = []

    def make(name):
        def produce():
            produced.append(name)
            return np.ones(3, f32)

        return _safetensors.PendingTensor(name, (3,), f32, produce)

    tensors = [make(n) for n in "abcd"]
    names = _safetensors.write_sharded(tmp_path / "x", tensors, max_shard_bytes=24, write=False)
    assert produced == list("abcd")
    assert names == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("index", [0, 1])
def test_only_process_zero_writes_the_json_files(tmp_path, monkeypatch, index):
    model = random_model()
    monkeypatch.setattr(jax, "process_index", lambda: index)
    hf.save(model, None, tmp_path / "ckpt")
    written = sorted(p.name for p in pathlib.Path(tmp_path).glob("ckpt/*"))
    if index == 0:
        assert "config.json" in written and "model.safetensors.index.json" in written
    else:
        assert written == []


# A tied checkpoint that also stores `lm_head.weight`, its embedding rows split over the two
# processes: each compares only the head rows it reads, and both agree on the verdict.
TIED_CONFIG = CONFIG.replace(tie_embeddings=True, vocab_size=64)
TIED_MAPPING = {"vocab": "data"}
TIED_CHANGED_ROW = 50  # in process 1's half (rows 32..63)
EMBED = "model.embed_tokens.weight"

TIED_WORKER = (
    PROLOGUE
    + r"""
import json
from meltemi.models import hf
from meltemi.models.hf import _safetensors
from test_hf_multiprocess import TIED_MAPPING
reads = []
original = _safetensors.Checkpoint._read_rows
def counting(self, name, start, stop, slot):
    out = original(self, name, start, stop, slot)
    reads.append((name, start, start + len(out)))
    return out
_safetensors.Checkpoint._read_rows = counting
mesh = jax.make_mesh((8,), ("data",))
hf.load(os.path.join(path, "equal"), mesh=mesh, axis_mapping=TIED_MAPPING)
equal_reads, error = list(reads), None
try:
    hf.load(os.path.join(path, "differs"), mesh=mesh, axis_mapping=TIED_MAPPING)
except hf.CheckpointError as e:
    error = str(e)
print(json.dumps({"reads": equal_reads, "error": error}), flush=True)
"""
)


def _save_tied(directory, changed_row=None):
    hf.save(random_model(TIED_CONFIG), None, directory)
    store_tied_head(directory, changed_row)


def test_two_processes_compare_only_their_rows_of_a_tied_head_and_agree(tmp_path):
    _save_tied(tmp_path / "equal")
    _save_tied(tmp_path / "differs", TIED_CHANGED_ROW)
    logs = _run_two(TIED_WORKER, lambda i: tmp_path)
    results = [json.loads(log.strip().splitlines()[-1]) for log in logs]
    ckpt = _safetensors.Checkpoint(tmp_path / "equal")
    vocab = TIED_CONFIG.vocab_size
    for process, result in enumerate(results):
        halves = [(n, a, b) for n, a, b in result["reads"] if n in ("lm_head.weight", EMBED)]
        half = (process * vocab // 2, (process + 1) * vocab // 2)
        # Its own half of the embedding, and of the head it is compared with: each once.
        assert sorted(halves) == [("lm_head.weight", *half), (EMBED, *half)], halves
        names = [n for n, _, _ in result["reads"]]
        assert sorted(names) == sorted(ckpt.tensors)  # every tensor read once
        # Only process 1 reads the changed row, yet both refuse the checkpoint, naming it.
        assert result["error"] and re.search(
            rf"lm_head.weight differs from {EMBED} \(first at row {TIED_CHANGED_ROW}\)",
            result["error"],
        ), result["error"]
