"""Building blocks shared by every family: norms, the dense MLP, attention with a KV cache."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

import meltemi.haliax as hax
import meltemi.haliax.nn as hnn
from meltemi.haliax import partitioning
from meltemi.haliax.nn.attention import dot_product_attention
from meltemi.models._axes import EMBED, HEAD_SIZE, KEY_POSITION, POSITION, ModelAxes
from meltemi.models._config import ModelConfig


def constrain(x: hax.NamedArray) -> hax.NamedArray:
    """Pins an activation's sharding to the active axis mapping (`hax.axis_mapping`).

    Under FSDP the parameters are sharded along `embed` while the batch is split over the
    same devices; without a constraint XLA's propagation may keep every layer's activations
    whole (the full batch on each device) and gather them instead of the weights. Constraining
    the activations by name (`batch -> data axes`, `embed -> None`, ...) makes it gather the
    weights. Identity when no mapping is active, so single-device use and code that only sets
    a mesh (`jax.set_mesh`) are unaffected.

    >>> import meltemi.haliax as hax
    >>> x = hax.ones((hax.Axis("batch", 3), hax.Axis("embed", 5)))
    >>> constrain(x) is x
    True
    """
    if partitioning.current_thread_local_mapping() is None:
        return x
    return hax.shard(x)


def raw_activation(name: str):
    """The jax-array activation function for a config's `activation` name."""
    return {
        "silu": jax.nn.silu,
        "gelu": lambda a: jax.nn.gelu(a, approximate=False),
        "gelu_tanh": lambda a: jax.nn.gelu(a, approximate=True),
        "relu": jax.nn.relu,
    }[name]


def activation(name: str):
    """The NamedArray activation function for a config's `activation` name."""
    return {
        "silu": hnn.silu,
        "gelu": lambda x: hnn.gelu(x, approximate=False),
        "gelu_tanh": lambda x: hnn.gelu(x, approximate=True),
        "relu": hnn.relu,
    }[name]


class OnePlusRmsNorm(eqx.Module):
    """Gemma's RMS norm: `x / rms(x) * (1 + weight)`, computed in float32; weight starts at 0.

    Keeping Hugging Face's parametrisation (rather than storing `1 + w`) makes checkpoint round
    trips bit-exact.

    >>> import meltemi.haliax as hax
    >>> Embed = hax.Axis("embed", 4)
    >>> [round(v, 4) for v in OnePlusRmsNorm.init(Embed)(hax.ones(Embed) * 3).array.tolist()]
    [1.0, 1.0, 1.0, 1.0]
    """

    weight: hax.NamedArray
    axis: hax.Axis = eqx.field(static=True)
    eps: float = eqx.field(static=True, default=1e-6)

    @staticmethod
    def init(axis: hax.Axis, eps: float = 1e-6) -> OnePlusRmsNorm:
        return OnePlusRmsNorm(hax.zeros(axis), axis, eps)

    def __call__(self, x: hax.NamedArray) -> hax.NamedArray:
        i = x.axis_index(self.axis.name)
        a = x.array.astype(jnp.promote_types(x.dtype, jnp.float32))
        a = a * jax.lax.rsqrt(jnp.mean(jnp.square(a), axis=i, keepdims=True) + self.eps)
        scale = 1.0 + self.weight.astype(a.dtype)
        return (hax.named(a, x.axes) * scale).astype(x.dtype)


def make_norm(config: ModelConfig, axis: hax.Axis) -> Any:
    """The family's norm over `axis` (RMS, Gemma's (1 + w) RMS, or LayerNorm with bias)."""
    if config.norm_kind == "layer":
        return hnn.LayerNorm.init(axis, eps=config.norm_eps)
    if config.norm_kind == "rms_one_plus":
        return OnePlusRmsNorm.init(axis, eps=config.norm_eps)
    return hnn.RmsNorm.init(axis, eps=config.norm_eps)


class DenseMlp(eqx.Module):
    """Gated (`down(act(gate(x)) * up(x))`, SwiGLU/GeGLU) or GPT-2's `down(act(up(x)))`."""

    gate_proj: hnn.Linear | None
    up_proj: hnn.Linear
    down_proj: hnn.Linear
    act: str = eqx.field(static=True)

    @staticmethod
    def init(config: ModelConfig, *, key: jax.Array) -> DenseMlp:
        ax = ModelAxes(config)
        kg, ku, kd = jax.random.split(key, 3)
        bias = config.use_bias
        gate = (
            hnn.Linear.init(ax.Embed, ax.Mlp, key=kg, use_bias=bias) if config.gated_mlp else None
        )
        up = hnn.Linear.init(ax.Embed, ax.Mlp, key=ku, use_bias=bias)
        down = hnn.Linear.init(ax.Mlp, ax.Embed, key=kd, use_bias=bias)
        return DenseMlp(gate, up, down, config.activation)

    def __call__(self, x: hax.NamedArray) -> hax.NamedArray:
        act = activation(self.act)
        if self.gate_proj is None:
            h = act(self.up_proj(x))
        else:
            h = act(self.gate_proj(x)) * self.up_proj(x)
        return self.down_proj(constrain(h))


class LayerCache(eqx.Module):
    """Keys and values of one layer (or of all layers, with a leading `layers` axis).

    Axes: `(layers?, batch, key_position, kv_heads, head_size)`.
    """

    k: hax.NamedArray
    v: hax.NamedArray


