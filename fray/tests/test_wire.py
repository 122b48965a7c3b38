"""Frames and payload encoding of the LocalCluster wire protocol."""

from __future__ import annotations

import socket
import struct
import threading
import time

import numpy as np
import pytest

from meltemi import fray
from meltemi.fray import _wire


def _frames_through(chunks: list[bytes], max_frame_bytes: int = 1 << 20) -> list:
    a, b = socket.socketpair()
    reader = _wire.FrameReader(max_frame_bytes)

    def send():
        for chunk in chunks:
            a.sendall(chunk)
        a.close()

    thread = threading.Thread(target=send)
    thread.start()
    frames = []
    while True:
        got = reader.read(b)
        if got is None:
            break
        frames += [[bytes(p) for p in f] for f in got]
    thread.join()
    b.close()
    return frames


def _encode(parts: list[bytes]) -> bytes:
    return struct.pack(f"<I{len(parts)}Q", len(parts), *map(len, parts)) + b"".join(parts)


def test_frames_split_byte_by_byte_are_reassembled():
    wire = _encode([b"head", b"body-13-bytes"]) + _encode([b"x"])
    frames = _frames_through([wire[i : i + 1] for i in range(len(wire))])
    assert frames == [[b"head", b"body-13-bytes"], [b"x"]]


def test_large_frame_is_received_into_one_buffer():
    big = bytes(range(256)) * (3 * 1024 + 5)  # 787,712 bytes: above the direct-receive size
    frames = _frames_through([_encode([b"h", big])[:1000], _encode([b"h", big])[1000:]])
    assert frames == [[b"h", big]]


def test_frame_with_too_many_parts_is_a_protocol_error():
    a, b = socket.socketpair()
    a.sendall(struct.pack("<I", _wire.MAX_PARTS + 1))
    with pytest.raises(fray.ProtocolError, match=f"{_wire.MAX_PARTS + 1} parts"):
        _wire.FrameReader(1 << 20).read(b)


def test_frame_above_the_limit_is_refused_before_it_is_read():
    a, b = socket.socketpair()
    a.sendall(struct.pack("<IQ", 1, 5000))
    with pytest.raises(fray.ProtocolError, match="5000 bytes exceeds max_frame_bytes=4096"):
        _wire.FrameReader(4096).read(b)


def test_large_arrays_travel_out_of_band():
    big = np.arange(70_001, dtype=np.int32)
    small = np.arange(11, dtype=np.int32)
    parts = _wire.dumps({"big": big, "small": small})
    assert len(parts) == 2 and memoryview(parts[1]).nbytes == big.nbytes
    back = _wire.loads([memoryview(bytearray(p)) for p in parts])
    np.testing.assert_array_equal(back["big"], big)
    np.testing.assert_array_equal(back["small"], small)
    back["big"][0] = 5  # received arrays are writable


def test_values_the_c_pickler_cannot_take_go_through_cloudpickle():
    offset = 7
    assert _wire.loads(_wire.dumps(lambda x: x + offset))(3) == 10


@pytest.mark.parametrize("part_bytes", [1000, 8 << 20])  # the small and the large send path
def test_send_frame_gives_up_at_its_deadline_when_the_peer_reads_nothing(part_bytes):
    a, b = socket.socketpair()  # b never reads: the kernel buffers fill, then sends block
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            while time.monotonic() - start < 10:
                _wire.send_frame(a, [b"h", b"x" * part_bytes], 1 << 30, start + 0.5)
        elapsed = time.monotonic() - start
        assert a.gettimeout() is None  # the socket is left blocking for the I/O loop
    finally:
        a.close()
        b.close()
    assert 0.5 <= elapsed < 1.5
