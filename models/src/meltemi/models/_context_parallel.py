"""Sequence (context) parallelism: attention over a `position` axis split across devices.

The mapping `{"position": "sequence"}` (any mesh axis name) splits every activation's
`position` axis over a mesh axis of `n` devices; everything position-wise (embeddings,
norms, MLP, the loss head) then runs on each device's own slots under GSPMD. Attention is
the one op that mixes positions; with `ModelConfig.sequence_parallel` set it runs under
`shard_map` with one of two strategies:

* `"all_gather"`: each device gathers the keys and values of the whole sequence
  (`jax.lax.all_gather`) and folds them into its queries' online softmax one block after
  the other (the backward gathers again and reduce-scatters the key/value gradients).
  Simple, best at moderate lengths: each device holds `n` times its own keys and values.
* `"ring"`: keys and values travel around the ring of devices (`jax.lax.ppermute`), one
  block per step, while each device folds each block into an online softmax of its
  queries. The send of the next block is issued before the compute of the current one and
  does not depend on it, so the transfer overlaps the compute. Each device only ever holds
  two key/value blocks. The backward pass is a second ring (custom VJP): keys and values
  travel again, with their gradients accumulated along the way and arriving home after
  `n` steps.

**Causal load balancing.** Under a causal mask the device holding the end of a sequence
does most of the work. Before the first layer the sequence is cut into `2n` chunks and
device `i` gets chunks `i` and `2n - 1 - i` (`balance`): every device then has the same
share of the causal triangle. The permutation is applied once, to the tokens, segment ids,
positions, targets and loss weights, and undone on the logits (`unbalance`); the loss is a
sum over tokens and needs no undoing. The mask compares each slot's global position
(`q_index`, `k_index` of `MaskSpec`), so it is exact under any order.

Both strategies share one kernel (`_forward` / `_backward` under one custom VJP, `_split`):
the online-softmax step over a block of keys, in blocks of queries (`query_block`), with the
mask built from global positions, packed segment ids, sliding windows (static or a per-layer
traced flag) and logit soft caps.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import meltemi.haliax as hax
from meltemi.haliax import partitioning
from meltemi.models._axes import (
    BATCH,
    HEAD_SIZE,
    KEY_POSITION,
    KV_HEADS,
    POSITION,
    Q_HEADS_PER_GROUP,
)
from meltemi.models._config import SEQUENCE_PARALLEL, ConfigError

__all__ = ["balance", "sequence_split", "split_attention", "unbalance"]

_NEG = -1e30
"""Logit of a masked key (finite, so a block whose keys are all masked gives no NaN)."""


def sequence_split(strategy: str, length: int) -> int:
    """Devices the active mapping splits `position` over (1: no split), validated.

    Args:
        strategy: `ModelConfig.sequence_parallel`.
        length: the sequence length (`position` size).

    Raises:
        ConfigError: the length is not a multiple of twice the split (two chunks per device),
            or `key_position` is mapped too.
    """
    if strategy == "none":
        return 1
    mapping = partitioning.current_thread_local_mapping() or {}
    phys = mapping.get(POSITION)
    mesh = partitioning.current_mesh()
    if phys is None or mesh is None:
        return 1
    if mapping.get(KEY_POSITION) is not None:
        raise ConfigError(
            f"axis mapping {{'key_position': {mapping[KEY_POSITION]!r}}} with "
            f"sequence_parallel={strategy!r}: keys are split along 'position' like the "
            "queries and exchanged by the attention. Fix: remove 'key_position' from the mapping"
        )
    n = partitioning.physical_axis_size(POSITION, mapping, mesh)
    if n > 1 and length % (2 * n):
        fit = -(-length // (2 * n)) * (2 * n)
        raise ConfigError(
            f"sequence length {length} with sequence_parallel={strategy!r}: 'position' is split "
            f"over mesh axis {phys!r} of {n} devices, two chunks each (causal load balancing), "
            f"so the length must be a multiple of {2 * n}. Fix: pad the sequence to {fit} tokens "
            "(segment id -1 on the padding)"
        )
    return n


def _balanced_order(x: jax.Array, n: int, axis: int) -> jax.Array:
    """`x` with `axis` cut into `2n` chunks reordered `0, 2n-1, 1, 2n-2, ...`."""
    x = jnp.moveaxis(x, axis, 0)
    c = x.shape[0] // (2 * n)
    halves = x.reshape(2, n, c, *x.shape[1:])
    pairs = jnp.stack([halves[0], jnp.flip(halves[1], axis=0)], axis=1)
    return jnp.moveaxis(pairs.reshape(x.shape), 0, axis)


def _natural_order(x: jax.Array, n: int, axis: int) -> jax.Array:
    """Inverse of `_balanced_order`."""
    x = jnp.moveaxis(x, axis, 0)
    c = x.shape[0] // (2 * n)
    pairs = x.reshape(n, 2, c, *x.shape[1:])
    out = jnp.concatenate([pairs[:, 0], jnp.flip(pairs[:, 1], axis=0)], axis=0)
    return jnp.moveaxis(out.reshape(x.shape), 0, axis)


def balance(x: hax.NamedArray, n: int) -> hax.NamedArray:
    """`x` with its `position` slots in load-balanced order for a split over `n` devices.

    Device `i` of the split gets chunks `i` and `2n - 1 - i` of `2n` equal chunks.

    >>> import meltemi.haliax as hax
    >>> balance(hax.arange(hax.Axis("position", 8)), 2).array.tolist()
    [0, 1, 6, 7, 2, 3, 4, 5]
    """
    if n <= 1:
        return x
    return hax.named(_balanced_order(x.array, n, x.axis_index(POSITION)), x.axes)


def unbalance(x: hax.NamedArray, n: int) -> hax.NamedArray:
    """Inverse of `balance`: the `position` slots back in their natural order."""
    if n <= 1:
        return x
    return hax.named(_natural_order(x.array, n, x.axis_index(POSITION)), x.axes)


# -- the kernel --------------------------------------------------------------------------------
def _block_mask(qi, ki, qs, ks, window, traced, sliding):
    """`[B, Sq, Sk]` bool: causal by global position, within a segment, inside the window
    (where the traced per-layer flag `sliding` is true, when `traced`)."""
    m = qi[:, :, None] >= ki[:, None, :]
    if window is not None:
        near = (qi[:, :, None] - ki[:, None, :]) < window
        m = m & (near | ~sliding if traced else near)
    if qs is not None:
        m = m & (qs[:, :, None] == ks[:, None, :])
    return m


def _scores(q, k, qi, ki, qs, ks, opts, sliding):
    """Masked logits `[B, K, G, Sq, Sk]` (float32) and the capped logits before masking."""
    scale, softcap, window, traced = opts
    s = jnp.einsum("bqkgd,bskd->bkgqs", q, k, preferred_element_type=jnp.float32) * scale
    if softcap is not None:
        s = softcap * jnp.tanh(s / softcap)
    mask = _block_mask(qi, ki, qs, ks, window, traced, sliding)[:, None, None]
    return jnp.where(mask, s, _NEG), s, mask


def _fold(carry, q, k, v, qi, ki, qs, ks, opts, sliding):
    """One online-softmax step: `(o, m, l)` of a block of queries updated with a key block."""
    o, m, lsum = carry
    s, _, mask = _scores(q, k, qi, ki, qs, ks, opts, sliding)
    new_m = jnp.maximum(m, jnp.max(s, axis=-1))
    p = jnp.where(mask, jnp.exp(s - new_m[..., None]), 0.0)
    decay = jnp.exp(m - new_m)
    lsum = lsum * decay + jnp.sum(p, axis=-1)
    pv = jnp.einsum("bkgqs,bskd->bkgqd", p, v.astype(jnp.float32))
    return o * decay[..., None] + pv, new_m, lsum


def _q_blocks(x, nb, axis=1):
    """Split axis `axis` (queries) of `x` into `nb` blocks, leading: `[nb, ..., Sq/nb, ...]`."""
    if x is None:
        return None
    shape = x.shape[:axis] + (nb, x.shape[axis] // nb) + x.shape[axis + 1 :]
    return jnp.moveaxis(x.reshape(shape), axis, 0)


def _q_unblocks(x, axis):
    """Inverse of `_q_blocks` (the block axis leading, the in-block axis at `axis`)."""
    x = jnp.moveaxis(x, 0, axis)
    return x.reshape(x.shape[:axis] + (x.shape[axis] * x.shape[axis + 1],) + x.shape[axis + 2 :])


def _ring(x, axis, n):
    """Every device's `x` sent to the next device of the ring (`i -> i + 1 mod n`)."""
    return jax.lax.ppermute(x, axis, [(i, (i + 1) % n) for i in range(n)])


