# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Scaling out: fray actors, a 2-slice run, and planning a 32B run
#
# A run grows in two directions. Across **slices** (pods joined by the data-center network):
# one process per slice, started and supervised by `meltemi.fray`, joined into one JAX job.
# And past **this machine**: before renting 256 accelerators, compile the real train step for
# 256 virtual devices and read how much memory each one needs. This tutorial does both on a
# CPU: fray actors first, then the default run on 2 slice processes, then the `--dry_run` plan
# of `levanter/configs/marin_32b.py`.
#
# The plan needs 256 devices in this process. We ask XLA for 256 virtual CPU devices before
# JAX is imported (as in [Named axes](02_named_axes.ipynb)); the slice processes drop the flag
# and each get the devices of their slice.

# %%
import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=256"

import pathlib

import jax

import meltemi.models as mm
from meltemi import fray
from meltemi.levanter.config import load_config, resolve
from meltemi.levanter.multislice import format_status, launch_multislice, read_status
from meltemi.levanter.tracking import read_metrics
from meltemi.levanter.trainer import dry_run

CONFIGS = pathlib.Path(mm.__file__).parents[4] / "levanter" / "configs"
assert jax.device_count() == 256
jax.device_count()

# %% [markdown]
# ## fray: actors in other processes
#
# An actor is an instance of a plain class living in its own process; its methods are called
# over an authenticated loopback connection (`LocalCluster`; `RayCluster` has the same API
# across machines). `cluster.spawn(Class, *args)` starts one; `h.method(x)` calls it and
# waits; `h.method.remote(x)` returns a future. A group is a gang: every member knows its rank.


# %%
class Counter:
    def __init__(self, start):
        self.total = start

    def add(self, x):
        self.total += x
        return self.total

    def where(self):
        ctx = fray.actor_context()
        return ctx.rank, ctx.group_size, os.getpid()

    def divide(self, x):
        return self.total / x


cluster = fray.LocalCluster(call_timeout=60)
counter = cluster.spawn(Counter, 10)
assert counter.add(5) == 15
futures = [counter.add.remote(i) for i in range(3)]  # calls through one handle run in order
assert fray.wait_all(futures) == [15, 16, 18]
gang = cluster.spawn_group(Counter, 2, 0, name="gang")
placements = fray.wait_all(gang.call("where"))
assert [(rank, size) for rank, size, _ in placements] == [(0, 2), (1, 2)]
assert len({pid for *_, pid in placements} | {os.getpid()}) == 3  # three processes
placements

# %% [markdown]
# An exception inside an actor travels back as a `fray.RemoteError` carrying the remote type,
# message and traceback; the actor survives it and keeps its state.

# %%
try:
    counter.divide(0)
except fray.RemoteError as e:
    error = e
assert error.type_name == "ZeroDivisionError"
assert "ZeroDivisionError" in error.traceback
assert counter.add(0) == 18  # still alive, state intact
print(error.type_name, "|", error.message)
print(error.traceback.strip().splitlines()[-1])
cluster.shutdown()

# %% [markdown]
# ## A 2-slice run
#
# `mesh.num_slices=2` turns the default run into a job of 2 slice processes. The launcher,
# `launch_multislice`, starts them as a fray gang, joins them with `jax.distributed` (gloo
# collectives over loopback here, the data-center network on a pod) and supervises them: a
# lost slice restarts the gang from the last checkpoint, and with `mesh.min_slices` below
# `num_slices` the job shrinks instead. The binary does the same with
# `--config=levanter/configs/default.py:multislice`. A tiny model and a few steps keep it short.

# %%
resolved = load_config(
    f"{CONFIGS / 'default.py'}:multislice",
    [
        ("run_dir", "runs/two-slices"),
        ("trainer.num_train_steps", "6"),
        ("trainer.train_batch_size", "4"),
        ("trainer.progress_bar", "false"),
        ("data.seq_len", "32"),
        ("model.hidden_dim", "32"),
        ("model.intermediate_dim", "48"),
        ("model.num_layers", "2"),
        ("model.head_dim", "8"),
        ("eval.num_batches", "0"),
        ("checkpoint.save_every_steps", "3"),
    ],
)
spec = resolve(resolved)
assert spec.mesh.num_slices == 2
exit_status = launch_multislice(spec)
assert exit_status == 0
exit_status