def make_attention(config: ModelConfig, *, key: jax.Array) -> hnn.Attention:
    rotary = None
    if config.uses_rope:
        rope = config.rope
        scaling = None
        if rope.is_llama3:
            scaling = hnn.Llama3RopeScaling(
                factor=rope.llama3_factor,
                low_freq_factor=rope.low_freq_factor,
                high_freq_factor=rope.high_freq_factor,
                original_max_position_embeddings=rope.original_max_position,
            )
        rotary = hnn.RotaryConfig(theta=rope.theta, scaling=scaling)
    return hnn.Attention.init(
        hax.Axis(EMBED, config.hidden_dim),
        num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        head_size=config.head_size,
        key=key,
        use_bias=config.use_bias,
        use_qk_norm=config.qk_norm,
        qk_norm_eps=config.norm_eps,
        rotary=rotary,
    )


def attend(
    attn: hnn.Attention,
    x: hax.NamedArray,
    *,
    positions: hax.NamedArray,
    mask: hax.NamedArray,
    cache: LayerCache | None = None,
    cache_index: hax.NamedArray | None = None,
    query_block: int | None = None,
) -> tuple[hax.NamedArray, LayerCache | None]:
    """Self-attention of `x` (axes `..., position, embed`), optionally through a KV cache.

    Without a cache the keys are `x`'s own positions (renamed `key_position`) and `mask` is
    over `(..., position, key_position)`. With one, this step's keys and values are written at
    slot `cache_index` of the cache and the queries attend over all its slots (`mask` then
    covers the cache's `key_position`). `query_block`: see `blockwise_attention`.
    """
    q = constrain(attn.q_proj(x))
    k = constrain(attn.k_proj(x))
    v = constrain(attn.v_proj(x))
    if attn.q_norm is not None:
        q = attn.q_norm(q)
    if attn.k_norm is not None:
        k = attn.k_norm(k)
    if attn.rotary is not None:
        q = attn.rotary(q, positions, HEAD_SIZE)
        k = attn.rotary(k, positions, HEAD_SIZE)
    k = k.rename({POSITION: KEY_POSITION})
    v = v.rename({POSITION: KEY_POSITION})
    new_cache = None
    if cache is not None:
        assert cache_index is not None
        start = {KEY_POSITION: cache_index.array}
        k = hax.updated_slice(cache.k, start, k.astype(cache.k.dtype))
        v = hax.updated_slice(cache.v, start, v.astype(cache.v.dtype))
        new_cache = LayerCache(k, v)
    out = constrain(blockwise_attention(q, k, v, mask, query_block))
    return attn.o_proj(out), new_cache


def blockwise_attention(
    q: hax.NamedArray,
    k: hax.NamedArray,
    v: hax.NamedArray,
    mask: hax.NamedArray | None,
    query_block: int | None,
) -> hax.NamedArray:
    """`softmax(q.k / sqrt(d)) . v` over `key_position`, one block of queries at a time.

    Each block of `query_block` positions attends to every key (the softmax is over whole
    rows, so this is exact) inside a `jax.checkpoint`, so the backward pass recomputes one
    block's scores instead of keeping the `(position, key_position)` matrix of every head:
    at marin-32b's shapes (40 heads, 4096 positions, 4 sequences per device) that matrix is
    10 GiB in float32. Without `query_block`, or when it does not divide the number of
    positions, or the sequence is no longer than it, attention runs in one piece.

    >>> import jax.numpy as jnp
    >>> import meltemi.haliax as hax
    >>> P, K, D = hax.Axis("position", 6), hax.Axis("key_position", 6), hax.Axis("head_size", 4)
    >>> q = hax.named(jnp.arange(24.0).reshape(6, 4) / 24, (P, D))
    >>> kv = q.rename({"position": "key_position"})
    >>> whole = blockwise_attention(q, kv, kv, None, None)
    >>> bool(jnp.allclose(blockwise_attention(q, kv, kv, None, 2).array, whole.array))
    True
    """
    Pos = q.resolve_axis(POSITION)  # noqa: N806
    if query_block is None or Pos.size <= query_block or Pos.size % query_block:
        return dot_product_attention(KEY_POSITION, HEAD_SIZE, q, k, v, mask=mask)
    Blocks = hax.Axis("query_block", Pos.size // query_block)  # noqa: N806
    InBlock = Pos.resize(query_block)  # noqa: N806
    q_blocks = q.unflatten_axis(POSITION, (Blocks, InBlock))
    blocked_mask = mask is not None and mask.has_axis(POSITION)
    m_blocks = mask.unflatten_axis(POSITION, (Blocks, InBlock)) if blocked_mask else mask

    def one(q_block: hax.NamedArray, m_block: hax.NamedArray | None) -> hax.NamedArray:
        out = dot_product_attention(KEY_POSITION, HEAD_SIZE, q_block, k, v, mask=m_block)
        return constrain(out)

    # `hax.map` slices what has the `query_block` axis; k, v (and an unblocked mask) are
    # passed whole to every block.
    out = hax.map(jax.checkpoint(one), Blocks)(q_blocks, m_blocks)
    return out.flatten_axes((Blocks.name, POSITION), POSITION).rearrange([a.name for a in q.axes])
