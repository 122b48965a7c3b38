"""Building blocks shared by every family: norms, the dense MLP, attention with a KV cache."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

import meltemi.haliax as hax
import meltemi.haliax.nn as hnn
from meltemi.haliax import partitioning
from meltemi.models._attention import MaskSpec, attention, blockwise_attention
from meltemi.models._axes import EMBED, HEAD_SIZE, KEY_POSITION, POSITION, ModelAxes
from meltemi.models._config import ModelConfig, RopeConfig
from meltemi.models._rope import Rotary

__all__ = [
    "AttentionOptions",
    "DenseMlp",
    "LayerCache",
    "MaskSpec",
    "OnePlusRmsNorm",
    "attend",
    "blockwise_attention",
    "constrain",
    "project_qkv",
    "make_attention",
    "make_norm",
]


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
    rotary = Rotary(config.rope, config.head_size) if config.uses_rope else None
    attn = hnn.Attention.init(
        hax.Axis(EMBED, config.hidden_dim),
        num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        head_size=config.head_size,
        key=key,
        use_bias=config.use_bias or config.qkv_bias,
        use_output_bias=config.use_bias,
        use_qk_norm=config.qk_norm,
        qk_norm_eps=config.norm_eps,
        rotary=rotary,  # type: ignore[arg-type]
    )
    if config.qk_norm and config.qk_norm_whole:
        # OLMo 2: one RMS norm over the whole q (k) projection, every head at once.
        q_axes = attn.q_proj.Out
        k_axes = attn.k_proj.Out
        attn = eqx.tree_at(
            lambda a: (a.q_norm, a.k_norm),
            attn,
            (
                hnn.RmsNorm.init(q_axes, eps=config.norm_eps),
                hnn.RmsNorm.init(k_axes, eps=config.norm_eps),
            ),
        )
    if config.qk_norm and config.norm_kind == "rms_one_plus":
        # Gemma 3: (1 + w) RMS norms over each head's queries and keys.
        attn = eqx.tree_at(
            lambda a: (a.q_norm, a.k_norm),
            attn,
            (
                OnePlusRmsNorm.init(attn.HeadSize, eps=config.norm_eps),
                OnePlusRmsNorm.init(attn.HeadSize, eps=config.norm_eps),
            ),
        )
    return attn


def _with_theta(rotary: Rotary, theta: float) -> Rotary:
    """Plain RoPE of base `theta` on the same heads as `rotary` (Gemma 3's local layers)."""
    return Rotary(RopeConfig(theta=theta), rotary.head_size)


class AttentionOptions(eqx.Module):
    """The attention settings of a config that are not weights (static, shared by layers).

    Attributes:
        backend: `ModelConfig.attention_backend`.
        window: `ModelConfig.sliding_window`.
        softcap: `ModelConfig.attn_logit_softcap`.
        scale: `ModelConfig.attention_scale`.
        local_theta: `ModelConfig.rope_local_theta`.
        query_block: `ModelConfig.attention_query_block`.
    """

    backend: str = eqx.field(static=True, default="xla")
    window: int | None = eqx.field(static=True, default=None)
    softcap: float | None = eqx.field(static=True, default=None)
    scale: float | None = eqx.field(static=True, default=None)
    local_theta: float | None = eqx.field(static=True, default=None)
    query_block: int | None = eqx.field(static=True, default=None)

    @staticmethod
    def of(config: ModelConfig) -> AttentionOptions:
        return AttentionOptions(
            config.attention_backend,
            config.sliding_window,
            config.attn_logit_softcap,
            config.attention_scale,
            config.rope_local_theta,
            config.attention_query_block,
        )


def project_qkv(
    attn: hnn.Attention,
    x: hax.NamedArray,
    *,
    positions: hax.NamedArray,
    options: AttentionOptions,
    sliding: Any = True,
) -> tuple[hax.NamedArray, hax.NamedArray, hax.NamedArray]:
    """Queries, keys and values of `x` after the q/k norms and RoPE (`attend`'s first half).

    Keys and values come with `position` renamed `key_position`. Shared by `attend` and the
    inference engine's paged attention (`meltemi.models.engine`), so both run one projection.
    """
    q = constrain(attn.q_proj(x))
    k = constrain(attn.k_proj(x))
    v = constrain(attn.v_proj(x))
    if attn.q_norm is not None:
        q = attn.q_norm(q)
    if attn.k_norm is not None:
        k = attn.k_norm(k)
    if attn.rotary is not None:
        rotary = attn.rotary
        if options.local_theta is not None and sliding is not False:
            local = _with_theta(rotary, options.local_theta)
            if sliding is True:
                rotary = local
            else:
                flag = hax.named(jnp.asarray(sliding), ())
                q = hax.where(flag, local(q, positions, HEAD_SIZE), rotary(q, positions, HEAD_SIZE))
                k = hax.where(flag, local(k, positions, HEAD_SIZE), rotary(k, positions, HEAD_SIZE))
                rotary = None
        if rotary is not None:
            q = rotary(q, positions, HEAD_SIZE)
            k = rotary(k, positions, HEAD_SIZE)
    k = k.rename({POSITION: KEY_POSITION})
    v = v.rename({POSITION: KEY_POSITION})
    return q, k, v


def attend(
    attn: hnn.Attention,
    x: hax.NamedArray,
    *,
    positions: hax.NamedArray,
    mask: MaskSpec,
    cache: LayerCache | None = None,
    cache_index: hax.NamedArray | None = None,
    options: AttentionOptions | None = None,
    sliding: Any = True,
) -> tuple[hax.NamedArray, LayerCache | None]:
    """Self-attention of `x` (axes `..., position, embed`), optionally through a KV cache.

    Without a cache the keys are `x`'s own positions (renamed `key_position`). With one, this
    step's keys and values are written at slot `cache_index` of the cache and the queries
    attend over all its slots (`mask` then describes the cache's `key_position`). `sliding`
    says whether `options.window` applies to this layer (a bool, or a traced per-layer flag
    inside the layer scan); the kernel is `options.backend` (see `meltemi.models._attention`).

    Args:
        attn: the layer's projections, norms and RoPE.
        x: the normalised residual stream.
        positions: position ids of `x`'s tokens (for RoPE).
        mask: which keys each query may see.
        cache: this layer's KV cache, or None.
        cache_index: slot of the first new token in the cache.
        options: backend, window, soft cap, scale, local RoPE base, query block (default:
            plain causal attention on `xla`).
        sliding: whether the window applies to this layer.
    """
    options = options or AttentionOptions()
    q, k, v = project_qkv(attn, x, positions=positions, options=options, sliding=sliding)
    new_cache = None
    if cache is not None:
        assert cache_index is not None
        start = {KEY_POSITION: cache_index.array}
        k = hax.updated_slice(cache.k, start, k.astype(cache.k.dtype))
        v = hax.updated_slice(cache.v, start, v.astype(cache.v.dtype))
        new_cache = LayerCache(k, v)
    out = attention(
        q,
        k,
        v,
        mask,
        backend=options.backend,
        window=options.window,
        sliding=sliding,
        softcap=options.softcap,
        scale=options.scale,
        query_block=options.query_block,
    )
    return attn.o_proj(constrain(out)), new_cache
