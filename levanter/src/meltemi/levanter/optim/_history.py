"""A fixed-size rolling history of scalars, as a pure pytree (for clipping and step skipping)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class History(NamedTuple):
    """The last `window` recorded values (a ring buffer) and how many were ever recorded.

    Attributes:
        values: float32 `[window]` ring buffer; slot `count % window` is written next.
        count: int32 number of values recorded so far (not capped at the window).
    """

    values: jax.Array
    count: jax.Array


def history_init(window: int) -> History:
    """An empty history of `window` slots."""
    return History(jnp.zeros((window,), jnp.float32), jnp.zeros((), jnp.int32))


def history_push(h: History, x: jax.Array, record: jax.Array | bool = True) -> History:
    """Records `x` when `record` is true; otherwise returns `h` bit for bit."""
    window = h.values.shape[0]
    slot = h.count % window
    values = h.values.at[slot].set(jnp.asarray(x, jnp.float32))
    record = jnp.asarray(record)
    return History(
        jnp.where(record, values, h.values),
        jnp.where(record, h.count + 1, h.count).astype(jnp.int32),
    )


def history_threshold(h: History, sigma: float, warmup: int) -> jax.Array:
    """`mean + sigma * std` over the recorded window, or +inf while fewer than `warmup` recorded.

    The standard deviation is the population one (divide by n) over the `min(count, window)`
    values held.
    """
    window = h.values.shape[0]
    n = jnp.minimum(h.count, window)
    valid = jnp.arange(window) < n
    nf = jnp.maximum(n, 1).astype(jnp.float32)
    mean = jnp.sum(jnp.where(valid, h.values, 0.0)) / nf
    var = jnp.sum(jnp.where(valid, (h.values - mean) ** 2, 0.0)) / nf
    threshold = mean + jnp.float32(sigma) * jnp.sqrt(var)
    ready = (h.count >= max(int(warmup), 1)) & (n > 0)
    return jnp.where(ready, threshold, jnp.inf).astype(jnp.float32)
