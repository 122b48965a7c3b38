"""Streaming, sharded conversion between a model and a safetensors checkpoint.

Loading builds every parameter with `jax.make_array_from_callback`: for each device's piece of a
parameter (its `NamedSharding` under the mapping), the callback reads just the rows and columns
of the Hugging Face tensors that piece needs (one per layer and expert of a stacked parameter),
so no process ever holds a whole stacked parameter, let alone the checkpoint. Saving produces
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
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

import meltemi.haliax as hax
from meltemi.models import _hf_keys as K
from meltemi.models._config import ModelConfig
from meltemi.models._safetensors import Checkpoint, PendingTensor

ShardingOf = Callable[[hax.NamedArray], jax.sharding.Sharding]


def _ranges(index: tuple[slice, ...] | None, axes: tuple[hax.Axis, ...]) -> dict[str, range]:
    index = index or (slice(None),) * len(axes)
    return {ax.name: range(*sl.indices(ax.size)) for ax, sl in zip(axes, index, strict=True)}


def _read_block(
    ckpt: Checkpoint,
    key: str,
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
    block = ckpt.read(key, index)
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
            block[pos] = _read_block(ckpt, key_map[key], spec, offset, out, sizes, ranges)
        return np.transpose(block, perm)

    return jax.make_array_from_callback(template.array.shape, sharding, callback, dtype=dtype)


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
                    f"{spec.hf}: checkpoint tensor {k} has shape {info.shape}, the config needs "
                    f"{expect}; does config.json match the weights?"
                )
        offset = 0
        for get, out in spec.pieces():
            t = K._array(model, spec, get)
            target = np.dtype(dtype or infos[0].dtype)
            array = _piece_array(
                ckpt, key_map, spec, config, t, out, offset, target, sharding_of(t)
            )
            values.append(hax.NamedArray(array, t.axes))
            where.append(K._where(spec, get))
            offset += math.prod(t.shape[n] for n in out)
        loaded += keys
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
