"""The ragged exchange of expert parallelism (`MoeConfig.ep_exchange="ragged"`). Its CPU
emulator for tests (`jax.lax.ragged_all_to_all` from dense collectives) lives in
`meltemi.models.testing`; this module uses public JAX only.

Inside the `shard_map` of `moe._ep`, device d of the expert axis (size n, `El = E / n` experts
each) sorts its kept (token, expert) assignments by expert, so the rows for expert e form one
contiguous chunk, and the chunks for device g's experts follow one another. `counts[s, e]`,
the rows device s sends to expert e, is all-gathered (`n * E` integers); from it every device
computes the same offsets (`layout`):

| call | chunk i of device d (`E` chunks; chunk i goes to device `i // El`) | lands at |
|---|---|---|
| dispatch | d's rows for expert `i` (`counts[d, i]` of them) | `start(i) + rows of sources < d` |
| return | results for source `i // El`, d's expert `i % El` | where that source took them from |

`start(e)` is the number of rows all sources send to the experts of `e`'s device below `e`.
So the receive buffer is grouped by local expert (what `jax.lax.ragged_dot` needs) with no
local permutation, and the return call is the dispatch call with offsets and sizes swapped
(which is also the primitive's transpose rule, so gradients use the same exchange).

A bounded buffer (`layout(..., bound=B)`, `MoeConfig.ep_buffer_factor`) keeps each chunk's
rows that land below row B and clips the rest: chunk (s, e) sends
`clip(B - its offset, 0, counts[s, e])` rows, the same number on both sides of both calls,
since every device computes it from the same `counts`. Offsets increase with (local expert,
source), so what overflows is the tail of that order: the last sources' rows for the last
local experts, and within a chunk the source's last tokens.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NamedTuple

import jax
import jax.numpy as jnp

_ALLOWED_ON_CPU = False
"""True while `allowed_on_cpu` is active: `"ragged"` is then accepted on CPU (tests only)."""


class Layout(NamedTuple):
    """Arguments of the two `ragged_all_to_all` calls on one device (each `[E]` int32, chunk
    `i` addressed to device `i // El`) and the group sizes of its local experts (`[El]`)."""

    send_offsets: jax.Array  # where my rows for expert i start in my sorted rows
    send_sizes: jax.Array  # how many rows I send to expert i
    dest_offsets: jax.Array  # where they land in the receiver's buffer
    recv_offsets: jax.Array  # where chunk (source i // El, my expert i % El) sits in my buffer
    recv_sizes: jax.Array  # its size
    return_offsets: jax.Array  # where its results go back to in the source's rows
    group_sizes: jax.Array  # rows per local expert in my buffer


def _exclusive_cumsum(x: jax.Array, axis: int) -> jax.Array:
    return jnp.cumsum(x, axis=axis) - x


def layout(counts: jax.Array, me: jax.Array, bound: int | None = None) -> Layout:
    """Offsets and sizes of both exchanges on device `me` from the gathered `counts [n, E]`
    (`counts[s, e]`: rows device s sends to expert e), with receive buffers of `bound` rows
    (None: unbounded; rows that would land at or past `bound` are not sent).

    >>> import jax.numpy as jnp
    >>> counts = jnp.array([[1, 2, 0, 3], [2, 0, 1, 1]])  # n=2, E=4
    >>> lay = layout(counts, jnp.int32(1))
    >>> lay.send_sizes.tolist(), lay.dest_offsets.tolist(), lay.recv_sizes.tolist()
    ([2, 0, 1, 1], [1, 5, 0, 4], [0, 3, 1, 1])
    >>> lay.recv_offsets.tolist(), lay.return_offsets.tolist(), lay.group_sizes.tolist()
    ([0, 1, 0, 4], [3, 3, 2, 3], [1, 4])
    >>> lay = layout(counts, jnp.int32(1), bound=3)  # rows 3, 4 of device 1 (expert 3) overflow
    >>> lay.send_sizes.tolist(), lay.recv_sizes.tolist(), lay.group_sizes.tolist()
    ([2, 0, 1, 0], [0, 2, 1, 0], [1, 2])
    >>> lay.dest_offsets.tolist(), lay.recv_offsets.tolist()
    ([1, 0, 0, 0], [0, 1, 0, 0])
    """
    n, num_experts = counts.shape
    local = num_experts // n
    counts = counts.astype(jnp.int32)
    source_offsets = _exclusive_cumsum(counts, axis=1)  # [s, e]: in source s's sorted rows
    total = jnp.sum(counts, axis=0).reshape(n, local)  # rows per expert, by device
    base = _exclusive_cumsum(total, axis=1).reshape(num_experts)  # expert e's start on its device
    buffer_offsets = base[None, :] + _exclusive_cumsum(counts, axis=0)  # [s, e]: on e's device
    if bound is not None:
        # Chunks past the first clipped one are empty, so the kept ones keep their offsets
        # and each local expert's kept rows stay contiguous from its start.
        counts = jnp.clip(bound - buffer_offsets, 0, counts)
        total = jnp.sum(counts, axis=0).reshape(n, local)
        # Chunks emptied by the bound point at row 0: an offset one past the buffer's end,
        # even with nothing to send, is outside what the op documents.
        buffer_offsets = jnp.where(buffer_offsets >= bound, 0, buffer_offsets)

    def mine(a: jax.Array) -> jax.Array:  # [s, e] -> chunk (s, my local expert) -> [n * El]
        return jax.lax.dynamic_index_in_dim(a.reshape(n, n, local), me, 1, False).reshape(-1)

    return Layout(
        send_offsets=source_offsets[me],
        send_sizes=counts[me],
        dest_offsets=buffer_offsets[me],
        recv_offsets=mine(buffer_offsets),
        recv_sizes=mine(counts),
        return_offsets=mine(source_offsets),
        group_sizes=jax.lax.dynamic_index_in_dim(total, me, 0, False),
    )


def dispatch(rows: jax.Array, lay: Layout, buffer_rows: int, axis: str) -> jax.Array:
    """Sends each of my sorted `rows [A, D]` to its expert's device: `[buffer_rows, D]`,
    grouped by local expert (rows past `sum(lay.group_sizes)` are zero)."""
    out = jnp.zeros((buffer_rows, *rows.shape[1:]), rows.dtype)
    return jax.lax.ragged_all_to_all(
        rows, out, lay.send_offsets, lay.send_sizes, lay.dest_offsets, lay.recv_sizes,
        axis_name=axis,
    )  # fmt: skip


def give_back(results: jax.Array, lay: Layout, num_rows: int, axis: str) -> jax.Array:
    """The inverse route of `dispatch`: each result row returns to its place in its source's
    sorted rows (`[num_rows, D]`; rows that were not sent stay zero)."""
    out = jnp.zeros((num_rows, *results.shape[1:]), results.dtype)
    return jax.lax.ragged_all_to_all(
        results, out, lay.recv_offsets, lay.recv_sizes, lay.return_offsets, lay.send_sizes,
        axis_name=axis,
    )  # fmt: skip


@contextlib.contextmanager
def allowed_on_cpu() -> Iterator[None]:
    """Within: `MoeConfig.ep_exchange="ragged"` is accepted on CPU.

    For `meltemi.models.testing.ragged_all_to_all_on_cpu`, which installs a CPU lowering of
    `ragged_all_to_all` (XLA:CPU has none) around this block; nothing here touches JAX.
    """
    global _ALLOWED_ON_CPU
    before, _ALLOWED_ON_CPU = _ALLOWED_ON_CPU, True
    try:
        yield
    finally:
        _ALLOWED_ON_CPU = before


def is_allowed_on_cpu() -> bool:
    """Whether `allowed_on_cpu` is active."""
    return _ALLOWED_ON_CPU
