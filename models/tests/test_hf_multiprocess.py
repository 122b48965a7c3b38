"""`hf.save` in a multi-process run: every process contributes its pieces, only process 0 writes.

Two CPU processes (4 virtual devices each) join with `jax.distributed.initialize` on
127.0.0.1; the model is sharded over all 8 devices, so no process holds a whole tensor.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

import meltemi.models as mm
from meltemi.models import _safetensors, hf

WORKER = r"""
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
port, pid, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid,
                           initialization_timeout=120)
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
hf.save(model, None, out)
print("saved", jax.process_index(), flush=True)
"""


CONFIG = mm.get_preset("tiny-llama").replace(
    hidden_dim=32, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_dim=48
)
MAPPING = {"embed": "data", "mlp": "data"}


def random_model():
    """Seeded numpy weights (no compiled initialiser: fast, and equal in every process)."""
    shapes = jax.eval_shape(lambda k: mm.init(CONFIG, key=k), jax.random.key(0))
    rng = np.random.default_rng(0)
    return jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(s.dtype), shapes)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_save_one_checkpoint(tmp_path):
    port = _free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(pathlib.Path(__file__).parent), *sys.path])
    env.pop("XLA_FLAGS", None)
    outs = [tmp_path / f"out{i}" for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(port), str(i), str(outs[i])],
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
    # Process 1 contributed to the gathers but wrote nothing; process 0 wrote everything.
    assert not outs[1].exists()
    index = json.loads((outs[0] / "model.safetensors.index.json").read_text())
    assert index["weight_map"]
    expect = hf.state_dict(random_model())
    got = _safetensors.read_all(outs[0])
    assert sorted(got) == sorted(expect)
    for k, v in expect.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


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
