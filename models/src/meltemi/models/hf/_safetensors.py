"""Safetensors checkpoints: lazy, sliced reads through the `safetensors` package and streamed
writes of `model-0000k-of-0000n.safetensors` shards with `model.safetensors.index.json`.

Reading opens a file with `safe_open(path, framework="numpy")` for each read and reads only the
requested slice (`get_slice`). The sharded loader instead calls `read_rows(name, start, stop)`,
which reads the rows one process needs of a tensor (a contiguous byte range) at once: locally
with `preadv` into a scratch buffer the checkpoint reuses, from object storage with one ranged
read; the loader copies every local device's piece from there into that device's buffer. Each
byte is read at most once per process (a column-sharded tensor is not re-read per device, nor
page-faulted through a mapping), and the process never holds more of a checkpoint than one
tensor's rows. Writing streams one tensor at a time:
the shard plan and every header are computed from shapes and dtypes alone, then each tensor is
produced, written and dropped. (The `safetensors` package can only write a whole in-memory
dict, hence the writer here; what it writes is read back by the package in the tests.)

Float8 tensors (`F8_E4M3`, `F8_E5M2`, ...) are `ml_dtypes` arrays. The package's numpy reader
cannot build them (it looks the dtype up on `numpy` itself), so for those the reader takes the
tensor's byte offset from the header and reads the rows it needs directly (the same ranged read
as for object storage).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import pathlib
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, which safe_open needs for BF16)
import numpy as np
from safetensors import SafetensorError, safe_open

from meltemi.models.hf import _host_memory, _storage

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
DEFAULT_SHARD_BYTES = 5 * 1024**3
_COMPARE_BYTES = 64 * 1024**2  # `first_difference` reads at most this much at a time

_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("bool"),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E4M3FNUZ": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "F8_E5M2FNUZ": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
}
_NAMES = {v: k for k, v in _DTYPES.items()}
# Dtypes `safe_open(..., framework="numpy")` cannot return: read by byte offset instead.
_RANGED = frozenset(v for k, v in _DTYPES.items() if k.startswith("F8_"))


def _dtype_of(path: Any, name: str, kind: str) -> np.dtype:
    if kind not in _DTYPES:
        raise SafetensorsError(
            f"{path}: tensor {name!r} has dtype {kind}, which meltemi.models cannot load "
            f"(supported: {sorted(_DTYPES)}); convert the checkpoint to one of those, e.g. "
            "to bfloat16"
        )
    return _DTYPES[kind]


class SafetensorsError(ValueError):
    """A safetensors file or index is malformed or does not hold the expected tensors."""


SafetensorsError.__module__ = "meltemi.models"


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """Where a checkpoint tensor lives and what it is (no data)."""

    file: Any
    shape: tuple[int, ...]
    dtype: np.dtype
    #: Byte offset of the tensor's data in `file` (for ranged reads on object storage).
    start: int = 0


@contextlib.contextmanager
def _open(path: pathlib.Path) -> Iterator[Any]:
    try:
        with safe_open(str(path), framework="numpy") as f:
            yield f
    except SafetensorError as e:
        raise SafetensorsError(f"{path}: not a readable safetensors file ({e})") from e


class Checkpoint:
    """The tensors of a checkpoint directory (index + shards, or one `model.safetensors`).

    Only headers are read on construction; `read(name, index)` reads one slice.
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = _storage.as_path(directory)
        self.remote = _storage.is_url(self.directory)
        index = self.directory / INDEX_NAME
        single = self.directory / SINGLE_NAME
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise SafetensorsError(f"{index}: not a safetensors index ({e!r})") from e
            files = sorted(set(weight_map.values()))
        elif single.exists():
            weight_map, files = None, [SINGLE_NAME]
        else:
            raise SafetensorsError(
                f"{self.directory} holds neither {INDEX_NAME} nor {SINGLE_NAME}; "
                "is it a Hugging Face checkpoint directory?"
            )
        missing = [f for f in files if not (self.directory / f).exists()]
        if missing:
            raise SafetensorsError(f"{index}: shard files {missing} are missing")
        self.tensors: dict[str, TensorInfo] = {}
        for file_name in files:
            path = self.directory / file_name
            if self.remote:  # the header only: two ranged reads
                self.tensors.update(_remote_header(path))
                continue
            with _open(path) as f:
                names = list(f.keys())
                for name in names:
                    piece = f.get_slice(name)
                    kind = _dtype_of(path, name, piece.get_dtype())
                    self.tensors[name] = TensorInfo(path, tuple(piece.get_shape()), kind)
            if any(self.tensors[n].dtype in _RANGED for n in names):
                self.tensors.update(_remote_header(path))  # the byte offsets, for `read`
        if weight_map is not None:
            absent = sorted(k for k, f in weight_map.items() if k not in self.tensors)
            if absent:
                raise SafetensorsError(f"{index} lists tensors no shard holds: {absent[:5]}")

        self._starts: dict[str, int] = {}
        self._files: dict[Any, int] = {}
        self._scratch: dict[str, np.ndarray] = {}  # `read_rows`' and `first_difference`'s

    def read_rows(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows `[start, stop)` (of the first dimension; default: all) of tensor `name`, read
        in one piece: the rows of a row-major tensor are one contiguous byte range. A local
        file is read with `preadv` into a scratch buffer this checkpoint reuses (valid until
        the next `read_rows`), object storage with one ranged read. Read-only."""
        return self._read_rows(name, start, stop, "rows")

    def first_difference(self, name: str, rows: np.ndarray, start: int) -> int | None:
        """The first row in `[start, start + len(rows))` where tensor `name` differs from
        `rows` (NaN differs from everything, as in `np.array_equal`), or None when they are
        equal. Reads those rows of `name` once, in blocks of at most `_COMPARE_BYTES` (one
        `preadv` or ranged read each) into a buffer of their own, so `rows` may be what
        `read_rows` returned."""
        info = self.tensors[name]
        if info.shape[1:] != rows.shape[1:]:
            raise ValueError(f"{name}: rows of shape {info.shape[1:]}, compared with {rows.shape}")
        row_bytes = max(1, math.prod(info.shape[1:]) * info.dtype.itemsize)
        step = max(1, _COMPARE_BYTES // row_bytes)
        for lo in range(0, len(rows), step):
            hi = min(lo + step, len(rows))
            block = self._read_rows(name, start + lo, start + hi, "compare")
            differs = (block != rows[lo:hi]).reshape(hi - lo, -1).any(axis=1)
            if differs.any():
                return start + lo + int(np.argmax(differs))
        return None

    def _read_rows(self, name: str, start: int, stop: int | None, slot: str) -> np.ndarray:
        info = self.tensors[name]
        if not info.shape:
            return self.read(name)
        stop = info.shape[0] if stop is None else stop
        if not 0 <= start <= stop <= info.shape[0]:
            raise ValueError(f"{name}: rows [{start}, {stop}) outside its {info.shape[0]} rows")
        shape = (stop - start, *info.shape[1:])
        row_bytes = math.prod(info.shape[1:]) * info.dtype.itemsize
        nbytes = math.prod(shape) * info.dtype.itemsize
        if nbytes == 0:
            return np.zeros(shape, info.dtype)
        if self.remote:
            first = info.start + start * row_bytes
            raw = _storage.read_range(info.file, first, first + nbytes)
            return np.frombuffer(raw, info.dtype).reshape(shape)
        if name not in self._starts:  # byte offsets of every tensor of this shard
            self._starts.update({k: t.start for k, t in _remote_header(info.file).items()})
        scratch = self._scratch.get(slot)
        if scratch is None or scratch.nbytes < nbytes:
            self._scratch.pop(slot, None)
            scratch = self._scratch[slot] = _host_memory.empty((nbytes,), np.uint8)
        target = scratch[:nbytes]
        if info.file not in self._files:
            self._files[info.file] = os.open(info.file, os.O_RDONLY)
        fd, done, first = self._files[info.file], 0, self._starts[name] + start * row_bytes
        while done < nbytes:
            got = os.preadv(fd, [target[done:]], first + done)
            if got <= 0:
                raise SafetensorsError(f"{info.file}: truncated while reading {name!r}")
            done += got
        return target.view(info.dtype).reshape(shape)

    def close(self) -> None:
        """Closes the shards `read_rows` opened and frees its buffer (reopened on demand)."""
        files, self._files, self._scratch = self._files, {}, {}
        for fd in files.values():
            os.close(fd)

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def read(self, name: str, index: tuple[slice, ...] = ()) -> np.ndarray:
        """Tensor `name`, or the block `index` (one slice per leading dimension) of it."""
        info = self.tensors[name]
        if 0 in info.shape:  # the package cannot slice an empty tensor
            return np.zeros(info.shape, info.dtype)[index]
        if self.remote or info.dtype in _RANGED:
            return _remote_read(info, index)
        with _open(info.file) as f:
            piece = f.get_slice(name)
            out = piece[index] if index else piece[:]
        return np.asarray(out, dtype=info.dtype)


def _remote_header(path: Any) -> dict[str, TensorInfo]:
    # Object storage cannot be memory-mapped, and `safe_open` needs a local file: read the
    # header (the format's 8-byte length + JSON) with ranged reads instead.
    try:
        (size,) = struct.unpack("<Q", _storage.read_range(path, 0, 8))
        header = json.loads(_storage.read_range(path, 8, 8 + size))
    except (struct.error, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SafetensorsError(f"{path}: not a readable safetensors file ({e})") from e
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        kind = _dtype_of(path, name, entry["dtype"])
        start = 8 + size + entry["data_offsets"][0]
        out[name] = TensorInfo(path, tuple(entry["shape"]), kind, start)
    return out


def _remote_read(info: TensorInfo, index: tuple[slice, ...]) -> np.ndarray:
    """The block `index` of a tensor on object storage (or a local float8 one): one ranged
    read of the rows it spans (the slice of the first dimension is contiguous), the other
    dimensions cut in memory."""
    shape = info.shape
    rows = index[0] if index else slice(None)
    first, stop, step = rows.indices(shape[0]) if shape else (0, 1, 1)
    row_bytes = math.prod(shape[1:]) * info.dtype.itemsize
    stop = max(stop, first)
    raw = _storage.read_range(
        info.file, info.start + first * row_bytes, info.start + stop * row_bytes
    )
    block = np.frombuffer(raw, dtype=info.dtype).reshape((stop - first, *shape[1:]))
    if not shape:
        return np.frombuffer(raw, dtype=info.dtype).reshape(())
    return np.array(block[(slice(None, None, step), *index[1:])])


def read_all(directory: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint directory, whole (for tests and small checkpoints)."""
    ckpt = Checkpoint(directory)
    return {name: ckpt.read(name) for name in ckpt}


# -- writing ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PendingTensor:
    """A tensor to write: its name, shape and dtype, and a function that produces it."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    produce: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def _header(group: Sequence[PendingTensor], metadata: dict[str, str]) -> bytes:
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for t in group:
        if t.dtype not in _NAMES:
            raise SafetensorsError(
                f"tensor {t.name!r} has dtype {t.dtype}, which safetensors cannot store; "
                f"cast it to one of {sorted(str(d) for d in _NAMES)}"
            )
        header[t.name] = {
            "dtype": _NAMES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)  # align the data section to 8 bytes


def _write_file(path: Any, group: Sequence[PendingTensor], metadata: dict) -> None:
    header = _header(group, metadata)
    # Locally: a temporary file renamed into place. On object storage an object appears
    # whole when its upload closes, and a rename would copy it.
    remote = _storage.is_url(path)
    tmp = path if remote else path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for t in group:
            array = np.ascontiguousarray(t.produce(), dtype=t.dtype.newbyteorder("<"))
            if array.shape != t.shape:
                raise SafetensorsError(f"{t.name}: produced shape {array.shape}, planned {t.shape}")
            f.write(array.view(np.uint8).data if array.size else b"")
            del array
    if not remote:
        os.replace(tmp, path)


def _plan(tensors: Sequence[PendingTensor], max_bytes: int) -> list[list[PendingTensor]]:
    shards: list[list[PendingTensor]] = [[]]
    used = 0
    for t in tensors:
        if shards[-1] and used + t.nbytes > max_bytes:
            shards.append([])
            used = 0
        shards[-1].append(t)
        used += t.nbytes
    return shards


def write_sharded(
    directory: str | os.PathLike,
    tensors: Sequence[PendingTensor],
    *,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    write: bool = True,
) -> list[str]:
    """Streams `tensors` into `model-0000k-of-0000n.safetensors` shards plus the index.

    Tensors keep their order; a shard is closed before it would exceed `max_shard_bytes` (a
    single larger tensor gets a shard of its own). Each tensor is produced only when its turn
    to be written comes. With `write=False` (the other processes of a multi-process save) the
    tensors are still produced, in the same order, but nothing is written.

    Returns the shard file names.

    >>> import tempfile, numpy as np
    >>> f32 = np.dtype("float32")
    >>> ts = [PendingTensor(n, (4,), f32, lambda: np.ones(4, f32)) for n in "ab"]
    >>> d = tempfile.mkdtemp()
    >>> write_sharded(d, ts, max_shard_bytes=16)
    ['model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors']
    >>> sorted(read_all(d))
    ['a', 'b']
    """
    directory = _storage.as_path(directory)
    groups = _plan(tensors, max_shard_bytes)
    names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    if not write:
        for group in groups:
            for t in group:
                t.produce()
        return names
    directory.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for file_name, group in zip(names, groups, strict=True):
        _write_file(directory / file_name, group, {"format": "pt"})
        weight_map.update(dict.fromkeys((t.name for t in group), file_name))
    index = {
        "metadata": {"total_size": int(sum(t.nbytes for t in tensors))},
        "weight_map": weight_map,
    }
    (directory / INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return names
