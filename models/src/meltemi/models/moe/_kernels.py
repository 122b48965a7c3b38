"""Mixture-of-experts routing and the two expert execution paths, on plain jax arrays.

* `route`: softmax router, top-k, optional renormalisation (Mixtral and Qwen3-MoE semantics).
* `dropless`: sort the (token, slot) assignments by expert and run every expert's SwiGLU on its
  contiguous group with `jax.lax.ragged_dot`; no token is ever dropped.
* `capacity_dispatch`: GShard-style dispatch/combine tensors with `capacity` slots per expert
  and group (sequence); assignments past the capacity are dropped (their MLP contribution is
  zero). The expert computation itself is named einsums in `_mlp.py`, so a mapping that shards
  the `experts` axis shards it.

When nothing overflows, both paths compute the same function.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

Activation = Callable[[jax.Array], jax.Array]


def route(
    logits: jax.Array, top_k: int, *, normalize: bool
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Router probabilities and the top-k choice of each token.

    Args:
        logits: `[..., experts]` router logits.
        top_k: experts per token.
        normalize: renormalise the top-k probabilities to sum to one.

    Returns:
        `(probs [..., E] float32, weights [..., K], experts [..., K] int32)`.

    >>> import jax.numpy as jnp
    >>> _, w, e = route(jnp.log(jnp.array([[0.1, 0.6, 0.3]])), 2, normalize=True)
    >>> e.tolist(), [round(float(v), 3) for v in w[0]]
    ([[1, 2]], [0.667, 0.333])
    """
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    weights, experts = jax.lax.top_k(probs, top_k)
    if normalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return probs, weights, experts.astype(jnp.int32)


def _swiglu(x: jax.Array, gate: jax.Array, up: jax.Array, act: Activation) -> jax.Array:
    return act(gate) * up


def grouped_mlp(
    xs: jax.Array,
    group_sizes: jax.Array,
    w_gate: jax.Array,
    w_up: jax.Array,
    w_down: jax.Array,
    act: Activation,
) -> jax.Array:
    """The expert MLPs on rows `xs [R, D]` sorted by expert, `group_sizes[e]` rows for expert
    e (rows past their sum give zeros), as grouped matmuls: `[R, D]`."""
    gate = jax.lax.ragged_dot(xs, w_gate, group_sizes)
    up = jax.lax.ragged_dot(xs, w_up, group_sizes)
    return jax.lax.ragged_dot(_swiglu(xs, gate, up, act).astype(xs.dtype), w_down, group_sizes)


def dropless(
    x: jax.Array,
    weights: jax.Array,
    experts: jax.Array,
    w_gate: jax.Array,
    w_up: jax.Array,
    w_down: jax.Array,
    act: Activation,
) -> jax.Array:
    """Dropless expert MLP via a grouped matmul.

    Args:
        x: `[T, D]` tokens.
        weights: `[T, K]` routing weights.
        experts: `[T, K]` expert ids.
        w_gate, w_up: `[E, D, I]`.
        w_down: `[E, I, D]`.
        act: the gate activation.

    Returns:
        `[T, D]`: `sum_k weights[t, k] * MLP_{experts[t, k]}(x[t])`.
    """
    num_tokens, top_k = experts.shape
    num_experts = w_gate.shape[0]
    flat_experts = experts.reshape(-1)
    order = jnp.argsort(flat_experts, stable=True)
    token_of = order // top_k
    xs = jnp.take(x, token_of, axis=0)
    group_sizes = jnp.bincount(flat_experts, length=num_experts).astype(jnp.int32)
    ys = grouped_mlp(xs, group_sizes, w_gate, w_up, w_down, act)
    ys = ys * jnp.take(weights.reshape(-1), order)[:, None].astype(ys.dtype)
    return jnp.zeros((num_tokens, x.shape[-1]), ys.dtype).at[token_of].add(ys)


def capacity_dispatch(
    weights: jax.Array, experts: jax.Array, num_experts: int, capacity: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Dispatch and combine tensors of the capacity path.

    Each group (leading axis) is one sequence. Slots are given in token order, slot k of a
    token after slot k-1 of the same token; an assignment whose position in its expert's queue
    reaches `capacity` is dropped.

    Args:
        weights: `[G, S, K]` routing weights.
        experts: `[G, S, K]` expert ids.
        num_experts: E.
        capacity: C, slots per expert and group.

    Returns:
        `(dispatch [G, S, E, C] 0/1, combine [G, S, E, C] weights, kept [G, S, K] bool)`.
    """
    g, s, k = experts.shape
    onehot = jax.nn.one_hot(experts, num_experts, dtype=jnp.int32)  # [G, S, K, E]
    flat = onehot.reshape(g, s * k, num_experts)
    position = (jnp.cumsum(flat, axis=1) - 1).reshape(g, s, k, num_experts)
    position = jnp.sum(position * onehot, axis=-1)  # [G, S, K]: queue position in its expert
    kept = position < capacity
    slot = jax.nn.one_hot(jnp.where(kept, position, capacity), capacity, dtype=jnp.float32)
    dispatch_k = onehot.astype(jnp.float32)[..., None] * slot[..., None, :]  # [G, S, K, E, C]
    dispatch = jnp.sum(dispatch_k, axis=2)
    combine = jnp.sum(dispatch_k * weights.astype(jnp.float32)[..., None, None], axis=2)
    return dispatch, combine, kept


def router_statistics(
    logits: jax.Array, probs: jax.Array, experts: jax.Array, mask: jax.Array | None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One layer's routing statistics over the (unmasked) tokens.

    Args:
        logits, probs: `[T, E]`.
        experts: `[T, K]`.
        mask: `[T]` bool, tokens that count (`None`: all).

    Returns:
        `(fraction [E], mean_prob [E], router_z)`: the fraction of tokens routed to each
        expert (summed over the k slots, so it sums to k), the mean router probability of each
        expert, and the router z-loss (mean squared logsumexp of the logits).
    """
    num_experts = logits.shape[-1]
    m = jnp.ones(logits.shape[:1], jnp.float32) if mask is None else mask.astype(jnp.float32)
    denom = jnp.maximum(jnp.sum(m), 1.0)
    counts = jnp.sum(jax.nn.one_hot(experts, num_experts, dtype=jnp.float32), axis=1)  # [T, E]
    fraction = jnp.sum(counts * m[:, None], axis=0) / denom
    mean_prob = jnp.sum(probs * m[:, None], axis=0) / denom
    z = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
    router_z = jnp.sum(z**2 * m) / denom
    return fraction, mean_prob, router_z


def load_balancing_loss(fraction: jax.Array, mean_prob: jax.Array, *, scope: str) -> jax.Array:
    """The Switch Transformer load-balancing loss `E * sum_e f_e * P_e` from per-layer stats.

    Args:
        fraction, mean_prob: `[L, E]` per-layer statistics of `router_statistics`.
        scope: `"all_layers"` pools every layer's tokens first (one loss over all layers'
            router logits, as `transformers`' `load_balancing_loss_func`); `"per_layer"`
            computes the loss per layer and averages it.

    It is `top_k` when routing is uniform, in either scope.
    """
    num_experts = fraction.shape[-1]
    if scope == "all_layers":
        # Every layer sees the same tokens (same mask), so pooling = averaging the fractions.
        return num_experts * jnp.sum(jnp.mean(fraction, 0) * jnp.mean(mean_prob, 0))
    return jnp.mean(num_experts * jnp.sum(fraction * mean_prob, axis=-1))
