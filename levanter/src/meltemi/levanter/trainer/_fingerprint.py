"""`data/batch_hash`: a 64-bit fingerprint of a global batch's token ids, computed on device.

Each token is mixed with its position in the global batch and the mixes are summed with
wrapping uint32 arithmetic, which is associative: the fingerprint is the same whatever the
mesh, slice count or reduction tree, and changes when any token or row moves.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _mix(h: jax.Array) -> jax.Array:
    # The murmur3 32-bit finaliser: every input bit affects every output bit.
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


@jax.jit
def _lanes(tokens: jax.Array) -> jax.Array:
    x = tokens.astype(jnp.uint32)
    pos = jnp.arange(x.size, dtype=jnp.uint32).reshape(x.shape)
    a = jnp.sum(_mix(x * jnp.uint32(0x9E3779B1) + pos), dtype=jnp.uint32)
    b = jnp.sum(_mix((x ^ jnp.uint32(0x5BD1E995)) + pos * jnp.uint32(0x27D4EB2F)), dtype=jnp.uint32)
    return jnp.stack([a, b])


def batch_fingerprint(tokens: jax.Array | np.ndarray) -> jax.Array:
    """The fingerprint's two uint32 lanes, on device (call `fingerprint_value` to read it)."""
    return _lanes(tokens)


def fingerprint_value(lanes: jax.Array | np.ndarray) -> int:
    """The fingerprint as one int below 2**64 (read from device)."""
    a, b = (int(v) for v in np.asarray(jax.device_get(lanes)))
    return (a << 32) | b
