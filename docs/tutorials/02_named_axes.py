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
# # Named axes: from `hax.named` to a sharded MLP on 8 devices
#
# `meltemi.haliax` gives every array dimension a **name**. Operations align axes by name, never
# by position, and sharding is a map from those logical names to the axes of a device mesh.
# This tutorial goes from a single named array to an MLP trained with FSDP on 8 devices, and
# reads back how each parameter and activation is laid out.
#
# We have no accelerator here, so we ask XLA for 8 virtual CPU devices. This must happen before
# JAX is imported; on a TPU or GPU host you would skip it and get the real devices.

# %%
import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import meltemi.haliax as hax
import meltemi.haliax.nn as hnn

assert len(jax.devices()) == 8
jax.devices()

# %% [markdown]
# ## Axes and named arrays
#
# An `Axis` is a name and a size. `hax.named` attaches axes to a plain array.

# %%
Batch, Pos, Embed = hax.make_axes(batch=4, pos=6, embed=10)
x = hax.named(jnp.arange(4 * 6 * 10, dtype=jnp.float32).reshape(4, 6, 10), (Batch, Pos, Embed))
x.axes

# %% [markdown]
# Reductions, indexing and broadcasting take axes by name. The order of the dimensions never
# matters: `y` below has its axes in another order, and adding them still lines up.

# %%
mean_over_embed = hax.mean(x, axis=Embed)  # (batch, pos)
third_position = x[{"pos": 3}]  # (batch, embed)
y = x.rearrange((Embed, Batch, Pos))  # same data, another layout
z = x + y  # aligned by name
assert z.axes == x.axes
assert jnp.allclose(z.array, 2 * x.array)
assert mean_over_embed.axes == (Batch, Pos)
(mean_over_embed.axes, third_position.axes)

# %% [markdown]
# Mistakes are caught at trace time with the names in the message:

# %%
try:
    hax.sum(x, axis="heads")
except Exception as e:  # AxisNotFoundError
    message = str(e)
assert "heads" in message
print(message)

# %% [markdown]
# ## A named MLP
#
# Layers are equinox modules whose weights carry axes. `hnn.Linear.init(In, Out)` has a weight
# over `(Out, In)`; calling it contracts whatever axis is named `In`.

# %%
Hidden = hax.Axis("hidden", 32)


class Mlp(eqx.Module):
    up: hnn.Linear
    down: hnn.Linear

    @staticmethod
    def init(Embed, Hidden, *, key):
        k_up, k_down = jax.random.split(key)
        up = hnn.Linear.init(Embed, Hidden, key=k_up)
        return Mlp(up, hnn.Linear.init(Hidden, Embed, key=k_down))

    def __call__(self, x):
        return self.down(hnn.gelu(self.up(x)))


mlp = Mlp.init(Embed, Hidden, key=jax.random.key(0))
out = mlp(x)
assert out.axes == x.axes
(mlp.up.weight.axes, out.axes)

# %% [markdown]
# ## Sharding by name
#
# A mesh has named device axes. Here all 8 devices form one `data` axis. The mapping says:
# split the `batch` axis of activations over `data` (data parallelism), and split the `embed`
# axis of parameters over `data` too (FSDP: each device stores 1/8 of each weight, gathered
# when it is needed). Axes that are not mentioned are replicated.

# %%
mesh = hax.partitioning.make_mesh({"data": 8})
# Sharded sizes must divide the mesh axis (16 % 8 == 0); a size that does not is an error
# naming the axis and the fix.
Batch, Embed, Hidden = hax.make_axes(batch=16, embed=16, hidden=64)


def make_batch(key):
    return hax.random.normal(key, (Batch, Pos, Embed))


params_mapping = {"embed": "data"}  # FSDP: parameters split along embed
compute_mapping = {"batch": "data"}  # data parallel: activations split along batch

mlp = hax.shard(Mlp.init(Embed, Hidden, key=jax.random.key(0)), params_mapping, mesh)
mlp.up.weight.array.sharding

# %% [markdown]
# Each device holds a (64, 2) piece of the (64, 16) weight:

# %%
shard_shapes = {s.data.shape for s in mlp.up.weight.array.addressable_shards}
assert shard_shapes == {(64, 2)}
shard_shapes

# %% [markdown]
# ## A training step under `named_jit`
#
# `hax.named_jit` compiles a function and lays out its inputs and outputs by name. Inside,
# `axis_resources` is the active mapping, so `hax.shard` calls inside the model (and the loss)
# constrain activations by name.

# %%
optimizer = optax.adam(1e-2)
opt_state = optimizer.init(eqx.filter(mlp, eqx.is_array))


def loss_fn(model, xb):
    target = hax.roll(xb, 1, Embed)  # learn a fixed permutation of the features
    return hax.mean(hax.square(model(xb) - target)).scalar()


@hax.named_jit(axis_resources=compute_mapping, out_axis_resources=params_mapping)
def train_step(model, opt_state, xb):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, xb)
    updates, opt_state = optimizer.update(grads, opt_state, model)
    return eqx.apply_updates(model, updates), opt_state, loss


losses = []
with jax.set_mesh(mesh):
    for step in range(60):
        xb = hax.shard(make_batch(jax.random.key(step)), compute_mapping, mesh)
        mlp, opt_state, loss = train_step(mlp, opt_state, xb)
        losses.append(float(loss))
assert losses[-1] < 0.5 * losses[0], losses
print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")

# %% [markdown]
# The parameters came back still split along `embed` (the `out_axis_resources`), so the
# optimizer state and weights stay 1/8 per device across steps:

# %%
assert {s.data.shape for s in mlp.up.weight.array.addressable_shards} == {(64, 2)}
mlp.up.weight.array.sharding.spec

# %% [markdown]
# ## Reading the compiled program
#
# What did the compiler insert to make FSDP work? The HLO text of the compiled step lists the
# collectives: all-gathers of the weight pieces before use, and reduce-scatters (or
# all-reduces) of the gradients.

# %%
with jax.set_mesh(mesh):
    xb = hax.shard(make_batch(jax.random.key(0)), compute_mapping, mesh)
    hlo = train_step.lower(mlp, opt_state, xb).lowered.compile().as_text()
collectives = {op: hlo.count(f" {op}(") + hlo.count(f" {op}-start(") for op in
               ("all-gather", "all-reduce", "reduce-scatter", "all-to-all")}  # fmt: skip
assert collectives["all-gather"] > 0
collectives

# %% [markdown]
# Change the mapping and the same code runs with another layout: `{"batch": "data"}` alone is
# plain data parallelism (replicated weights, gradients all-reduced); mapping `hidden` to a
# second mesh axis adds tensor parallelism. The model code never changes. Next:
# *Deterministic data*, then *Train your first model*, which uses exactly this machinery.
