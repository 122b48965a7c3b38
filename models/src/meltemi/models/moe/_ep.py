"""Expert parallelism: tokens travel to the devices holding their experts, and back, with
all-to-all (`jax.shard_map` + `jax.lax.all_to_all`).

Used when the active mapping sends the `experts` axis to a mesh axis `ep` of size n > 1 and the
batch is split over `ep` too (outside the MoE layers the expert devices are data-parallel).
Each device then holds `E / n` experts and its own `b` sequences, and per MoE layer:

| step | on each device | shape |
|---|---|---|
| route + dispatch | its tokens into `C` slots per expert and sequence (GShard) | `[E, b, C, D]` |
| all-to-all 1 | the slots of expert group g go to device g | `[n, E/n, b, C, D]` |
| experts | SwiGLU of its `E/n` experts on what it received | `[n, E/n, b, C, D]` |
| all-to-all 2 | results go back to the devices the tokens came from | `[E, b, C, D]` |
| combine | weighted sum over each token's slots | `[b, S, D]` |

So each device sends and receives `E * b * C * D` values per all-to-all: its *local* tokens
times `E * C / S` (about `capacity_factor * top_k`), independent of the global batch.
`dispatch="capacity"` uses the config's capacity (exactly the single-device capacity path:
same groups, same slot order, same drops). `dispatch="dropless"` uses `C = S`, so no
assignment can be dropped (exactly the dropless function), at `E / (capacity_factor * top_k)`
times the traffic and expert FLOPs of the capacity path.

When a device has more slots per sequence than a sequence has tokens (`S < E/n * C`: few
devices, or dropless), the exchange goes by token instead (`_by_token`): each token travels
once to each device holding one of its experts (`[n, b, S, D]` per all-to-all), with the
place of each slot's token and its combine weight (`E * b * C` integers and floats), and each
device returns one weighted sum per token. Same slots and drops; `n * S / (E * C)` of the
slot exchange's traffic (0.8x at EP = 2 with top-2 of 8 and capacity 1.25; 1/4 dropless).

With `MoeConfig.ep_exchange="ragged"` (the `"auto"` choice on TPU and GPU) no slot travels:
each device sends exactly its kept (token, expert) rows with `jax.lax.ragged_all_to_all`
and gets their results back the same way (`_ragged`), `A <= b * S * k` rows each way
instead of `E * b * C`. The experts run on the received rows with `jax.lax.ragged_dot`. Both
dispatch modes: `"capacity"` sends the assignments the capacity path keeps (same drops),
`"dropless"` sends all of them (exactly the dropless function) while they fit the receive
buffer: `MoeConfig.ep_buffer_factor` bounds it at a multiple of the mean load
(`buffer_rows`), and rows past the bound are not sent, count as dropped in `kept` (so in
`dropped_fraction`) and add nothing to their token's output.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import meltemi.haliax as hax
from meltemi.models._axes import BATCH, EMBED, EXPERTS, POSITION
from meltemi.models._config import ConfigError
from meltemi.models.moe import _kernels as K
from meltemi.models.moe import _ragged

RAGGED_PLATFORMS = ("tpu", "gpu", "cuda", "rocm")
"""Platforms whose XLA compiles `ragged_all_to_all` (XLA:CPU does not, jax 0.10.2)."""


def _platform() -> str:
    """The platform the computation runs on (`cpu`, `gpu`, `tpu`); patched by tests."""
    return jax.default_backend()


def resolve_exchange(exchange: str) -> str:
    """The exchange that runs, `"dense"` or `"ragged"`, for a `MoeConfig.ep_exchange` value.

    `"auto"` picks `"ragged"` on TPU and GPU and `"dense"` elsewhere; an explicit `"ragged"`
    where XLA cannot compile `ragged_all_to_all` is an error naming the field and the fix.
    """
    platform = _platform()
    if exchange == "auto":
        return "ragged" if platform in RAGGED_PLATFORMS else "dense"
    allowed = platform in RAGGED_PLATFORMS or _ragged.is_allowed_on_cpu()
    if exchange == "ragged" and not allowed:
        raise ConfigError(
            f"MoeConfig.ep_exchange='ragged': jax.lax.ragged_all_to_all does not compile on "
            f"{platform!r} (only on {', '.join(RAGGED_PLATFORMS)}). Fix: "
            "MoeConfig(..., ep_exchange='auto') (ragged where it compiles, dense elsewhere) "
            "or ep_exchange='dense'"
        )
    return exchange


@dataclasses.dataclass(frozen=True)
class EpPlan:
    """Where the expert-parallel layer runs: the mesh, its expert axis and the batch split."""

    mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh
    axis: str
    batch: tuple[str, ...]

    @property
    def size(self) -> int:
        return self.mesh.shape[self.axis]


def plan(x: hax.NamedArray, num_experts: int) -> EpPlan | None:
    """The EP plan for activations `x` (`batch, position, embed`) under the active mapping and
    mesh, or None when the experts are not split over a mesh axis (the local paths run then).

    When the experts are split but the layout does not allow the all-to-all dispatch (the
    batch is not split over the expert axis too, activations are split along position or
    embed, or the experts do not divide evenly), this warns and returns None: the local path
    then runs on expert-sharded weights, with compiler-inserted gathers and reductions.
    """
    mapping = hax.partitioning.current_thread_local_mapping()
    mesh = hax.partitioning.current_mesh()
    if not mapping or mesh is None:
        return None
    axis = mapping.get(EXPERTS)
    if not isinstance(axis, str) or axis not in mesh.shape or mesh.shape[axis] == 1:
        return None
    spec = hax.partitioning.pspec_for_axis(x.axes, mapping, mesh)
    by_name = dict(zip((a.name for a in x.axes), spec, strict=True))
    batch = by_name[BATCH]
    batch = () if batch is None else (batch,) if isinstance(batch, str) else tuple(batch)
    problem = None
    if axis not in batch:
        problem = (
            f"the batch is split over {batch or 'nothing'}, not over {axis!r}; map it like "
            f"{{'batch': {(*batch, axis)!r}, 'experts': {axis!r}}}"
        )
    elif by_name[POSITION] is not None or by_name[EMBED] is not None:
        problem = "activations are split along position or embed; map both to None"
    elif num_experts % mesh.shape[axis]:
        problem = f"num_experts={num_experts} is not a multiple of {mesh.shape[axis]}"
    if problem is not None:
        warnings.warn(
            f"experts are split over mesh axis {axis!r} but tokens cannot be exchanged with "
            f"all-to-all: {problem}. Falling back to gathers of the tokens.",
            stacklevel=2,
        )
        return None
    return EpPlan(mesh, axis, batch)


def moe(
    ep: EpPlan,
    x: jax.Array,
    logits: jax.Array,
    w_gate: jax.Array,
    w_up: jax.Array,
    w_down: jax.Array,
    act: Callable[[jax.Array], jax.Array],
    *,
    top_k: int,
    normalize: bool,
    capacity: int,
    exchange: str = "dense",
    buffer_factor: float | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Routing and the expert MLP with all-to-all dispatch.

    Args:
        ep: the plan.
        x: `[B, S, D]` tokens (batch split over `ep.batch`).
        logits: `[B, S, E]` float32 router logits (same split).
        w_gate, w_up: `[E, D, I]`; w_down: `[E, I, D]` (experts split over `ep.axis`).
        act: the gate activation.
        top_k, normalize: routing (`_kernels.route`).
        capacity: slots per expert and sequence (`S` for dropless).
        exchange: a `MoeConfig.ep_exchange` value (`resolve_exchange`).
        buffer_factor: `MoeConfig.ep_buffer_factor` (the ragged exchange's bound).

    Returns:
        `(y [B, S, D], kept [B, S, K], probs [B, S, E], experts [B, S, K])`. Routing runs on
        each device's own tokens (top-k of a batch-split array would otherwise be gathered).
    """
    num_experts = w_gate.shape[0]
    n = ep.size
    ragged = resolve_exchange(exchange) == "ragged"
    batch = ep.batch if len(ep.batch) > 1 else ep.batch[0]
    tokens = P(batch, None, None)
    expert_w = P(ep.axis, None, None)

    @functools.partial(
        jax.shard_map,
        mesh=ep.mesh,
        in_specs=(tokens, tokens, expert_w, expert_w, expert_w),
        out_specs=(tokens, tokens, tokens, tokens),
        check_vma=False,
    )
    def local(x, logits, w_gate, w_up, w_down):
        probs, weights, experts = K.route(logits, top_k, normalize=normalize)
        weights = weights.astype(x.dtype)
        if ragged:
            y, kept = _ragged_moe(
                x, weights, experts, capacity, n, ep.axis, w_gate, w_up, w_down, act,
                buffer_factor,
            )  # fmt: skip
            return y, kept, probs, experts
        dispatch, combine, kept = K.capacity_dispatch(weights, experts, num_experts, capacity)
        expert = functools.partial(_experts, w_gate=w_gate, w_up=w_up, w_down=w_down, act=act)
        if x.shape[1] < (num_experts // n) * capacity:
            y = _by_token(x, dispatch, combine, n, ep.axis, expert)
        else:
            y = _by_slot(x, dispatch, combine, n, ep.axis, expert)
        return y, kept, probs, experts

    return local(x, logits, w_gate, w_up, w_down)


BUFFER_ROW_MULTIPLE = 8
"""A bounded receive buffer's rows are rounded up to a multiple of this (the row tile of
32-bit layouts on TPU), never past the worst case."""


def buffer_rows(
    n: int, tokens: int, top_k: int, num_experts: int, slots: int, factor: float | None = None
) -> int:
    """Rows of a device's receive buffer in the ragged exchange.

    The worst case, the most a device can receive: each of n sources sends a token at most
    `min(top_k, E/n)` times to one device (a token's experts are distinct), and at most
    `slots` (= b * C) rows per expert, so `min(n * tokens * min(top_k, E/n), E * slots)`.
    Dropless pays up to `n * min(top_k, E/n) / top_k` times the mean load in memory (not in
    traffic: only filled rows travel); the capacity path at most the dense path's `E * b * C`
    slots. With `factor` (`MoeConfig.ep_buffer_factor`) the buffer holds at most
    `ceil(factor * tokens * top_k)` rows (the mean load times the factor), rounded up to a
    multiple of `BUFFER_ROW_MULTIPLE`; rows past it are dropped (`layout(..., bound=)`).

    Args:
        n: devices on the expert axis.
        tokens: a device's tokens (`b * S`).
        top_k: experts per token.
        num_experts: experts in the layer.
        slots: most rows an expert keeps from one device (`b * C`; `b * S` dropless).
        factor: the bound in multiples of the mean load, or None for the worst case.

    >>> buffer_rows(64, 8192, 8, 256, 8192)  # DeepSeek-like at EP = 64: 32x the mean load
    2097152
    >>> buffer_rows(64, 8192, 8, 256, 8192, factor=4.0)
    262144
    """
    worst = min(n * tokens * min(top_k, num_experts // n), num_experts * slots)
    if factor is None:
        return worst
    bound = math.ceil(factor * tokens * top_k)
    return min(worst, -(-bound // BUFFER_ROW_MULTIPLE) * BUFFER_ROW_MULTIPLE)


def _ragged_moe(
    x, weights, experts, capacity, n, axis, w_gate, w_up, w_down, act, buffer_factor=None
):
    """One device's ragged exchange: its kept rows to their experts' devices and back.

    Same sort and grouped matmuls as `_kernels.dropless`, with the chunks of other
    devices' experts sent away and other devices' rows for mine received in their place.
    Rows that do not fit the receive buffer (`buffer_factor`) are not sent, and not kept.
    """
    b, s, d = x.shape
    top_k = experts.shape[-1]
    num_experts = n * w_gate.shape[0]
    if capacity >= s:  # no expert can receive more than S assignments of a sequence
        kept = jnp.ones(experts.shape, bool)
    else:
        kept = K.capacity_dispatch(weights, experts, num_experts, capacity)[2]
    key = jnp.where(kept, experts, num_experts).reshape(-1)  # dropped rows sort last, unsent
    order = jnp.argsort(key, stable=True)
    token_of = order // top_k
    rows = jnp.take(x.reshape(b * s, d), token_of, axis=0)
    counts = jnp.zeros((num_experts,), jnp.int32).at[key].add(1, mode="drop")
    size = buffer_rows(n, b * s, top_k, num_experts, b * capacity, buffer_factor)
    worst = buffer_rows(n, b * s, top_k, num_experts, b * capacity)
    bound = size if size < worst else None
    lay = _ragged.layout(jax.lax.all_gather(counts, axis), jax.lax.axis_index(axis), bound)
    if bound is not None:
        # Row p of my sorted rows is the (p - start)-th of its chunk; the first send_sizes go.
        sorted_key = jnp.take(key, order)
        start = jnp.take(lay.send_offsets, sorted_key, mode="fill", fill_value=0)
        sent = jnp.take(lay.send_sizes, sorted_key, mode="fill", fill_value=0)
        fits = jnp.arange(key.shape[0]) - start < sent
        kept = kept & jnp.zeros_like(fits).at[order].set(fits).reshape(experts.shape)
    received = _ragged.dispatch(rows, lay, size, axis)
    # Rows past sum(group_sizes) hold nothing and are never sent back (nor their gradients).
    out = K.grouped_mlp(received, lay.group_sizes, w_gate, w_up, w_down, act)
    back = _ragged.give_back(out, lay, rows.shape[0], axis)
    back = back * jnp.take(weights.reshape(-1), order)[:, None].astype(back.dtype)
    y = jnp.zeros((b * s, d), back.dtype).at[token_of].add(back)
    return y.reshape(b, s, d).astype(x.dtype), kept


def _experts(received, *, w_gate, w_up, w_down, act):
    """SwiGLU of the local experts on `[source device, local expert, b, C, D]` slots."""
    gate = jnp.einsum("nebcd,edi->nebci", received, w_gate)
    up = jnp.einsum("nebcd,edi->nebci", received, w_up)
    return jnp.einsum("nebci,eid->nebcd", (act(gate) * up).astype(received.dtype), w_down)


def _by_slot(x, dispatch, combine, n, axis, expert):
    """One vector per (token, expert) slot each way: `[E, b, C, D]` per all-to-all."""
    b, _, d = x.shape
    num_experts, capacity = dispatch.shape[2:]
    slots = jnp.einsum("bsec,bsd->ebcd", dispatch.astype(x.dtype), x)
    slots = slots.reshape(n, num_experts // n, b, capacity, d)
    # Slots of expert group g -> device g; received: [source device, local expert, ...].
    received = jax.lax.all_to_all(slots, axis, split_axis=0, concat_axis=0)
    out = expert(received)
    # Results back to the devices the tokens came from: [expert group, local expert, ...].
    back = jax.lax.all_to_all(out, axis, split_axis=0, concat_axis=0)
    back = back.reshape(num_experts, b, capacity, d)
    return jnp.einsum("bsec,ebcd->bsd", combine.astype(x.dtype), back)


def _by_token(x, dispatch, combine, n, axis, expert):
    """One vector per (token, device) each way: `[n, b, T, D]` per all-to-all, `T = S`.

    Used when a sequence has fewer tokens than a device has slots (`S < E/n * C`): a token
    routed to two experts of one device travels once, and the device returns the weighted sum
    of its experts' outputs. Token `t` takes place `pos[t, g]` in device g's queue (token order);
    with it travel, per local expert and slot, the place its token holds (`T`: empty) and the
    combine weight, so the expert side fills its `[E/n, b, C]` slots by a gather and sums back
    with a scatter-add. Same slots, same drops as `_by_slot`.
    """
    b, s, d = x.shape
    num_experts, capacity = dispatch.shape[2:]
    local = num_experts // n
    filled = dispatch.reshape(b, s, n, local, capacity).astype(jnp.int32)
    need = jnp.max(filled, axis=(3, 4)) > 0  # [b, S, n]: token t has a slot on device g
    place = jnp.where(need, jnp.cumsum(need, axis=1) - 1, s)  # [b, S, n]; s = nowhere
    rows = jnp.arange(b)[:, None, None]
    devices = jnp.arange(n)[None, None, :]
    send = jnp.zeros((n, b, s + 1, d), x.dtype)
    send = send.at[devices, rows, place].add(jnp.broadcast_to(x[:, :, None], (b, s, n, d)))
    # For each (device, local expert, b, slot): the place of its token, or s when empty.
    held = jnp.sum(filled, axis=1) > 0  # [b, n, local, C]
    where = jnp.einsum("bsnlc,bsn->nlbc", filled, jnp.minimum(place, s - 1))
    where = jnp.where(jnp.transpose(held, (1, 2, 0, 3)), where, s)
    weight = jnp.einsum("bsnlc->nlbc", combine.reshape(b, s, n, local, capacity))
    received = jax.lax.all_to_all(send[:, :, :s], axis, split_axis=0, concat_axis=0)
    where = jax.lax.all_to_all(where, axis, split_axis=0, concat_axis=0)
    weight = jax.lax.all_to_all(weight.astype(x.dtype), axis, split_axis=0, concat_axis=0)
    # Expert side: [source, b, place] -> [source, local expert, b, slot] (place s: zeros).
    padded = jnp.concatenate([received, jnp.zeros((n, b, 1, d), x.dtype)], axis=2)
    slots = jnp.take_along_axis(padded[:, None], where[..., None], axis=3)
    out = expert(slots) * weight[..., None]
    sources = jnp.arange(n)[:, None, None, None]
    ret = jnp.zeros((n, b, s + 1, d), out.dtype)
    ret = ret.at[sources, jnp.arange(b)[None, None, :, None], where].add(out)
    back = jax.lax.all_to_all(ret[:, :, :s], axis, split_axis=0, concat_axis=0)
    # Source side: token t sums what each device returned at its place.
    back = jnp.concatenate([back, jnp.zeros((n, b, 1, d), back.dtype)], axis=2)
    picked = jnp.take_along_axis(
        jnp.transpose(back, (1, 0, 2, 3)), jnp.transpose(place, (0, 2, 1))[..., None], axis=2
    )  # [b, n, S, D]
    return jnp.sum(picked, axis=1).astype(x.dtype)
