"""Cross-entropy over a large vocabulary without the full `(tokens, vocab)` logits.

`blockwise_cross_entropy` computes the output projection, the log-normaliser, the cross-entropy
and the z-loss one block of vocabulary rows at a time, forward and backward (its own VJP), so
the largest live temporary is `(tokens, block)` instead of `(tokens, vocab)` in float32, and
nothing of that size is kept between the forward and the backward pass (only the per-token
log-normaliser is). The backward pass recomputes each block's logits once.

With a final soft cap (Gemma 2) the logits are `l_t = cap * tanh(W h_t / cap)`; the backward
pass multiplies `d / d l_t` by `1 - tanh(W h_t / cap)^2 = 1 - (l_t / cap)^2` (chain rule).

For token `t` with weight `w_t` (0 for masked tokens), target `y_t` and logits `l_t = W h_t`:

    ce_sum = sum_t w_t * (lse(l_t) - l_t[y_t])        z_sum = sum_t w_t * lse(l_t)^2

    d ce_sum / d l_t = w_t * (softmax(l_t) - onehot(y_t))
    d z_sum  / d l_t = w_t * 2 * lse(l_t) * softmax(l_t)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def _blocks(vocab: int, block: int) -> tuple[int, int]:
    """(number of full blocks, size of the tail block) for `vocab` rows."""
    return vocab // block, vocab % block


def _block_logits(h: jax.Array, w_block: jax.Array, softcap: float | None) -> jax.Array:
    logits = jnp.einsum("td,vd->tv", h, w_block, preferred_element_type=jnp.float32)
    return logits if softcap is None else softcap * jnp.tanh(logits / softcap)


def _forward_stats(
    h: jax.Array, w: jax.Array, targets: jax.Array, block: int, softcap: float | None
) -> tuple[jax.Array, jax.Array]:
    """Per-token log-normaliser and target logit, one vocabulary block at a time."""
    tokens = h.shape[0]
    full, tail = _blocks(w.shape[0], block)

    def update(carry, logits, start):
        m, s, target = carry
        new_m = jnp.maximum(m, jnp.max(logits, axis=-1))
        s = s * jnp.exp(m - new_m) + jnp.sum(jnp.exp(logits - new_m[:, None]), axis=-1)
        local = targets - start
        inside = (local >= 0) & (local < logits.shape[-1])
        picked = jnp.take_along_axis(logits, jnp.clip(local, 0, logits.shape[-1] - 1)[:, None], -1)
        target = target + jnp.where(inside, picked[:, 0], 0.0)
        return new_m, s, target

    def body(carry, i):
        start = i * block
        logits = _block_logits(h, jax.lax.dynamic_slice_in_dim(w, start, block), softcap)
        return update(carry, logits, start), None

    init = (
        jnp.full((tokens,), -jnp.inf, jnp.float32),
        jnp.zeros((tokens,), jnp.float32),
        jnp.zeros((tokens,), jnp.float32),
    )
    carry, _ = jax.lax.scan(body, init, jnp.arange(full))
    if tail:
        carry = update(carry, _block_logits(h, w[full * block :], softcap), full * block)
    m, s, target = carry
    return m + jnp.log(s), target


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _ce_and_z(
    h: jax.Array,
    w: jax.Array,
    targets: jax.Array,
    weights: jax.Array,
    block: int,
    softcap: float | None,
) -> tuple[jax.Array, jax.Array]:
    lse, target = _forward_stats(h, w, targets, block, softcap)
    return jnp.sum(weights * (lse - target)), jnp.sum(weights * lse * lse)


def _fwd(h, w, targets, weights, block, softcap):
    lse, target = _forward_stats(h, w, targets, block, softcap)
    out = (jnp.sum(weights * (lse - target)), jnp.sum(weights * lse * lse))
    return out, (h, w, targets, weights, lse)


def _bwd(block, softcap, residuals, cotangents):
    h, w, targets, weights, lse = residuals
    g_ce, g_z = cotangents
    full, tail = _blocks(w.shape[0], block)
    # Per token: d/dlogits = a_t * softmax - c_t * onehot(target).
    a = weights * (g_ce + 2.0 * g_z * lse)
    c = weights * g_ce

    def grads(logits, start, w_block):
        p = jnp.exp(logits - lse[:, None])
        local = targets - start
        onehot = jnp.arange(logits.shape[-1])[None, :] == local[:, None]
        d_logits = a[:, None] * p - jnp.where(onehot, c[:, None], 0.0)
        if softcap is not None:  # through cap * tanh(x / cap): times 1 - tanh(x / cap)^2
            d_logits = d_logits * (1.0 - jnp.square(logits / softcap))
        dh = jnp.einsum("tv,vd->td", d_logits, w_block, preferred_element_type=jnp.float32)
        dw = jnp.einsum("tv,td->vd", d_logits, h, preferred_element_type=jnp.float32)
        return dh, dw

    def body(dh, i):
        start = i * block
        w_block = jax.lax.dynamic_slice_in_dim(w, start, block)
        dh_i, dw_i = grads(_block_logits(h, w_block, softcap), start, w_block)
        return dh + dh_i, dw_i.astype(w.dtype)

    dh, dw = jax.lax.scan(body, jnp.zeros(h.shape, jnp.float32), jnp.arange(full))
    dw = dw.reshape(full * block, w.shape[1])
    if tail:
        w_tail = w[full * block :]
        dh_t, dw_t = grads(_block_logits(h, w_tail, softcap), full * block, w_tail)
        dh = dh + dh_t
        dw = jnp.concatenate([dw, dw_t.astype(w.dtype)], axis=0)
    return dh.astype(h.dtype), dw, None, jnp.zeros_like(weights)


_ce_and_z.defvjp(_fwd, _bwd)


def blockwise_cross_entropy(
    hidden: jax.Array,
    weight: jax.Array,
    targets: jax.Array,
    weights: jax.Array,
    *,
    block: int,
    softcap: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Weighted sums of the cross-entropy and of the squared log-normaliser (z-loss).

    Args:
        hidden: `[T, D]` final hidden states (any float dtype; logits are float32).
        weight: `[V, D]` output projection (the unembedding), rows are vocabulary entries.
        targets: `[T]` integer target ids in `[0, V)`.
        weights: `[T]` float token weights (the loss mask; 0 drops a token).
        block: vocabulary rows per block; `V` need not be a multiple.
        softcap: final-logit soft cap (Gemma 2): logits become `softcap * tanh(logits /
            softcap)` before the softmax; `None` leaves them as they are.

    Returns:
        `(sum_t w_t * ce_t, sum_t w_t * lse_t ** 2)`, differentiable in `hidden` and `weight`.

    >>> import jax.numpy as jnp
    >>> h, w = jnp.ones((2, 3)), jnp.zeros((5, 3))
    >>> ce, z = blockwise_cross_entropy(h, w, jnp.array([0, 4]), jnp.ones(2), block=2)
    >>> round(float(ce), 4), round(float(z), 4)  # uniform over 5: 2 * log(5), 2 * log(5)^2
    (3.2189, 5.1806)
    """
    if block <= 0:
        raise ValueError(f"block={block}: must be a positive number of vocabulary rows")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap={softcap}: must be a positive float or None (no cap)")
    block = min(block, weight.shape[0])
    softcap = None if softcap is None else float(softcap)
    targets, weights = targets.astype(jnp.int32), weights.astype(jnp.float32)
    return _ce_and_z(hidden, weight, targets, weights, block, softcap)
