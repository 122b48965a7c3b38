"""Array checksums computed where the arrays live (on their devices), independent of sharding.

`checksum(x) = sum_i word_i * (2 * (i * K mod 2^32) + 1)  mod 2^32` over the array's 32-bit
words `word_i` in row-major order (16- and 8-bit elements widened, 64-bit ones split), with
K = 2654435761 (Knuth's multiplicative hash). Every weight is odd, so any change of a single
word changes the sum; position-dependent weights catch swapped elements. It is one fused
elementwise-and-reduce pass in device memory: under a mesh each device reduces its own shard
and XLA adds the partial sums, so its cost does not grow with the checkpoint's file count,
never reads a file back, and the value is the same on any mesh (a checkpoint restored onto
another layout checks against the same number).

This replaces hashing every file with SHA-256 on process 0 after each save and before each
restore (a second full read of the checkpoint, on one host); see `levanter/bin/bench.py`.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

_K = np.uint32(2654435761)


def _words(x: jax.Array) -> jax.Array:
    """The array's bits as a flat uint32 vector."""
    x = jnp.ravel(x)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    size = jnp.dtype(x.dtype).itemsize
    if size == 4:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)
    if size == 2:
        return jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
    if size == 1:
        return jax.lax.bitcast_convert_type(x, jnp.uint8).astype(jnp.uint32)
    if size == 8:
        return jnp.ravel(jax.lax.bitcast_convert_type(x, jnp.uint32))
    raise TypeError(f"cannot checksum dtype {x.dtype}")


def _checksum(x: jax.Array) -> jax.Array:
    words = _words(x)
    index = jax.lax.iota(jnp.uint32, words.shape[0])
    weights = (index * _K) * jnp.uint32(2) + jnp.uint32(1)  # uint32 arithmetic wraps mod 2^32
    return jnp.sum(words * weights, dtype=jnp.uint32)


@jax.jit
def _checksums(arrays: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    return {k: _checksum(v) for k, v in arrays.items()}


def checksums(arrays: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """Device-side checksums (uint32 scalars, still on device) of `arrays`, by name.

    Dispatched asynchronously: fetch them later (`jax.device_get`) to overlap with other work.

    Example:
        >>> import jax.numpy as jnp
        >>> a = checksums({"x": jnp.arange(4.0)})["x"]
        >>> b = checksums({"x": jnp.arange(4.0).at[3].set(3.5)})["x"]
        >>> int(a) != int(b)
        True
    """
    return _checksums(dict(arrays))


def fetch(sums: Mapping[str, jax.Array]) -> dict[str, int]:
    """The checksums as Python ints (blocks until computed)."""
    return {k: int(v) for k, v in jax.device_get(dict(sums)).items()}
