"""Streaming, sharded conversion between a model and a safetensors checkpoint.

Loading builds every parameter from this process's devices' pieces (its `NamedSharding` under
the mapping). Each Hugging Face tensor (one per layer and expert of a stacked parameter) that
any local device needs is read once, and only the rows covering the local pieces: every row
when the pieces are column ranges, only this host's rows when they are row ranges (HF tensors
are row-major, so that is one contiguous byte range: one `preadv` locally, one ranged read on
object storage). Every piece's part is then copied into that device's aligned host buffer,
which `device_put` adopts on CPU. The same path serves one process and many, local files and
buckets. No process holds more of the checkpoint than one tensor's rows beyond the parameters
themselves. Saving produces one Hugging Face tensor at a time (one layer of one expert of one
parameter), copies it to the host, writes it and drops it.

The layout arithmetic: a spec flattens named axes `out = (o1, o2, ...)` into the HF rows and
`inn = (n1, ...)` into the columns, row-major. A device's piece is a range of each axis; the
rows it needs are `offset + [start(o1) * P, stop(o1) * P)` with `P = |o2| * |o3| * ...`
(a contiguous block), reshaped to `(o1, o2, ...)`, then the ranges of `o2, ...` are applied.

Block-scaled FP8 (`quantization_config.weight_block_size = [b0, b1]`): the real weight is
`W[i, j] * scale_inv[i // b0, j // b1]` in HF coordinates. With a tensor's covering rows
`[first, stop)` the loader also reads the scale rows `[first // b0, ceil(stop / b0))`, and each
piece's block is dequantized on its way into the buffer, one row block at a time (float32
product, cast to the target dtype), so a piece cut anywhere inside a block gets its scales.
"""

from __future__ import annotations

import dataclasses
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
from meltemi.models._config import ModelConfig
from meltemi.models.hf import _host_memory
from meltemi.models.hf import _keys as K
from meltemi.models.hf._safetensors import Checkpoint, PendingTensor

ShardingOf = Callable[[hax.NamedArray], jax.sharding.Sharding]


def _ranges(index: tuple[slice, ...] | None, axes: tuple[hax.Axis, ...]) -> dict[str, range]:
    index = index or (slice(None),) * len(axes)
    return {ax.name: range(*sl.indices(ax.size)) for ax, sl in zip(axes, index, strict=True)}


def _span(
    names: tuple[str, ...], base: int, sizes: Mapping[str, int], ranges: Mapping[str, range]
) -> tuple[slice, tuple[slice, ...]]:
    """The HF rows (or columns) flattening `names` that cover their ranges: the range of the
    first axis with every inner axis whole; then the inner axes' ranges, for after the reshape."""
    inner = math.prod(sizes[n] for n in names[1:])
    first = ranges[names[0]]
    outer = slice(base + first.start * inner, base + first.stop * inner)
    rest = tuple(slice(ranges[n].start, ranges[n].stop) for n in names[1:])
    return outer, rest


def _first_rows(
    spec: K.Spec,
    offset: int,
    out: tuple[str, ...],
    sizes: Mapping[str, int],
    ranges: Mapping[str, range],
) -> slice:
    """The span of the HF tensor's first dimension a piece needs (Conv1D stores `[in, out]`)."""
    if spec.conv1d and spec.inn:
        return _span(spec.inn, 0, sizes, ranges)[0]
    return _span(out, offset, sizes, ranges)[0]


def _read_block(
    read: Callable[[tuple[slice, ...]], np.ndarray],
    spec: K.Spec,
    offset: int,
    out: tuple[str, ...],
    sizes: Mapping[str, int],
    ranges: Mapping[str, range],
) -> np.ndarray:
    """The block of an HF tensor for `ranges`, as an array over `out + spec.inn` names."""
    rows, row_rest = _span(out, offset, sizes, ranges)
    index: tuple[slice, ...] = (rows,)
    col_rest: tuple[slice, ...] = ()
    if spec.inn:
        cols, col_rest = _span(spec.inn, 0, sizes, ranges)
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


_WORKERS = 2


@dataclasses.dataclass(frozen=True)
class BlockScales:
    """The block-scaled FP8 tensors of a checkpoint: `keys` maps the checkpoint key of each
    scaled tensor to the key of its `weight_scale_inv`; `block` is `weight_block_size`."""

    keys: Mapping[str, str]
    block: tuple[int, int]


@dataclasses.dataclass(frozen=True)
class _Scales:
    """The block scales covering a tensor's read rows: `values[r - first_block, c]` scales
    the `(r, c)` block of `(b0, b1)` HF elements."""

    values: np.ndarray  # float32
    first_block: int
    block: tuple[int, int]


