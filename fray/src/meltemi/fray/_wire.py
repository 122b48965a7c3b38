"""The LocalCluster wire protocol: secrets, handshake, frames, payload encoding.

Handshake (fixed sizes, raw bytes, nothing decoded but a magic string and two MACs):

    server -> client   MAGIC | server_nonce                    (8 + 32 bytes)
    client -> server   MAGIC | client_nonce | client_mac        (8 + 32 + 32 bytes)
    server -> client   server_mac                              (32 bytes)

    client_mac = HMAC-SHA256(secret, b"fray-client" | server_nonce | client_nonce)
    server_mac = HMAC-SHA256(secret, b"fray-server" | server_nonce | client_nonce)

Both sides prove they hold the cluster secret (so a process squatting on a port cannot feed
pickles to a client either); fresh nonces stop replays; the labels stop reflection.

Frames (after the handshake):

    u32 n | u64 len[0] ... u64 len[n-1] | part[0] ... part[n-1]      (little endian)

part 0 is a msgpack header; part 1, if present, a pickle (protocol 5); parts 2.. the pickle's
out-of-band buffers (large numpy arrays travel as raw bytes, never copied into the pickle).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import secrets
import socket
import stat
import struct
import time
from collections.abc import Sequence

import cloudpickle

from meltemi.fray._errors import AuthenticationError, ProtocolError

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "FrameReader",
    "client_handshake",
    "create_secret",
    "dumps",
    "loads",
    "read_secret",
    "recv_frame",
    "send_frame",
]

MAGIC = b"FRAY\x00\x01\x00\x00"  # protocol name and version
NONCE_BYTES = 32
MAC_BYTES = 32
SECRET_BYTES = 32
CHALLENGE_BYTES = len(MAGIC) + NONCE_BYTES
RESPONSE_BYTES = len(MAGIC) + NONCE_BYTES + MAC_BYTES
HANDSHAKE_TIMEOUT_S = 10.0
DEFAULT_MAX_FRAME_BYTES = 1 << 30
MAX_PARTS = 256  # below IOV_MAX (1024) so a frame is one sendmsg
OOB_MIN_BYTES = 64 * 1024  # smaller buffers stay inside the pickle
_RECV_CHUNK = 64 * 1024
_BIG_FRAME = 256 * 1024  # frames this large are received straight into their final buffer


# -- secrets -----------------------------------------------------------------------------
def create_secret(path: str) -> None:
    """Writes a fresh random secret to `path` (which must not exist) with mode 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, secrets.token_bytes(SECRET_BYTES))
    finally:
        os.close(fd)


