"""A tiny named-axis language model and a synthetic stateless data source, for loop tests.

The real model (meltemi.models) is exercised by the end-to-end tests; these keep the step and
loop tests fast and independent of it.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import meltemi.haliax as hax
from meltemi.levanter.config import base_config, with_variant
from meltemi.levanter.mesh import make_mesh
from meltemi.levanter.trainer import EvalSet, RunParts, StepParts

VOCAB, EMBED, MLP, SEQ = 11, 6, 10, 7


class TinyLM(eqx.Module):
    embed: hax.NamedArray
    hidden: hax.NamedArray
    out: hax.NamedArray

    @staticmethod
    def init(key):
        k1, k2, k3 = jax.random.split(key, 3)
        return TinyLM(
            hax.named(0.5 * jax.random.normal(k1, (VOCAB, EMBED)), ("vocab", "embed")),
            hax.named(0.5 * jax.random.normal(k2, (EMBED, MLP)), ("embed", "mlp")),
            hax.named(0.5 * jax.random.normal(k3, (MLP, VOCAB)), ("mlp", "vocab")),
        )

    def logits(self, tokens):
        x = self.embed.array[tokens]
        h = jnp.tanh(x @ self.hidden.array)
        return (h @ self.out.array).astype(jnp.float32)


def nll(model, batch):
    logits = model.logits(batch["tokens"])
    logz = jax.nn.logsumexp(logits, axis=-1)
    gold = jnp.take_along_axis(logits, batch["targets"][..., None], axis=-1)[..., 0]
    return logz - gold, logz


def loss_fn(model, batch, z_loss=1e-4):
    per_token, logz = nll(model, batch)
    mask = batch["loss_mask"]
    return jnp.sum((per_token + z_loss * logz**2) * mask) / jnp.sum(mask)


def eval_loss_fn(model, batch):
    per_token, _ = nll(model, batch)
    return jnp.sum(per_token * batch["loss_mask"]), jnp.sum(batch["loss_mask"])


class Counting:
    """Row i is a deterministic sequence: next token = (token * 3 + row) % VOCAB (learnable)."""

    def sequences(self, indices):
        indices = np.asarray(indices, np.int64)
        starts = (indices * 7 + 1) % VOCAB
        tokens = np.zeros((len(indices), SEQ + 1), np.int32)
        tokens[:, 0] = starts
        for t in range(1, SEQ + 1):
            tokens[:, t] = (tokens[:, t - 1] * 3 + 1) % VOCAB
        mask = np.ones((len(indices), SEQ), np.float32)
        mask[:, -1] = (indices % 2).astype(np.float32)  # uneven loss-token counts per row
        return {"tokens": tokens[:, :-1], "targets": tokens[:, 1:], "loss_mask": mask}


def parts(optimizer=None):
    data = Counting()
    val = data.sequences(np.arange(10_000, 10_004))
    return RunParts(
        step=StepParts(TinyLM.init, loss_fn, optimizer or optax.adam(0.05)),
        eval_loss_fn=eval_loss_fn,
        train_data=data,
        seq_len=SEQ,
        eval_sets=[EvalSet("synthetic", [val], num_bytes=int(val["loss_mask"].sum()))],
        describe="tiny test LM",
    )


def config(run_dir, **overrides):
    c = base_config()
    c.run_dir = str(run_dir)
    c.trainer.num_train_steps = 6
    c.trainer.train_batch_size = 8
    c.trainer.progress_bar = False
    c.trainer.peak_flops_per_device = 1e9
    c.checkpoint.save_every_steps = 2
    c.checkpoint.verify = "sizes"
    for key, value in overrides.items():
        node = c
        *path, leaf = key.split(".")
        for p in path:
            node = node[p]
        node[leaf] = value
    return with_variant(c, None, {})


def one_device_mesh():
    """Loop tests run on one device even when the process has 8 fake ones."""
    return make_mesh({"data": 1}, devices=jax.devices()[:1])