def _forward(q, k, v, qi, ki, qs, ks, sliding, axis, n, nb, opts, gathered):
    """`(out [B, K, G, Sq, D] float32, lse [B, K, G, Sq])` over `n` key blocks: around the
    ring, or (`gathered`: all keys already here) one block after the other."""
    b, sq, kh, g, _ = q.shape
    qb = [_q_blocks(x, nb) for x in (q, qi, qs)]

    def fold_all(stats, kv):
        kb, vb, kib, ksb = kv

        def one(args):
            st, qx, qix, qsx = args
            return _fold(st, qx, kb, vb, qix, kib, qsx, ksb, opts, sliding)

        return jax.lax.map(one, (stats, *qb))

    shape = (nb, b, kh, g, sq // nb)
    stats = (
        jnp.zeros((*shape, q.shape[-1]), jnp.float32),
        jnp.full(shape, _NEG, jnp.float32),
        jnp.zeros(shape, jnp.float32),
    )
    kv = (k, v, ki, ks)
    if gathered:
        blocks = tuple(None if x is None else _q_blocks(x, n) for x in kv)
        stats, _ = jax.lax.scan(lambda st, kvb: (fold_all(st, kvb), None), stats, blocks)
        o, m, lsum = (_q_unblocks(x, 3) for x in stats)
        return o / lsum[..., None], m + jnp.log(lsum)
    if n > 1:

        def step(carry, _):
            stats, kv = carry
            sent = _ring(kv, axis, n)  # issued first: independent of this step's compute
            return (fold_all(stats, kv), sent), None

        (stats, kv), _ = jax.lax.scan(step, (stats, kv), None, length=n - 1)
    o, m, lsum = fold_all(stats, kv)
    o, m, lsum = (_q_unblocks(x, 3) for x in (o, m, lsum))
    return o / lsum[..., None], m + jnp.log(lsum)


def _backward(q, k, v, qi, ki, qs, ks, sliding, out, lse, dout, axis, n, nb, opts, gathered):
    """`(dq, dk, dv)` in float32. Ring: keys, values and their gradients go round once more
    (`n` hops, so the gradients arrive at the keys' own device). `gathered`: the `n` key
    blocks are all here; `dk`, `dv` are for all of them."""
    scale, softcap, _, _ = opts
    dout = jnp.moveaxis(dout.astype(jnp.float32), 1, 3)  # [B, K, G, Sq, D]
    delta = jnp.sum(dout * jnp.moveaxis(out.astype(jnp.float32), 1, 3), axis=-1)
    qb = [_q_blocks(x, nb) for x in (q, qi, qs)]
    sb = [_q_blocks(x, nb, 3) for x in (dout, lse, delta)]

    def grads(kv, dq):
        """This key block's contribution to dq (all query blocks), dk and dv."""
        kb, vb, kib, ksb = kv

        def one(acc, args):
            dk, dv = acc
            qx, qix, qsx, dox, lsex, dlx = args
            s, capped, mask = _scores(qx, kb, qix, kib, qsx, ksb, opts, sliding)
            p = jnp.where(mask, jnp.exp(s - lsex[..., None]), 0.0)
            dv = dv + jnp.einsum("bkgqs,bkgqd->bskd", p, dox)
            dp = jnp.einsum("bkgqd,bskd->bkgqs", dox, vb.astype(jnp.float32))
            ds = p * (dp - dlx[..., None])
            if softcap is not None:  # through cap * tanh(x / cap)
                ds = ds * (1.0 - jnp.square(capped / softcap))
            ds = ds * scale
            dq_x = jnp.einsum("bkgqs,bskd->bqkgd", ds, kb.astype(jnp.float32))
            dk = dk + jnp.einsum("bkgqs,bqkgd->bskd", ds, qx.astype(jnp.float32))
            return (dk, dv), dq_x

        zeros = jnp.zeros(kb.shape, jnp.float32)
        (dk, dv), dq_blocks = jax.lax.scan(one, (zeros, zeros), (*qb, *sb))
        return dq + _q_unblocks(dq_blocks, 1), dk, dv

    dq = jnp.zeros(q.shape, jnp.float32)
    kv = (k, v, ki, ks)
    if gathered:
        blocks = tuple(None if x is None else _q_blocks(x, n) for x in kv)

        def body(dq, kvb):
            dq, dk, dv = grads(kvb, dq)
            return dq, (dk, dv)

        dq, (dk, dv) = jax.lax.scan(body, dq, blocks)
        return dq, _q_unblocks(dk, 1), _q_unblocks(dv, 1)
    if n == 1:
        return grads(kv, dq)

    def step(carry, _):
        kv, dq, dkv = carry
        sent = _ring(kv, axis, n)  # overlaps this step's compute
        dq, dk, dv = grads(kv, dq)
        # The gradients received from the previous device join after the compute.
        dkv = _ring((dkv[0] + dk, dkv[1] + dv), axis, n)
        return (sent, dq, dkv), None

    zeros = jnp.zeros(k.shape, jnp.float32)
    (kv, dq, dkv), _ = jax.lax.scan(step, (kv, dq, (zeros, zeros)), None, length=n - 1)
    dq, dk, dv = grads(kv, dq)
    dk, dv = _ring((dkv[0] + dk, dkv[1] + dv), axis, n)  # the n-th hop: home
    return dq, dk, dv


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Static description of one split attention call (hashable, a `custom_vjp` argument).

    Attributes:
        mesh: the mesh.
        axis: the mesh axis (or axes) `position` is split over.
        n: devices along it.
        strategy: `"all_gather"` or `"ring"`.
        nb: query blocks per device.
        opts: `(scale, softcap, window, traced_flag)`.
        q_spec, kv_spec, index_spec, lse_spec: PartitionSpecs of `[B, S, K, G, D]`,
            `[B, S, K, D]`, `[B, S]` and `[B, K, G, S]`.
    """

    mesh: Any
    axis: Any
    n: int
    strategy: str
    nb: int
    opts: tuple
    q_spec: P
    kv_spec: P
    index_spec: P
    lse_spec: P

    def shard_map(self, fn, in_specs, out_specs):
        return jax.shard_map(
            fn, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False
        )

    def in_specs(self, qs):
        idx = self.index_spec
        seg = None if qs is None else idx
        return (self.q_spec, self.kv_spec, self.kv_spec, idx, idx, seg, seg, P())

    @property
    def gathered(self) -> bool:
        return self.strategy == "all_gather"

    def gather(self, k, v, ki, ks):
        if not self.gathered:
            return k, v, ki, ks
        return tuple(None if x is None else jax.lax.all_gather(x, self.axis, axis=1, tiled=True)
                     for x in (k, v, ki, ks))  # fmt: skip


# The custom VJP sits outside the shard_map: differentiation sees one opaque call whose only
# residuals are q, k, v, the output and the log-normaliser (inside a differentiated shard_map
# JAX would hoist the integer-only masks of every block out as residuals).
@functools.partial(jax.custom_vjp, nondiff_argnums=(8,))
def _split(q, k, v, qi, ki, qs, ks, flag, plan: _Plan):
    return _split_fwd(q, k, v, qi, ki, qs, ks, flag, plan)[0]


def _split_fwd(q, k, v, qi, ki, qs, ks, flag, plan: _Plan):
    def local(q, k, v, qi, ki, qs, ks, flag):
        k, v, ki, ks = plan.gather(k, v, ki, ks)
        out, lse = _forward(
            q, k, v, qi, ki, qs, ks, flag, plan.axis, plan.n, plan.nb, plan.opts, plan.gathered
        )
        return jnp.moveaxis(out, 3, 1).astype(q.dtype), lse

    run = plan.shard_map(local, plan.in_specs(qs), (plan.q_spec, plan.lse_spec))
    # Under a rematerialised layer JAX re-traces this forward and would compute everything
    # that depends only on the integer inputs (every block's mask) once, keeping it for the
    # recompute: tying them to `q` makes the recompute rebuild each mask where it is used.
    q, qi, ki, qs, ks, flag = jax.lax.optimization_barrier((q, qi, ki, qs, ks, flag))
    out, lse = run(q, k, v, qi, ki, qs, ks, flag)
    return out, (q, k, v, qi, ki, qs, ks, flag, out, lse)


def _split_bwd(plan: _Plan, res, dout):
    q, k, v, qi, ki, qs, ks, flag, out, lse = res

    def local(q, k, v, qi, ki, qs, ks, flag, out, lse, dout):
        k_all, v_all, ki, ks = plan.gather(k, v, ki, ks)
        dq, dk, dv = _backward(
            q, k_all, v_all, qi, ki, qs, ks, flag, out, lse, dout, plan.axis, plan.n, plan.nb,
            plan.opts, plan.gathered,
        )  # fmt: skip
        if plan.gathered:  # the transpose of the gather: a reduce-scatter
            dk, dv = (jax.lax.psum_scatter(x, plan.axis, scatter_dimension=1, tiled=True)
                      for x in (dk, dv))  # fmt: skip
        return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)

    specs = (*plan.in_specs(qs), plan.q_spec, plan.lse_spec, plan.q_spec)
    run = plan.shard_map(local, specs, (plan.q_spec, plan.kv_spec, plan.kv_spec))
    dq, dk, dv = run(q, k, v, qi, ki, qs, ks, flag, out, lse, dout)
    return dq, dk, dv, None, None, None, None, None


_split.defvjp(_split_fwd, _split_bwd)


def _query_blocks(length: int, query_block: int | None) -> int:
    """How many query blocks a device's `length` queries run in."""
    if query_block is None or length <= query_block or length % query_block:
        return 1
    return length // query_block


def split_attention(
    q: hax.NamedArray,
    k: hax.NamedArray,
    v: hax.NamedArray,
    q_index: hax.NamedArray,
    k_index: hax.NamedArray,
    segment_ids: hax.NamedArray | None,
    *,
    strategy: str,
    window: int | None,
    sliding: Any,
    softcap: float | None,
    scale: float,
    query_block: int | None,
) -> hax.NamedArray:
    """Attention with `position` split over the mesh axis the active mapping gives it.

    Args:
        q: queries over `(batch, position, kv_heads, q_heads_per_group, head_size)`.
        k: keys over `(batch, key_position, kv_heads, head_size)` (the same slots as `q`).
        v: values, like `k`.
        q_index: global position of each query slot, over `(batch?, position)`.
        k_index: the same over `key_position`.
        segment_ids: `(batch, position)` packed-document ids, or None.
        strategy: `"all_gather"` or `"ring"` (`ModelConfig.sequence_parallel`).
        window: sliding-window size, or None.
        sliding: whether the window applies (a bool or a traced per-layer flag).
        softcap: attention-logit soft cap, or None.
        scale: logit scale.
        query_block: queries per block inside each device.

    Returns:
        The attention output, with `q`'s axes.
    """
    if strategy not in SEQUENCE_PARALLEL or strategy == "none":
        raise ConfigError(f"split_attention: strategy={strategy!r}; use 'all_gather' or 'ring'")
    mapping = partitioning.current_thread_local_mapping() or {}
    axis = mapping[POSITION]
    axis = axis if isinstance(axis, str) else tuple(axis)
    mesh = partitioning.current_mesh()
    n = partitioning.physical_axis_size(POSITION, mapping, mesh)
    Batch = q.resolve_axis(BATCH)  # noqa: N806
    q_axes = q.axes
    k = k.rename({KEY_POSITION: POSITION})
    v = v.rename({KEY_POSITION: POSITION})
    qi = q_index.broadcast_axis(Batch).rearrange((BATCH, POSITION))
    ki = k_index.rename({KEY_POSITION: POSITION}).broadcast_axis(Batch).rearrange((BATCH, POSITION))
    seg = None if segment_ids is None else segment_ids.rearrange((BATCH, POSITION))
    traced = not isinstance(sliding, bool)
    if not traced and not sliding:
        window = None
    flag = jnp.asarray(sliding if traced else True)
    opts = (float(scale), None if softcap is None else float(softcap), window, traced)
    q_order = (BATCH, POSITION, KV_HEADS, Q_HEADS_PER_GROUP, HEAD_SIZE)
    kv_order = (BATCH, POSITION, KV_HEADS, HEAD_SIZE)
    q = q.rearrange(q_order)
    k, v = k.rearrange(kv_order), v.rearrange(kv_order)
    lse_axes = tuple(q.resolve_axis(a) for a in (BATCH, KV_HEADS, Q_HEADS_PER_GROUP, POSITION))
    plan = _Plan(
        mesh=mesh,
        axis=axis,
        n=n,
        strategy=strategy,
        nb=_query_blocks(q.axis_size(POSITION) // n, query_block),
        opts=opts,
        q_spec=partitioning.pspec_for_axis(q.axes, mapping, mesh),
        kv_spec=partitioning.pspec_for_axis(k.axes, mapping, mesh),
        index_spec=partitioning.pspec_for_axis(qi.axes, mapping, mesh),
        lse_spec=partitioning.pspec_for_axis(lse_axes, mapping, mesh),
    )
    qs = None if seg is None else seg.array
    out = _split(q.array, k.array, v.array, qi.array, ki.array, qs, qs, flag, plan)
    return hax.named(out, q.axes).rearrange([a.name for a in q_axes])
