"""An MLP block and an attention block, written with named axes and by hand with `jnp`.

Both versions compute the same math on the same parameters, so their compiled FLOP counts and
run times can be compared (see `tests/test_zero_overhead.py` and `bench.py`).
"""

from __future__ import annotations

import dataclasses
import math
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import meltemi.haliax as hax
from meltemi.haliax.nn import attention as A


@dataclasses.dataclass(frozen=True)
class Sizes:
    batch: int = 3
    pos: int = 13
    embed: int = 32
    mlp: int = 88
    heads: int = 4
    kv_heads: int = 2
    head_size: int = 8

    @property
    def axes(self):
        return (
            hax.Axis("batch", self.batch),
            hax.Axis("pos", self.pos),
            hax.Axis("embed", self.embed),
            hax.Axis("mlp", self.mlp),
        )


class MlpBlock(eqx.Module):
    norm: hax.nn.RmsNorm
    mlp: hax.nn.MLP

    @staticmethod
    def init(Embed, Mlp, *, key):
        mlp = hax.nn.MLP.init(
            Embed,
            Embed,
            Mlp,
            1,
            hax.nn.silu,
            key=key,
            gated=True,
            use_bias=False,
            use_final_bias=False,
        )
        return MlpBlock(hax.nn.RmsNorm.init(Embed, eps=1e-6), mlp)

    def __call__(self, x):
        return x + self.mlp(self.norm(x))


def jnp_mlp_block(params, x):
    """The same block on raw arrays: x (batch, pos, embed)."""
    norm_w, w_up, w_gate, w_down = params
    h = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + 1e-6) * norm_w
    up = jnp.einsum("bse,me->bsm", h, w_up)
    gate = jnp.einsum("bse,me->bsm", h, w_gate)
    return x + jnp.einsum("bsm,em->bse", jax.nn.silu(gate) * up, w_down)


def mlp_params(block: MlpBlock):
    m = block.mlp
    return (
        block.norm.weight.array,
        m.layers[0].weight.array,
        m.gates[0].weight.array,
        m.layers[1].weight.array,
    )


class AttnBlock(eqx.Module):
    norm: hax.nn.RmsNorm
    attn: A.Attention

    @staticmethod
    def init(Embed, sizes: Sizes, *, key):
        attn = A.Attention.init(
            Embed,
            num_heads=sizes.heads,
            num_kv_heads=sizes.kv_heads,
            head_size=sizes.head_size,
            key=key,
            rotary=hax.nn.RotaryConfig(theta=10000.0),
        )
        return AttnBlock(hax.nn.RmsNorm.init(Embed, eps=1e-6), attn)

    def __call__(self, x):
        return x + self.attn(self.norm(x), A.AttentionMask.causal())


def _rope(x, positions, theta=10000.0):
    d = x.shape[-1]
    inv = jnp.asarray(1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float32) / d)), jnp.float32)
    ang = positions[:, None].astype(jnp.float32) * inv[None, :]  # (s, d/2)
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 3) + (d // 2,)
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def jnp_attn_block(params, x):
    """The same block on raw arrays (GQA: kv heads k, query heads per group g)."""
    norm_w, wq, wk, wv, wo = params  # wq (k,g,d,e), wk/wv (k,d,e), wo (e,k,g,d)
    h = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + 1e-6) * norm_w
    q = jnp.einsum("bse,kgde->bskgd", h, wq)
    k = jnp.einsum("bse,kde->bskd", h, wk)
    v = jnp.einsum("bse,kde->bskd", h, wv)
    pos = jnp.arange(x.shape[1])
    q, k = _rope(q, pos), _rope(k, pos)
    q = q * jnp.asarray(1.0 / math.sqrt(q.shape[-1]), q.dtype)
    logits = jnp.einsum("bskgd,btkd->bskgt", q, k)
    mask = pos[:, None] >= pos[None, :]  # (s, t)
    logits = jnp.where(mask[None, :, None, None, :], logits, jnp.finfo(logits.dtype).min)
    w = jax.nn.softmax(logits, axis=-1)
    out = jnp.einsum("bskgt,btkd->bskgd", w, v)
    return x + jnp.einsum("bskgd,ekgd->bse", out, wo)


def attn_params(block: AttnBlock):
    a = block.attn
    return (
        block.norm.weight.array,
        a.q_proj.weight.array,
        a.k_proj.weight.array,
        a.v_proj.weight.array,
        a.o_proj.weight.array,
    )


def make(sizes: Sizes, seed: int = 0):
    """(named MLP block, named attention block, x as NamedArray) with jitted init."""
    Batch, Pos, Embed, Mlp = sizes.axes
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    mlp = eqx.filter_jit(MlpBlock.init)(Embed, Mlp, key=k1)
    attn = eqx.filter_jit(lambda k: AttnBlock.init(Embed, sizes, key=k))(k2)
    x = hax.random.normal(k3, (Batch, Pos, Embed))
    return mlp, attn, x


def named_loss(block, x):
    return hax.sum(block(x) ** 2).scalar()


def jnp_loss(fn):
    return lambda params, x: jnp.sum(fn(params, x) ** 2)


# Ops whose count says whether two compiled programs do the same work on XLA:CPU: matmuls,
# layout changes (transpose/copy) and fused kernels. `total` counts every instruction.
HLO_OPS = ("dot", "transpose", "copy", "fusion", "convolution")


def hlo_op_counts(fn, *args) -> dict:
    """Instruction counts of the compiled (optimised) HLO of `jax.jit(fn)(*args)`.

    Counts every computation, fused bodies included, so an extra transpose inside a fusion shows.
    """
    text = jax.jit(fn).lower(*args).compile().as_text()
    counts = {op: 0 for op in HLO_OPS}
    total = 0
    for line in text.splitlines():
        m = re.search(r"= \S+ ([a-z][\w-]*)\(", line)
        if m:
            total += 1
            if m.group(1) in counts:
                counts[m.group(1)] += 1
    counts["total"] = total
    return counts
