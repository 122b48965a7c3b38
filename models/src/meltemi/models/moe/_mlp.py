"""The mixture-of-experts MLP (Mixtral, Qwen3-MoE): router plus SwiGLU experts, two paths."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

import meltemi.haliax as hax
import meltemi.haliax.nn as hnn
from meltemi.haliax import random as hrandom
from meltemi.models._axes import BATCH, EMBED, EXPERTS, MLP, POSITION, ModelAxes
from meltemi.models._config import ModelConfig, MoeConfig
from meltemi.models._layers import activation, constrain, raw_activation
from meltemi.models.moe import _ep as moe_ep
from meltemi.models.moe import _kernels as K


def _expert_weight(key: jax.Array, axes: tuple[hax.Axis, ...], fan_in: int) -> hax.NamedArray:
    return hrandom.truncated_normal(key, axes, -3, 3) * (1.0 / fan_in**0.5)


class MoeMlp(eqx.Module):
    """Top-k routed SwiGLU experts.

    Parameters: `router` (`embed -> experts`), `gate_proj`/`up_proj` over
    `(experts, mlp, embed)` and `down_proj` over `(experts, embed, mlp)` (PyTorch's out-first
    layout, one matrix per expert).

    Calling it on `(batch, position, embed)` returns the output and a dict of per-layer
    statistics: `expert_fraction` and `router_prob` (`[experts]`, what the load-balancing
    loss is made of), `router_z` and `dropped` (fraction of assignments dropped by the
    capacity path; always 0 for the dropless one).
    """

    router: hnn.Linear
    gate_proj: hax.NamedArray
    up_proj: hax.NamedArray
    down_proj: hax.NamedArray
    moe: MoeConfig = eqx.field(static=True)
    act: str = eqx.field(static=True)

    @staticmethod
    def init(config: ModelConfig, *, key: jax.Array) -> MoeMlp:
        assert config.moe is not None
        ax = ModelAxes(config)
        kr, kg, ku, kd = jax.random.split(key, 4)
        router = hnn.Linear.init(ax.Embed, ax.Experts, key=kr, use_bias=False)
        d, i = ax.Embed.size, ax.Mlp.size
        gate = _expert_weight(kg, (ax.Experts, ax.Mlp, ax.Embed), d)
        up = _expert_weight(ku, (ax.Experts, ax.Mlp, ax.Embed), d)
        down = _expert_weight(kd, (ax.Experts, ax.Embed, ax.Mlp), i)
        return MoeMlp(router, gate, up, down, config.moe, config.activation)

    def __call__(
        self, x: hax.NamedArray, *, token_mask: hax.NamedArray | None = None
    ) -> tuple[hax.NamedArray, dict[str, jax.Array]]:
        x = x.rearrange((BATCH, POSITION, EMBED))
        batch, seq, d = x.array.shape
        # Pinned to the batch split: with `experts` mapped to a mesh axis the router weight is
        # expert-sharded, and XLA would otherwise gather every token's logits instead.
        logits = constrain(self.router(x).astype(jnp.float32).rearrange((BATCH, POSITION, EXPERTS)))
        act = raw_activation(self.act)
        ep = moe_ep.plan(x, self.moe.num_experts)
        if ep is not None:
            # Expert parallelism: route locally, all-to-all to the experts' devices and back.
            capacity = seq if self.moe.dispatch == "dropless" else self.moe.capacity(seq)
            out, kept, probs, experts = moe_ep.moe(
                ep,
                x.array,
                logits.array,
                self.gate_proj.rearrange((EXPERTS, EMBED, MLP)).array,
                self.up_proj.rearrange((EXPERTS, EMBED, MLP)).array,
                self.down_proj.rearrange((EXPERTS, MLP, EMBED)).array,
                act,
                top_k=self.moe.top_k,
                normalize=self.moe.norm_topk_prob,
                capacity=capacity,
                exchange=self.moe.ep_exchange,
                buffer_factor=self.moe.ep_buffer_factor,
            )
            y = hax.named(out, x.axes)
            dropped = jnp.mean(jnp.logical_not(kept).astype(jnp.float32))
            return y, self._stats(logits.array, probs, experts, dropped, token_mask)
        probs, weights, experts = K.route(
            logits.array, self.moe.top_k, normalize=self.moe.norm_topk_prob
        )
        weights = weights.astype(x.dtype)
        if self.moe.dispatch == "dropless":
            out = K.dropless(
                x.array.reshape(-1, d),
                weights.reshape(-1, self.moe.top_k),
                experts.reshape(-1, self.moe.top_k),
                self.gate_proj.rearrange((EXPERTS, EMBED, MLP)).array,
                self.up_proj.rearrange((EXPERTS, EMBED, MLP)).array,
                self.down_proj.rearrange((EXPERTS, MLP, EMBED)).array,
                act,
            )
            y = hax.named(out.reshape(batch, seq, d), x.axes)
            dropped = jnp.zeros((), jnp.float32)
        else:
            y, kept = self._capacity(x, weights, experts)
            dropped = jnp.mean(jnp.logical_not(kept).astype(jnp.float32))
        return y, self._stats(logits.array, probs, experts, dropped, token_mask)

    def _stats(
        self,
        logits: jax.Array,
        probs: jax.Array,
        experts: jax.Array,
        dropped: jax.Array,
        token_mask: hax.NamedArray | None,
    ) -> dict[str, jax.Array]:
        mask = None if token_mask is None else token_mask.rearrange((BATCH, POSITION)).array
        fraction, mean_prob, router_z = K.router_statistics(
            logits.reshape(-1, logits.shape[-1]),
            probs.reshape(-1, probs.shape[-1]),
            experts.reshape(-1, self.moe.top_k),
            None if mask is None else mask.reshape(-1),
        )
        return {
            "expert_fraction": fraction,
            "router_prob": mean_prob,
            "router_z": router_z,
            "dropped": dropped,
        }

    def _capacity(
        self, x: hax.NamedArray, weights: jax.Array, experts: jax.Array
    ) -> tuple[hax.NamedArray, jax.Array]:
        Batch, Pos = x.resolve_axis(BATCH), x.resolve_axis(POSITION)  # noqa: N806
        Experts = self.gate_proj.resolve_axis(EXPERTS)  # noqa: N806
        Capacity = hax.Axis("capacity", self.moe.capacity(Pos.size))  # noqa: N806
        dispatch, combine, kept = K.capacity_dispatch(weights, experts, Experts.size, Capacity.size)
        axes = (Batch, Pos, Experts, Capacity)
        dispatch = hax.named(dispatch.astype(x.dtype), axes)
        combine = hax.named(combine.astype(x.dtype), axes)
        # (batch, experts, capacity, embed): sharded like the expert weights by the mapping.
        expert_in = constrain(hax.dot(dispatch, x, axis=POSITION))
        gate = hax.dot(expert_in, self.gate_proj, axis=EMBED)
        up = hax.dot(expert_in, self.up_proj, axis=EMBED)
        h = activation(self.act)(gate) * up
        expert_out = constrain(hax.dot(h, self.down_proj, axis=MLP))
        y = hax.dot(combine, expert_out, axis=(EXPERTS, "capacity"))
        return y.rearrange((BATCH, POSITION, EMBED)), kept
