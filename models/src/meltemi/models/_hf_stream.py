"""Streaming, sharded conversion between a model and a safetensors checkpoint.

Loading builds every parameter from its devices' pieces (its `NamedSharding` under the
mapping). From a local checkpoint each Hugging Face tensor (one per layer and expert of a
stacked parameter) is read once and every piece's part of it copied into that device's
aligned host buffer, which `device_put` adopts on CPU; from object storage
`jax.make_array_from_callback` reads, per piece, just the rows and columns it needs. No process
holds more of the checkpoint than one tensor beyond the parameters themselves. Saving produces
one Hugging Face tensor at a time (one layer of one expert of one parameter), copies it to the
host, writes it and drops it.

The layout arithmetic: a spec flattens named axes `out = (o1, o2, ...)` into the HF rows and
`inn = (n1, ...)` into the columns, row-major. A device's piece is a range of each axis; the
rows it needs are `offset + [start(o1) * P, stop(o1) * P)` with `P = |o2| * |o3| * ...`
(a contiguous block), reshaped to `(o1, o2, ...)`, then the ranges of `o2, ...` are applied.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

import meltemi.haliax as hax
from meltemi.models import _hf_keys as K
from meltemi.models import _host_memory
from meltemi.models._config import ModelConfig
from meltemi.models._safetensors import Checkpoint, PendingTensor

ShardingOf = Callable[[hax.NamedArray], jax.sharding.Sharding]


def _ranges(index: tuple[slice, ...] | None, axes: tuple[hax.Axis, ...]) -> dict[str, range]:
    index = index or (slice(None),) * len(axes)
    return {ax.name: range(*sl.indices(ax.size)) for ax, sl in zip(axes, index, strict=True)}


def _read_block(
    read: Callable[[tuple[slice, ...]], np.ndarray],
    spec: K.Spec,
    offset: int,
    out: tuple[str, ...],
    sizes: Mapping[str, int],
    ranges: Mapping[str, range],
) -> np.ndarray:
    """The block of HF tensor `key` for `ranges`, as an array over `out + spec.inn` names."""

    def span(names: tuple[str, ...], base: int) -> tuple[slice, tuple[slice, ...]]:
        # Rows (or columns) covering the range of the first axis with every inner axis whole,
        # then the inner axes' ranges, applied after the reshape.
        inner = math.prod(sizes[n] for n in names[1:])
        first = ranges[names[0]]
        outer = slice(base + first.start * inner, base + first.stop * inner)
        rest = tuple(slice(ranges[n].start, ranges[n].stop) for n in names[1:])
        return outer, rest

    rows, row_rest = span(out, offset)
    index: tuple[slice, ...] = (rows,)
    col_rest: tuple[slice, ...] = ()
    if spec.inn:
        cols, col_rest = span(spec.inn, 0)
        index = (cols, rows) if spec.conv1d else (rows, cols)
    block = read(index)
    if spec.conv1d:
        block = block.T
    shape = (len(ranges[out[0]]), *(sizes[n] for n in out[1:]))
    if spec.inn:
        shape += (len(ranges[spec.inn[0]]), *(sizes[n] for n in spec.inn[1:]))
    block = block.reshape(shape)
    full = slice(None)
    return block[(full, *row_rest) + ((full, *col_rest) if spec.inn else ())]


def _piece_array(
    ckpt: Checkpoint,
    key_map: Mapping[str, str],
    spec: K.Spec,
    config: ModelConfig,
    template: hax.NamedArray,
    out: tuple[str, ...],
    offset: int,
    dtype: np.dtype,
    sharding: jax.sharding.Sharding,
) -> jax.Array:
    axes = template.axes
    sizes = {a.name: a.size for a in axes}
    lead = K._lead(spec)
    order = lead + out + spec.inn
    perm = [order.index(a.name) for a in axes]

    def callback(index: tuple[slice, ...] | None) -> np.ndarray:
        ranges = _ranges(index, axes)
        lead_ranges = [ranges[n] for n in lead]
        shape = [len(r) for r in lead_ranges] + [len(ranges[n]) for n in out + spec.inn]
        block = np.empty(shape, dtype)
        for pos in np.ndindex(*(len(r) for r in lead_ranges)):
            ids = dict(
                zip(lead, (r[p] for r, p in zip(lead_ranges, pos, strict=True)), strict=True)
            )
            key = spec.hf.format(i=ids.get("layers"), j=ids.get("experts"))
            name = key_map[key]
            read = functools.partial(ckpt.read, name)
            block[pos] = _read_block(read, spec, offset, out, sizes, ranges)
        return np.transpose(block, perm)

    return jax.make_array_from_callback(template.array.shape, sharding, callback, dtype=dtype)


_WORKERS = 2


def _piece_array_local(
    ckpt: Checkpoint,
    key_map: Mapping[str, str],
    spec: K.Spec,
    template: hax.NamedArray,
    out: tuple[str, ...],
    offset: int,
    dtype: np.dtype,
    sharding: jax.sharding.Sharding,
) -> jax.Array:
    """`_piece_array` for a local checkpoint: each HF tensor is read once (into the
    checkpoint's scratch buffer), and every device's piece of it is copied (cast, transposed)
    from there into that device's buffer, which `device_put` then adopts on CPU (64-byte
    aligned host buffers are not copied). Besides the parameters themselves, only the tensor
    being copied is resident."""
    axes = template.axes
    names = [a.name for a in axes]
    sizes = {a.name: a.size for a in axes}
    lead = K._lead(spec)
    order = lead + out + spec.inn
    to_order = [names.index(n) for n in order]
    shape = template.array.shape
    pieces: dict[tuple, tuple[dict[str, range], np.ndarray]] = {}
    device_keys: list[tuple[jax.Device, tuple]] = []
    for device, index in sharding.addressable_devices_indices_map(shape).items():
        ranges = _ranges(index, axes)
        ident = tuple((r.start, r.stop) for r in ranges.values())
        if ident not in pieces:
            buffer = _host_memory.empty(tuple(len(ranges[n]) for n in names), dtype)
            pieces[ident] = (ranges, buffer)
        device_keys.append((device, ident))
    lead_sizes = [sizes[n] for n in lead]

    def fill(piece: tuple[dict[str, range], np.ndarray], ids: dict, source: np.ndarray) -> None:
        ranges, buffer = piece
        if any(ids[n] not in ranges[n] for n in lead):
            return
        at = tuple(ids[n] - ranges[n].start for n in lead)
        block = _read_block(source.__getitem__, spec, offset, out, sizes, ranges)
        np.copyto(buffer.transpose(to_order)[at], block, casting="unsafe")

    # Two workers fill the devices' pieces of a tensor at once: on 2 cores this shortens the
    # copies and the first-touch page faults of the new buffers.
    with ThreadPoolExecutor(max(1, min(_WORKERS, len(pieces)))) as pool:
        for pos in np.ndindex(*lead_sizes):
            ids = dict(zip(lead, pos, strict=True))
            name = key_map[spec.hf.format(i=ids.get("layers"), j=ids.get("experts"))]
            source = ckpt.read_whole(name)
            list(pool.map(functools.partial(fill, ids=ids, source=source), pieces.values()))
            del source

    arrays, used = [], set()
    for device, ident in device_keys:
        buffer = pieces[ident][1]
        if ident in used:  # a replicated piece: each device gets its own buffer
            copy = _host_memory.empty(buffer.shape, dtype)
            np.copyto(copy, buffer)
            buffer = copy
        used.add(ident)
        arrays.append(jax.device_put(buffer, device))
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays)


def _hf_shape(spec: K.Spec, model: Any) -> tuple[int, ...]:
    pieces = [K._array(model, spec, g) for g, _ in spec.pieces()]
    rows = sum(math.prod(t.shape[n] for n in out) for t, (_, out) in zip(pieces, spec.pieces()))
    shape = (rows, math.prod(pieces[0].shape[n] for n in spec.inn)) if spec.inn else (rows,)
    return shape[::-1] if spec.conv1d else shape


def load(
    template: Any,
    ckpt: Checkpoint,
    key_map: Mapping[str, str],
    *,
    dtype: Any,
    init_missing_norms: bool,
    sharding_of: ShardingOf,
) -> tuple[Any, list[str], dict[str, str], list[str]]:
    """Fills `template` (possibly `eval_shape`d) from `ckpt`, each parameter sharded by
    `sharding_of`.

    Args:
        template: the model to fill.
        ckpt: the checkpoint.
        key_map: HF key the model expects -> key in the checkpoint (present keys only).
        dtype: parameter dtype (`None`: the checkpoint's).
        init_missing_norms: set absent tensors that have an identity value to it.
        sharding_of: the sharding of a parameter (from its axes).

    Returns:
        `(model, loaded keys, initialised keys -> value, missing keys)`, as
        `_hf_keys.from_state_dict`.
    """
    config: ModelConfig = template.config
    unrolled = not hasattr(template.blocks, "stacked")
    model = K.as_stacked(template)
    where: list[Callable[[Any], Any]] = []
    values: list[hax.NamedArray] = []
    loaded: list[str] = []
    initialised: dict[str, str] = {}
    missing: list[str] = []
    try:
        for spec in K.specs_for(config):
            keys = [k for k, _ in K._expand(spec, config)]
            absent = [k for k in keys if k not in key_map]
            if absent and not (init_missing_norms and spec.identity is not None):
                missing += absent
                continue
            if absent:
                for get, _ in spec.pieces():
                    t = K._array(model, spec, get)
                    value = np.full(t.array.shape, spec.identity, dtype or t.dtype)
                    values.append(hax.NamedArray(jax.device_put(value, sharding_of(t)), t.axes))
                    where.append(K._where(spec, get))
                initialised.update({k: f"{spec.identity:g}" for k in keys})
                continue
            expect = _hf_shape(spec, model)
            infos = [ckpt.tensors[key_map[k]] for k in keys]
            for k, info in zip(keys, infos, strict=True):
                if info.shape != expect:
                    raise K.ShapeError(
                        f"{spec.hf}: checkpoint tensor {k} has shape {info.shape}, the config "
                        f"needs {expect}; does config.json match the weights?"
                    )
            offset = 0
            for get, out in spec.pieces():
                t = K._array(model, spec, get)
                target = np.dtype(dtype or infos[0].dtype)
                # Several processes (hosts) read only their devices' pieces: each reading whole
                # tensors would multiply the checkpoint's I/O by the number of hosts.
                if ckpt.remote or jax.process_count() > 1:
                    array = _piece_array(
                        ckpt, key_map, spec, config, t, out, offset, target, sharding_of(t)
                    )
                else:
                    array = _piece_array_local(
                        ckpt, key_map, spec, t, out, offset, target, sharding_of(t)
                    )
                values.append(hax.NamedArray(array, t.axes))
                where.append(K._where(spec, get))
                offset += math.prod(t.shape[n] for n in out)
            loaded += keys
    finally:
        ckpt.close()
    if where:
        model = eqx.tree_at(lambda m: [w(m) for w in where], model, values)
    if unrolled:
        model = K._to_unrolled(model)
    return model, loaded, initialised, missing


# -- saving -----------------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnums=2)
def _take(array: jax.Array, index: tuple[jax.Array, ...], perm: tuple[int, ...]) -> jax.Array:
    # One layer (and expert) of a stacked parameter; the transpose fuses into the slice.
    return jnp.transpose(array, perm)[index]


def _to_host(array: jax.Array | np.ndarray) -> np.ndarray:
    if not isinstance(array, jax.Array) or array.is_fully_addressable:
        return np.asarray(jax.device_get(array))
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def pending_tensors(model: Any, dtype: Any = None) -> list[PendingTensor]:
    """Every HF tensor of `model`, in spec order, each produced on demand (one layer of one
    expert at a time)."""
    config: ModelConfig = model.config
    model = K.as_stacked(model)
    pending: list[PendingTensor] = []
    for spec in K.specs_for(config):
        lead = K._lead(spec)
        shape = _hf_shape(spec, model)
        arrays = [(K._array(model, spec, g), out) for g, out in spec.pieces()]
        kind = np.dtype(dtype or arrays[0][0].dtype)

        def produce(index, spec=spec, arrays=arrays, kind=kind, lead=lead) -> np.ndarray:
            rows = []
            for named, out in arrays:
                names = [a.name for a in named.axes]
                array = named.array
                if lead:  # pick this layer / expert on device, lead axes moved first
                    perm = tuple([names.index(n) for n in lead]) + tuple(
                        i for i, n in enumerate(names) if n not in lead
                    )
                    array = _take(array, tuple(np.int32(i) for i in index), perm)
                    names = [n for n in names if n not in lead]
                host = _to_host(array)
                order = out + spec.inn
                host = np.transpose(host, [names.index(n) for n in order])
                sizes = named.shape
                flat = (math.prod(sizes[n] for n in out),)
                if spec.inn:
                    flat += (math.prod(sizes[n] for n in spec.inn),)
                rows.append(host.reshape(flat))
            full = np.concatenate(rows, axis=0) if len(rows) > 1 else rows[0]
            if spec.conv1d:
                full = full.T
            return full.astype(kind, copy=False)

        for key, index in K._expand(spec, config):
            pending.append(PendingTensor(key, shape, kind, lambda index=index, p=produce: p(index)))
    return pending
