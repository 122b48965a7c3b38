"""A dependency-free TensorBoard scalar writer (TFRecord-framed `Event` protobufs)."""

from __future__ import annotations

import os
import pathlib
import socket
import struct
import time
from collections.abc import Mapping


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord framing uses.

    Example:
        >>> hex(crc32c(b"123456789"))
        '0xe3069283'
    """
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    return _varint((number << 3) | wire) + payload


def _bytes_field(number: int, data: bytes) -> bytes:
    return _field(number, 2, _varint(len(data)) + data)


def _event(step: int, wall_time: float, *, scalars=None, file_version=None) -> bytes:
    msg = _field(1, 1, struct.pack("<d", wall_time)) + _field(2, 0, _varint(step))
    if file_version is not None:
        msg += _bytes_field(3, file_version.encode())
    if scalars:
        summary = b"".join(
            _bytes_field(1, _bytes_field(1, tag.encode()) + _field(2, 5, struct.pack("<f", v)))
            for tag, v in scalars.items()
        )
        msg += _bytes_field(5, summary)
    return msg


class TensorBoardWriter:
    """Writes scalars to `logdir/events.out.tfevents.*`, readable by TensorBoard.

    Example:
        >>> import tempfile
        >>> writer = TensorBoardWriter(tempfile.mkdtemp())
        >>> writer.write(3, {"train/loss": 2.5})
        >>> writer.close()
    """

    def __init__(self, logdir: str | os.PathLike):
        self.logdir = pathlib.Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        self._file = (self.logdir / name).open("ab")
        self._record(_event(0, time.time(), file_version="brain.Event:2"))

    def _record(self, data: bytes) -> None:
        header = struct.pack("<Q", len(data))
        self._file.write(header + struct.pack("<I", _masked(crc32c(header))))
        self._file.write(data + struct.pack("<I", _masked(crc32c(data))))
        self._file.flush()

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        """Writes the numeric values of `scalars` at `step`."""
        numeric = {k: float(v) for k, v in scalars.items() if isinstance(v, (int, float))}
        if numeric:
            self._record(_event(step, time.time(), scalars=numeric))

    def close(self) -> None:
        self._file.close()