# %% [markdown]
# `run_dir/status.json` is the job as the launcher last saw it: its state, and one row per slice
# (process id, restarts, last exit, peak memory). `//levanter:status -- --run_dir=DIR --watch`
# prints the same table while a job runs.

# %%
run_dir = pathlib.Path("runs/two-slices")
status = read_status(run_dir)
print(format_status(status))
assert status["state"] == "done"
assert [s["state"] for s in status["slices"]] == ["done", "done"]
assert all(s["restarts"] == 0 for s in status["slices"])

# %% [markdown]
# The metrics are one record per step, written once (by slice 0), and each step records how
# many slices computed it:

# %%
records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "train/loss" in r]
assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
assert {r["mesh/num_slices"] for r in records} == {2}
[(r["step"], round(r["train/loss"], 4)) for r in records]

# %% [markdown]
# ## Planning a 32B run: the dry run
#
# `levanter/configs/marin_32b.py` is a 32-billion-parameter Llama trained with FSDP over every
# device, 1024 sequences of 4096 tokens per step. `dry_run(spec, num_devices)` is
# `--dry_run --dry_run_devices=256` from Python: it builds the trainer's own plan (mesh,
# shardings, step) for 256 devices with parameters, optimizer state and batch as shapes only,
# compiles the train step with XLA, and reads XLA's buffer assignment. Nothing is allocated,
# so it runs on a laptop in seconds to a minute.

# %%
marin = resolve(load_config(str(CONFIGS / "marin_32b.py"), [("run_dir", "runs/marin-32b")]))
report = dry_run(marin, 256, hbm_gib=95)
print(report.format())

# %% [markdown]
# How to read the table:
#
# - **arguments** are exact: the per-device shards of the parameters, the optimizer state
#   (Adam's two moments and an EMA of the weights) and the batch. With FSDP over 256 devices
#   each device holds 1/256 of every array.
# - **temporaries** are what the compiled step allocates besides its inputs: activations kept
#   for the backward pass (the remat policy `full` keeps one residual per layer), gradients
#   and XLA:CPU's float32 copies of bfloat16 values, so an upper bound for a TPU.
# - **total** is the peak estimate, checked against the HBM you name (`hbm_gib=95`, a TPU
#   v5p) and against a list of known accelerators.
#
# The numbers follow from the shapes, and we can check the arguments by hand:

# %%
GIB = 2**30
assert report.num_devices == 256 and report.mesh["fsdp"] == 256
assert 32e9 < report.num_params < 33e9
assert report.tokens_per_step == 1024 * 4096
assert report.tokens_per_device == 1024 * 4096 // 256
# float32 weights: 4 bytes per parameter, split 256 ways (up to padding of uneven axes)
assert abs(report.param_bytes - 4 * report.num_params / 256) < 0.01 * report.param_bytes
# optimizer state: the two Adam moments and the EMA, 3 more float32 copies
assert abs(report.opt_state_bytes - 3 * report.param_bytes) < 0.01 * report.opt_state_bytes
assert report.peak_bytes == (
    report.argument_bytes + report.temp_bytes + report.output_bytes - report.alias_bytes
)
assert report.fits(95) and not report.fits(16)
{
    "params GiB/device": round(report.param_bytes / GIB, 2),
    "optimizer GiB/device": round(report.opt_state_bytes / GIB, 2),
    "temporaries GiB/device": round(report.temp_bytes / GIB, 1),
    "peak GiB/device": round(report.peak_bytes / GIB, 1),
}

# %% [markdown]
# The plan is the trainer's: the same `plan(spec, devices)` that `train` lays out, so a
# config that the dry run accepts is the config that will run. To try a layout, change the
# config, not the code: for example FSDP over 128 devices and 2-way data parallelism
# (`mesh.ici.data=2`) doubles each device's share of the weights.
#
# ## Where to go next
#
# - The `levanter` README, *Parallelism and multislice* and *Planning past this machine*:
#   elastic slices (`mesh.min_slices`), tensor and expert parallelism, and measured tables.
# - The fray README and `docs/design/fray.md`: restart policies, timeouts, the protocol and
#   its threat model.