def read_secret(path: str) -> bytes:
    """Reads a cluster secret, refusing files other users could read or write.

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp()
        >>> create_secret(os.path.join(d, "secret"))
        >>> len(read_secret(os.path.join(d, "secret")))
        32
        >>> os.chmod(os.path.join(d, "secret"), 0o644)
        >>> read_secret(os.path.join(d, "secret"))
        Traceback (most recent call last):
        ...
        meltemi.fray._errors.AuthenticationError: cluster secret .../secret has mode 0o644; ...
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid():
            raise AuthenticationError(
                f"cluster secret {path} belongs to uid {info.st_uid}, not to this user "
                f"(uid {os.getuid()}); use a cluster started by this user"
            )
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise AuthenticationError(
                f"cluster secret {path} has mode {oct(mode)}; it must be private to its "
                f"owner: chmod 600 {path}"
            )
        data = os.read(fd, SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != SECRET_BYTES:
        raise AuthenticationError(
            f"cluster secret {path} holds {len(data)} bytes, expected {SECRET_BYTES}"
        )
    return data


# -- handshake ---------------------------------------------------------------------------
def client_mac(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    msg = b"fray-client" + server_nonce + client_nonce
    return hmac.new(secret, msg, hashlib.sha256).digest()


def server_mac(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    msg = b"fray-server" + server_nonce + client_nonce
    return hmac.new(secret, msg, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int, what: str) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise AuthenticationError(
                f"peer closed the connection during the handshake ({what}); is it a fray "
                "server of the same cluster?"
            )
        buf += chunk
    return bytes(buf)


def client_handshake(sock: socket.socket, secret: bytes, timeout: float) -> None:
    """Authenticates both ends of a fresh connection; raises AuthenticationError."""
    sock.settimeout(timeout)
    try:
        challenge = _recv_exact(sock, CHALLENGE_BYTES, "challenge")
        if challenge[: len(MAGIC)] != MAGIC:
            raise AuthenticationError("peer is not a fray server (bad magic in its challenge)")
        server_nonce = challenge[len(MAGIC) :]
        client_nonce = secrets.token_bytes(NONCE_BYTES)
        sock.sendall(MAGIC + client_nonce + client_mac(secret, server_nonce, client_nonce))
        proof = _recv_exact(sock, MAC_BYTES, "server proof; wrong cluster secret?")
        if not hmac.compare_digest(proof, server_mac(secret, server_nonce, client_nonce)):
            raise AuthenticationError(
                "the server failed to prove it holds the cluster secret; refusing to talk to it"
            )
    except TimeoutError as e:
        raise AuthenticationError(f"handshake timed out after {timeout:g} s") from e
    sock.settimeout(None)


class ServerHandshake:
    """The server side of the handshake, fed bytes as they arrive (never decodes a frame)."""

    __slots__ = ("_secret", "_nonce", "_buf")

    def __init__(self, secret: bytes):
        self._secret = secret
        self._nonce = secrets.token_bytes(NONCE_BYTES)
        self._buf = b""

    def challenge(self) -> bytes:
        return MAGIC + self._nonce

    def wanted(self) -> int:
        """Bytes still expected; read no more than this before the handshake succeeds."""
        return RESPONSE_BYTES - len(self._buf)

    def feed(self, data: bytes) -> bytes | None:
        """Returns the proof to send once complete, None if more bytes are needed.

        Raises:
            AuthenticationError: bad magic (checked as soon as it arrives) or a wrong MAC.
        """
        self._buf += data
        head = self._buf[: len(MAGIC)]
        if head != MAGIC[: len(head)]:
            raise AuthenticationError("peer sent something other than a fray handshake")
        if len(self._buf) < RESPONSE_BYTES:
            return None
        client_nonce = self._buf[len(MAGIC) : len(MAGIC) + NONCE_BYTES]
        mac = self._buf[len(MAGIC) + NONCE_BYTES :]
        if not hmac.compare_digest(mac, client_mac(self._secret, self._nonce, client_nonce)):
            raise AuthenticationError("peer failed the HMAC challenge (wrong cluster secret)")
        return server_mac(self._secret, self._nonce, client_nonce)


# -- payloads ----------------------------------------------------------------------------
def dumps(obj) -> list:
    """Pickles `obj` (protocol 5) into `[payload, *out_of_band_buffers]`.

    The C pickler is tried first; objects it cannot handle (lambdas, classes defined in
    `__main__` or inside functions) go through cloudpickle.

    Example:
        >>> loads(dumps({"a": 1}))
        {'a': 1}
        >>> loads(dumps(lambda x: x + 1))(2)
        3
    """
    buffers: list = []

    def keep(buf: pickle.PickleBuffer):
        try:
            raw = buf.raw()
        except BufferError:
            return True
        if raw.nbytes < OOB_MIN_BYTES or len(buffers) >= MAX_PARTS - 2:
            return True
        buffers.append(raw)
        return False

    try:
        data = pickle.dumps(obj, protocol=5, buffer_callback=keep)
    except (pickle.PicklingError, AttributeError, TypeError):
        buffers.clear()
        data = cloudpickle.dumps(obj, protocol=5, buffer_callback=keep)
    return [data, *buffers]


def loads(parts: Sequence) -> object:
    """Inverse of `dumps`."""
    return pickle.loads(parts[0], buffers=parts[1:])


# -- frames ------------------------------------------------------------------------------
def frame_size(parts: Sequence) -> int:
    return sum(memoryview(p).nbytes for p in parts)


def send_frame(
    sock: socket.socket, parts: Sequence, max_frame_bytes: int, deadline: float | None = None
) -> None:
    """Sends one frame (the caller holds the socket's send lock).

    With a `deadline` (`time.monotonic()`), raises TimeoutError once it passes with the frame
    not fully sent; the connection is then unusable (part of a frame went out) and must close.
    """
    lens = [memoryview(p).nbytes for p in parts]
    total = sum(lens)
    if total > max_frame_bytes:
        raise ProtocolError(
            f"message of {total} bytes exceeds max_frame_bytes={max_frame_bytes}; send it in "
            "pieces or raise the cluster's max_frame_bytes"
        )
    prefix = struct.pack(f"<I{len(parts)}Q", len(parts), *lens)
    if total < 64 * 1024:
        data = prefix + b"".join(parts)
        if deadline is None:
            sock.sendall(data)
            return
        try:  # the common case, a buffer with room: no timeout to set and reset
            sent = sock.send(data, socket.MSG_DONTWAIT)
        except BlockingIOError:
            sent = 0
        if sent == len(data):
            return
        _time_left(sock, deadline)
        try:
            sock.sendall(memoryview(data)[sent:])  # one timeout for the whole rest
        finally:
            sock.settimeout(None)
        return
    if deadline is not None:
        _time_left(sock, deadline)
    try:
        views = [memoryview(prefix), *(memoryview(p).cast("B") for p in parts)]
        while views:
            sent = sock.sendmsg(views)
            while views and sent >= views[0].nbytes:
                sent -= views[0].nbytes
                views.pop(0)
            if views and sent:
                views[0] = views[0][sent:]
            if views and deadline is not None:
                _time_left(sock, deadline)
    finally:
        if deadline is not None:
            sock.settimeout(None)


def _time_left(sock: socket.socket, deadline: float) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the deadline passed while sending")
    sock.settimeout(left)


class FrameReader:
    """Incremental frame parser; `read(sock)` returns the frames completed by one recv.

    Small frames are cut from an accumulation buffer; a frame of at least 256 KiB gets one
    buffer of its exact size that the socket fills directly, so a 10 MiB array is copied once
    by the kernel and never again in Python.
    """

    __slots__ = ("_max", "_buf", "_big", "_fill", "_lens")

    def __init__(self, max_frame_bytes: int):
        self._max = max_frame_bytes
        self._buf = bytearray()
        self._big: bytearray | None = None
        self._fill = 0
        self._lens: tuple[int, ...] = ()

    def read(self, sock: socket.socket) -> list[list[memoryview]] | None:
        """Reads once from a readable socket; None means the peer closed it."""
        if self._big is not None:
            # Drain what the kernel holds without blocking: one wake-up moves many chunks.
            view = memoryview(self._big)
            flags = 0
            while self._fill < len(self._big):
                try:
                    n = sock.recv_into(view[self._fill :], 0, flags)
                except BlockingIOError:
                    return []
                if n == 0:
                    return None
                self._fill += n
                flags = socket.MSG_DONTWAIT
            big, self._big = self._big, None
            view.release()
            return [_split(big, self._lens)]
        data = sock.recv(_RECV_CHUNK)
        if not data:
            return None
        buf = self._buf
        buf += data
        frames = []
        while len(buf) >= 4:
            (n,) = struct.unpack_from("<I", buf, 0)
            if n == 0 or n > MAX_PARTS:
                raise ProtocolError(f"frame with {n} parts (allowed: 1..{MAX_PARTS})")
            head = 4 + 8 * n
            if len(buf) < head:
                break
            lens = struct.unpack_from(f"<{n}Q", buf, 4)
            total = sum(lens)
            if total > self._max:
                raise ProtocolError(
                    f"incoming frame of {total} bytes exceeds max_frame_bytes={self._max}"
                )
            if len(buf) - head >= total:
                body = buf[head : head + total]
                del buf[: head + total]
                frames.append(_split(body, lens))
                continue
            if total >= _BIG_FRAME:
                self._big = bytearray(total)
                have = len(buf) - head
                self._big[:have] = memoryview(buf)[head:]
                self._fill = have
                self._lens = lens
                buf.clear()
            break
        return frames


def recv_frame(sock: socket.socket, max_bytes: int) -> list[memoryview]:
    """Reads one frame from a blocking socket; raises EOFError if it closes first."""
    reader = FrameReader(max_bytes)
    while True:
        frames = reader.read(sock)
        if frames is None:
            raise EOFError("the peer closed the connection")
        if frames:
            return frames[0]


def _split(body: bytearray, lens: Sequence[int]) -> list[memoryview]:
    view = memoryview(body)
    parts, start = [], 0
    for n in lens:
        parts.append(view[start : start + n])
        start += n
    return parts
