"""The JAX parts of meltemi.data: a jitted Feistel twin and device prefetch (needs `[jax]`).

`feistel_jax(perm)` returns a jitted function computing exactly `perm(indices)` for a
`FeistelPermutation` of length at most `2**32` (uint32 lanes; JAX's default 32-bit mode).
`device_prefetch(...)` wraps `meltemi.data.Prefetcher` and puts each batch on device.

>>> import numpy as np
>>> from meltemi.data.permutation import FeistelPermutation
>>> p = FeistelPermutation(1000, seed=5)
>>> f = feistel_jax(p)
>>> bool(np.array_equal(np.asarray(f(np.arange(1000, dtype=np.uint32))), p(np.arange(1000))))
True
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from meltemi.data._prefetch import Prefetcher
from meltemi.data.permutation import FeistelPermutation

__all__ = ["device_prefetch", "feistel_jax"]

_MUL1 = 0x7FEB352D
_MUL2 = 0x846CA68B


def _round_fn(r: jax.Array, key: int) -> jax.Array:
    h = r ^ jnp.uint32(key)
    h = h ^ (h >> 16)
    h = h * jnp.uint32(_MUL1)
    h = h ^ (h >> 15)
    h = h * jnp.uint32(_MUL2)
    return h ^ (h >> 16)


def _reduce(h: jax.Array, m: jax.Array) -> jax.Array:
    """floor(h * m / 2**32) for m <= 2**16, in uint32 arithmetic (see permutation._reduce32)."""
    return (((h >> 16) * m) + (((h & jnp.uint32(0xFFFF)) * m) >> 16)) >> 16


def _network(x: jax.Array, keys: tuple[int, ...], a: int, b: int, inverse: bool) -> jax.Array:
    """The same mixed-radix Feistel network as `FeistelPermutation._network` (uint32)."""
    rounds = len(keys)
    m_left, m_right = (a, b) if not inverse or rounds % 2 == 0 else (b, a)
    left = x // jnp.uint32(m_right)
    right = x - left * jnp.uint32(m_right)
    for key in reversed(keys) if inverse else keys:
        if not inverse:
            m = jnp.uint32(m_left)
            t = left + _reduce(_round_fn(right, key), m)
            left, right = right, jnp.minimum(t, t - m)
        else:
            m = jnp.uint32(m_right)
            t = right + (m - _reduce(_round_fn(left, key), m))
            left, right = jnp.minimum(t, t - m), left
        m_left, m_right = m_right, m_left
    return left * jnp.uint32(m_right) + right


_CHUNK = 1 << 14  # lanes per lax.map step: cache-resident, and walked only if one needs it


@functools.lru_cache(maxsize=64)
def _compiled(length: int, keys: tuple[int, ...], a: int, b: int, inverse: bool) -> Callable:
    last = jnp.uint32(length - 1)  # length may be 2**32: compare with <= length - 1.
    exact = a * b == length

    def net(y):
        return _network(y, keys, a, b, inverse)

    def walk_all(y):
        step = lambda y: jnp.where(y > last, net(y), y)
        return jax.lax.while_loop(lambda y: jnp.any(y > last), step, y)

    def chunk(c):
        y = net(c)
        if exact:
            return y
        # Fewer than 1 / sqrt(length) of the lanes leave [0, length): most chunks skip this.
        return jax.lax.cond(jnp.any(y > last), walk_all, lambda y: y, y)

    def apply(indices: jax.Array) -> jax.Array:
        shape = indices.shape
        flat = indices.reshape(-1).astype(jnp.uint32)
        size = flat.size
        if size == 0:
            return flat.reshape(shape)
        width = min(_CHUNK, size)
        rows = -(-size // width)
        if rows * width != size:  # pad with 0, a valid index, and drop it afterwards
            flat = jnp.pad(flat, (0, rows * width - size))
        out = jax.lax.map(chunk, flat.reshape(rows, width)).reshape(-1)
        return (out if rows * width == size else out[:size]).reshape(shape)

    return jax.jit(apply)


def feistel_jax(perm: FeistelPermutation, *, inverse: bool = False) -> Callable:
    """A jitted function `indices -> perm(indices)` (or `perm.inverse`) returning uint32.

    Outputs are bit-identical to the numpy `perm(indices)`. Indices outside `[0, length)` give
    unspecified results (there is no bounds check on device).

    Raises:
        ValueError: if `perm.length > 2**32` (use the numpy permutation, or shard the range).
    """
    if not isinstance(perm, FeistelPermutation):
        raise TypeError(f"feistel_jax needs a FeistelPermutation, got {type(perm).__name__}")
    if perm.length > 1 << 32:
        raise ValueError(
            f"feistel_jax: length {perm.length} exceeds 2**32, the range of uint32 lanes; "
            f"use the numpy FeistelPermutation for this length"
        )
    a, b = perm.radices
    return _compiled(perm.length, perm.keys, a, b, inverse)


def device_prefetch(
    batch_fn: Callable[[int], dict[str, np.ndarray]],
    steps: Iterable[int],
    *,
    depth: int = 2,
    sharding: Any = None,
) -> Iterator[tuple[int, dict[str, jax.Array]]]:
    """Yields `(step, batch)` with batches computed ahead in a thread and put on device.

    Args:
        batch_fn: `step -> dict of numpy arrays`, e.g. `functools.partial(dataset.batch,
            process_index=jax.process_index(), process_count=jax.process_count())`.
        steps: the steps to produce, in order.
        depth: how many batches to keep ready.
        sharding: a `jax.sharding.Sharding` for every array (default: the first device). With
            several processes, each passes its local rows and the global array is assembled
            with `jax.make_array_from_process_local_data`.

    >>> it = device_prefetch(lambda s: {"x": np.full((2,), s)}, range(3), depth=1)
    >>> [(s, b["x"].tolist()) for s, b in it]
    [(0, [0, 0]), (1, [1, 1]), (2, [2, 2])]
    """

    def put(batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        if sharding is None:
            return jax.device_put(batch)
        if jax.process_count() > 1:
            return {
                k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()
            }
        return jax.device_put(batch, sharding)

    with Prefetcher(batch_fn, steps, depth=depth, transform=put) as prefetcher:
        yield from prefetcher