@functools.cache
def _float32_table(dtype: np.dtype) -> np.ndarray:
    # Every value of a one-byte float type: `np.take` from it is the exact cast, 5x faster
    # than ml_dtypes' float8 -> float32 `astype` (2.2 against 11.6 ns an element here).
    return np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)


def _dequantize(
    block: np.ndarray, scales: _Scales, index: tuple[slice, ...], dtype: np.dtype
) -> np.ndarray:
    """`block` (HF rows `index[0]`, columns `index[1]` of a float8 tensor) times its block
    scales, multiplied in float32 and cast to `dtype`, one row block at a time (a float32
    temporary of at most `b0` rows)."""
    (b0, b1), rows, cols = scales.block, index[0], index[1]
    out = np.empty(block.shape, dtype)
    col_scale = np.arange(cols.start, cols.stop) // b1
    table = _float32_table(block.dtype) if block.dtype.itemsize == 1 else None
    for b in range(rows.start // b0, -(-rows.stop // b0)):
        lo, hi = max(rows.start, b * b0) - rows.start, min(rows.stop, (b + 1) * b0) - rows.start
        if table is None:
            chunk = block[lo:hi].astype(np.float32)
        else:
            chunk = np.take(table, block[lo:hi].view(np.uint8))
        chunk *= scales.values[b - scales.first_block, col_scale]
        out[lo:hi] = chunk
    return out


@dataclasses.dataclass
class _Piece:
    """One distinct device piece of one parameter: its ranges and its host buffer."""

    part: int
    ranges: dict[str, range]
    rows: slice  # the span of the HF tensor's first dimension it needs
    buffer: np.ndarray


def _piece_arrays(
    ckpt: Checkpoint,
    key_map: Mapping[str, str],
    spec: K.Spec,
    parts: list[tuple[hax.NamedArray, tuple[str, ...], int, jax.sharding.Sharding]],
    dtype: np.dtype,
    fp8: BlockScales | None = None,
    same: Mapping[str, str] | None = None,
    differences: dict[str, int] | None = None,
) -> list[jax.Array]:
    """The parameters `parts` (`(template, out, row offset, sharding)`: one, or the pieces of
    a fused tensor such as GPT-2's `c_attn`), each built from this process's devices' pieces.

    Per HF tensor that any of them needs, the rows covering all of their pieces (every row for
    column ranges, only theirs for row ranges) are read once (`Checkpoint.read_rows`: one
    `preadv` or one ranged read), and every piece's part is copied (cast, transposed) from
    there into that device's buffer, which `device_put` then adopts on CPU (64-byte aligned
    host buffers are not copied). Besides the parameters themselves, only those rows of one
    tensor are resident. A tensor with a block scale (`fp8`) is dequantized piece by piece
    (`_dequantize`), its scale rows read with it. A tensor with an entry in `same` (a tied
    checkpoint's embedding -> its stored `lm_head.weight`) is compared with the same rows of
    that tensor as it is read (`Checkpoint.first_difference`); the first differing row goes
    into `differences[name]`."""
    lead = K._lead(spec)
    pieces: dict[tuple, _Piece] = {}
    device_keys: list[list[tuple[jax.Device, tuple]]] = []
    sizes_of: list[dict[str, int]] = []  # per part: axis sizes
    order_of: list[list[int]] = []  # per part: its axes in `lead + out + inn` order
    for part, (template, out, offset, sharding) in enumerate(parts):
        axes = template.axes
        names = [a.name for a in axes]
        sizes_of.append({a.name: a.size for a in axes})
        order_of.append([names.index(n) for n in lead + out + spec.inn])
        device_keys.append([])
        indices = sharding.addressable_devices_indices_map(template.array.shape)
        for device, index in indices.items():
            ranges = _ranges(index, axes)
            ident = (part, *((r.start, r.stop) for r in ranges.values()))
            if ident not in pieces:
                shape = tuple(len(r) for r in ranges.values())
                rows = _first_rows(spec, offset, out, sizes_of[part], ranges)
                buffer = _host_memory.empty(shape, dtype)
                pieces[ident] = _Piece(part, ranges, rows, buffer)
            device_keys[part].append((device, ident))

    def fill(
        piece: _Piece, ids: dict, source: np.ndarray, first: int, scale: _Scales | None
    ) -> None:
        _, out, offset, _ = parts[piece.part]
        at = tuple(ids[n] - piece.ranges[n].start for n in lead)

        def read(index: tuple[slice, ...]) -> np.ndarray:
            rows = slice(index[0].start - first, index[0].stop - first)
            block = source[(rows, *index[1:])]
            return block if scale is None else _dequantize(block, scale, index, dtype)

        block = _read_block(read, spec, offset, out, sizes_of[piece.part], piece.ranges)
        np.copyto(piece.buffer.transpose(order_of[piece.part])[at], block, casting="unsafe")

    # Two workers fill the devices' pieces of a tensor at once: on 2 cores this shortens the
    # copies and the first-touch page faults of the new buffers.
    lead_sizes = [parts[0][0].shape[n] for n in lead]
    with ThreadPoolExecutor(max(1, min(_WORKERS, len(pieces)))) as pool:
        for pos in np.ndindex(*lead_sizes):
            ids = dict(zip(lead, pos, strict=True))
            needed = [p for p in pieces.values() if all(ids[n] in p.ranges[n] for n in lead)]
            if not needed:  # no local device holds this layer / expert
                continue
            name = key_map[spec.hf.format(i=ids.get("layers"), j=ids.get("experts"))]
            first, stop = min(p.rows.start for p in needed), max(p.rows.stop for p in needed)
            source = ckpt.read_rows(name, first, stop)
            scale = None
            if fp8 is not None and name in fp8.keys:  # `read_rows` reuses its buffer: `read`
                b0 = fp8.block[0]
                values = ckpt.read(fp8.keys[name], (slice(first // b0, -(-stop // b0)),))
                scale = _Scales(values.astype(np.float32), first // b0, fp8.block)
            work = functools.partial(fill, ids=ids, source=source, first=first, scale=scale)
            list(pool.map(work, needed))
            if same and name in same and differences is not None:
                row = ckpt.first_difference(same[name], source, first)
                if row is not None:
                    differences[name] = row
            del source

    arrays = []
    for (template, _, _, sharding), keys in zip(parts, device_keys, strict=True):
        singles, used = [], set()
        for device, ident in keys:
            buffer = pieces[ident].buffer
            if ident in used:  # a replicated piece: each device gets its own buffer
                copy = _host_memory.empty(buffer.shape, dtype)
                np.copyto(copy, buffer)
                buffer = copy
            used.add(ident)
            singles.append(jax.device_put(buffer, device))
        shape = template.array.shape
        arrays.append(jax.make_array_from_single_device_arrays(shape, sharding, singles))
    return arrays


class RowsDiffer(ValueError):
    """`key` differs from `other`, which it should equal, first at row `row`."""

    def __init__(self, key: str, other: str, row: int):
        super().__init__(f"{other} differs from {key} (first at row {row})")
        self.key, self.other, self.row = key, other, row


def _raise_if_different(key: str, other: str, differences: Mapping[str, int]) -> None:
    """Raises `RowsDiffer` in every process if any process found a differing row of `key`
    (each compared only the rows it read): the first such row over all processes."""
    row = differences.get(key, -1)
    if jax.process_count() > 1:
        rows = np.asarray(multihost_utils.process_allgather(np.int64(row)))
        found = rows[rows >= 0]
        row = int(found.min()) if found.size else -1
    if row >= 0:
        raise RowsDiffer(key, other, row)


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
    fp8: BlockScales | None = None,
    same: Mapping[str, str] | None = None,
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
        fp8: the block-scaled FP8 tensors and their scales (validated by the caller).
        same: checkpoint key -> the key of a tensor of the same shape that must equal it
            (a tied checkpoint's embedding -> its stored `lm_head.weight`), compared row by
            row as the first is read: each process compares the rows it reads, and together
            they cover every row.

    Returns:
        `(model, loaded keys, initialised keys -> value, missing keys)`, as
        `_keys.from_state_dict`.

    Raises:
        RowsDiffer: a tensor differs from the one `same` says it equals (in every process).
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
            offset, parts = 0, []
            for get, out in spec.pieces():  # several for a fused tensor: read once for all
                t = K._array(model, spec, get)
                parts.append((t, out, offset, sharding_of(t)))
                where.append(K._where(spec, get))
                offset += math.prod(t.shape[n] for n in out)
            target = np.dtype(dtype or infos[0].dtype)
            differences: dict[str, int] = {}
            arrays = _piece_arrays(ckpt, key_map, spec, parts, target, fp8, same, differences)
            for k in keys:
                if same and key_map[k] in same:
                    _raise_if_different(key_map[k], same[key_map[k]], differences)
            values += [hax.NamedArray(a, p[0].axes) for a, p in zip(arrays, parts, strict=True)]
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
