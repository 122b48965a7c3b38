"""Sharded safetensors I/O with a `model.safetensors.index.json`, in plain numpy.

The format is an 8-byte little-endian header length, a JSON header mapping each tensor name to
`{"dtype", "shape", "data_offsets"}` (plus an optional `__metadata__` of strings), then the raw
little-endian bytes. Reading memory-maps the files, so a tensor is only paged in when used.
"""

from __future__ import annotations

import json
import os
import pathlib
import struct
from collections.abc import Iterator, Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
DEFAULT_SHARD_BYTES = 5 * 1024**3

_DTYPES: dict[str, Any] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(jnp.bfloat16),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("bool"),
}
_NAMES = {v: k for k, v in _DTYPES.items()}


class SafetensorsError(ValueError):
    """A safetensors file or index is malformed or does not hold the expected tensors."""


SafetensorsError.__module__ = "meltemi.models"


def _header(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None) -> bytes:
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name, array in tensors.items():
        if array.dtype not in _NAMES:
            raise SafetensorsError(
                f"tensor {name!r} has dtype {array.dtype}, which safetensors cannot store; "
                f"cast it to one of {sorted(str(d) for d in _NAMES)}"
            )
        header[name] = {
            "dtype": _NAMES[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)  # align the data section to 8 bytes


def write_file(
    path: str | os.PathLike, tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None
) -> None:
    """Writes `tensors` (name -> array-like) to one safetensors file.

    >>> import tempfile, numpy as np
    >>> p = tempfile.mkdtemp() + "/x.safetensors"
    >>> write_file(p, {"w": np.arange(6, dtype=np.float32).reshape(2, 3)})
    >>> read_file(p)["w"].tolist()
    [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    """
    arrays = {k: np.ascontiguousarray(np.asarray(v)) for k, v in tensors.items()}
    arrays = {k: v.astype(v.dtype.newbyteorder("<")) for k, v in arrays.items()}
    header = _header(arrays, metadata)
    tmp = pathlib.Path(str(path) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for array in arrays.values():
            f.write(array.tobytes())
    os.replace(tmp, path)


def read_file(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Memory-maps every tensor of one safetensors file (read-only numpy arrays)."""
    path = pathlib.Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > size - 8:
            raise SafetensorsError(f"{path}: header length {n} exceeds the file size {size}")
        try:
            header = json.loads(f.read(n))
        except json.JSONDecodeError as e:
            raise SafetensorsError(f"{path}: header is not JSON ({e})") from e
    header.pop("__metadata__", None)
    out: dict[str, np.ndarray] = {}
    if not header:
        return out
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    for name, info in header.items():
        if info["dtype"] not in _DTYPES:
            raise SafetensorsError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        start, end = info["data_offsets"]
        dtype = _DTYPES[info["dtype"]]
        shape = tuple(info["shape"])
        if end - start != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise SafetensorsError(f"{path}: tensor {name!r} byte range does not match its shape")
        out[name] = data[start:end].view(dtype).reshape(shape)
    return out


def _shards(tensors: Mapping[str, np.ndarray], max_bytes: int) -> list[list[str]]:
    shards: list[list[str]] = [[]]
    used = 0
    for name, array in tensors.items():
        if shards[-1] and used + array.nbytes > max_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += array.nbytes
    return shards


def write_sharded(
    directory: str | os.PathLike,
    tensors: Mapping[str, Any],
    *,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    metadata: Mapping[str, str] | None = None,
) -> list[str]:
    """Writes `model-0000k-of-0000n.safetensors` shards and `model.safetensors.index.json`.

    Returns the shard file names. Tensors keep their insertion order; a shard is closed
    before it would exceed `max_shard_bytes` (a single larger tensor gets a shard of its own).

    >>> import tempfile, numpy as np
    >>> d = tempfile.mkdtemp()
    >>> write_sharded(d, {"a": np.zeros(4, np.float32), "b": np.ones(4, np.float32)},
    ...               max_shard_bytes=16)
    ['model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors']
    >>> sorted(read_sharded(d))
    ['a', 'b']
    """
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {k: np.asarray(v) for k, v in tensors.items()}
    groups = _shards(arrays, max_shard_bytes)
    names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    weight_map = {}
    meta = {"format": "pt", **(metadata or {})}
    for file_name, group in zip(names, groups, strict=True):
        write_file(directory / file_name, {k: arrays[k] for k in group}, meta)
        weight_map.update(dict.fromkeys(group, file_name))
    index = {
        "metadata": {"total_size": int(sum(a.nbytes for a in arrays.values()))},
        "weight_map": weight_map,
    }
    (directory / INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return names


class ShardedReader(Mapping[str, np.ndarray]):
    """Read-only mapping over the tensors of a checkpoint directory (index or single file)."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = pathlib.Path(directory)
        index = self.directory / INDEX_NAME
        single = self.directory / SINGLE_NAME
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise SafetensorsError(f"{index}: not a safetensors index ({e!r})") from e
        elif single.exists():
            weight_map = dict.fromkeys(read_file(single), SINGLE_NAME)
        else:
            raise SafetensorsError(
                f"{self.directory} holds neither {INDEX_NAME} nor {SINGLE_NAME}; "
                "is it a Hugging Face checkpoint directory?"
            )
        missing = sorted({f for f in weight_map.values() if not (self.directory / f).exists()})
        if missing:
            raise SafetensorsError(f"{index}: shard files {missing} are missing")
        self._weight_map: dict[str, str] = weight_map
        self._files: dict[str, dict[str, np.ndarray]] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        file_name = self._weight_map[name]
        if file_name not in self._files:
            self._files[file_name] = read_file(self.directory / file_name)
        try:
            return self._files[file_name][name]
        except KeyError:
            raise SafetensorsError(
                f"{self.directory / file_name} lacks tensor {name!r} listed in the index"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._weight_map)

    def __len__(self) -> int:
        return len(self._weight_map)


def read_sharded(directory: str | os.PathLike) -> ShardedReader:
    """A lazy name -> array mapping over a checkpoint directory's safetensors."""
    return ShardedReader(directory)
