"""Both ends of a LocalCluster connection: `ClientConnection` (caller) and `Server` (actor).

The server authenticates every connection before reading a single frame from it; a peer that
sends anything but a correct handshake is dropped. Frames are read on the I/O thread; calls
run on the server's executor threads (one by default, so a handle's calls run in order); pings
are answered on the I/O thread, so a method running for an hour is not mistaken for a hang.
"""

from __future__ import annotations

import itertools
import os
import queue
import socket
import sys
import threading
import time
from typing import Any

import msgpack

from meltemi.fray._errors import (
    AuthenticationError,
    CallTimeout,
    ConnectionLost,
    ProtocolError,
)
from meltemi.fray._future import Future
from meltemi.fray._loop import IOLoop
from meltemi.fray._methods import Dispatcher, error_info, remote_error
from meltemi.fray._wire import (
    HANDSHAKE_TIMEOUT_S,
    FrameReader,
    ServerHandshake,
    client_handshake,
    dumps,
    frame_size,
    loads,
    send_frame,
)

__all__ = ["ClientConnection", "Server"]

# Frame kinds (first element of the msgpack header).
CALL, PING, OK, ERR, EXPIRED, PONG = range(6)
_HEADER_BYTES = 16  # a reply's header, msgpack (kind, request id), is at most 11 bytes
_rids = itertools.count(1)


def next_rid() -> int:
    return next(_rids)


class ClientConnection:
    """An authenticated connection from a caller to one actor incarnation."""

    def __init__(
        self,
        address: tuple[str, int],
        secret: bytes,
        *,
        name: str,
        max_frame_bytes: int,
        timeout: float = HANDSHAKE_TIMEOUT_S,
    ):
        self.name = name
        self.address = address
        self._max = max_frame_bytes
        sock = socket.create_connection(address, timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client_handshake(sock, secret, timeout)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.closed = False
        self.pending: dict[int, Future] = {}
        self._send_lock = threading.Lock()
        self._reader = FrameReader(max_frame_bytes)
        self._loop = IOLoop.get()
        self._loop.add_reader(sock, self._on_readable)

    def request(self, header: list, payload: list, fut: Future) -> None:
        """Sends a CALL or PING frame; `fut` completes with the encoded reply."""
        rid = header[1]
        self.pending[rid] = fut
        if self.closed:
            self.pending.pop(rid, None)
            fut._set_error(ConnectionLost(self.name, "connection closed"))
            return
        frame = [msgpack.packb(header), *payload]
        try:
            with self._send_lock:
                send_frame(self.sock, frame, self._max, fut._deadline)
        except ProtocolError:
            self.pending.pop(rid, None)
            raise
        except TimeoutError:  # part of the frame may be out: this connection is spent
            self.pending.pop(rid, None)
            detail = "its arguments were still being sent when its deadline passed"
            fut._set_error(CallTimeout(self.name, fut._method, fut._timeout or 0.0, detail))
            self.close("a send was cut off by its deadline")
        except OSError as e:
            self.pending.pop(rid, None)
            fut._set_error(ConnectionLost(self.name, f"send failed: {e}"))

    def forget(self, rid: int) -> None:
        self.pending.pop(rid, None)

    def _on_readable(self) -> None:
        try:
            frames = self._reader.read(self.sock)
        except (OSError, ProtocolError) as e:
            self.close(f"read failed: {e}")
            return
        if frames is None:
            self.close("the actor closed the connection")
            return
        for parts in frames:
            header = msgpack.unpackb(parts[0])
            fut = self.pending.pop(header[1], None)
            if fut is not None:
                fut._set_raw((header[0], parts), _decode_reply)

    def close(self, why: str = "closed by the caller") -> None:
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self.sock)
        self._loop.call_soon(self.sock.close)
        while self.pending:
            _, fut = self.pending.popitem()
            fut._set_error(ConnectionLost(self.name, why))


def _decode_reply(raw) -> Any:
    kind, parts = raw
    if kind == OK:
        return loads(parts[1:]) if len(parts) > 1 else None
    if kind == PONG:
        return msgpack.unpackb(parts[1])
    if kind == ERR:
        name, method, info = loads(parts[1:])
        raise remote_error(name, method, info)
    if kind == EXPIRED:
        name, method, timeout = msgpack.unpackb(parts[1])
        raise CallTimeout(name, method, timeout, "its deadline passed before it started")
    raise ConnectionLost("?", f"unexpected reply kind {kind}")


class Server:
    """Serves one actor instance on `host`:`port` (0 picks a free port).

    `serve_forever()` runs calls on the calling thread (plus `max_concurrency - 1` helper
    threads); `start()` runs them on daemon threads instead.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        secret: bytes,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_frame_bytes: int,
        max_concurrency: int = 1,
        on_exit=None,
    ):
        self.dispatcher = dispatcher
        self._secret = secret
        self._max = max_frame_bytes
        self._concurrency = max_concurrency
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._on_exit = on_exit or _exit_process
        self._loop = IOLoop.get()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(512)
        listener.setblocking(False)
        self._listener = listener
        self.address: tuple[str, int] = listener.getsockname()[:2]
        self._loop.add_reader(listener, self._on_accept)

    def _on_accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, OSError):
            return
        _ServerConn(self, sock)

    def start(self) -> None:
        for i in range(self._concurrency):
            threading.Thread(target=self._work, name=f"fray-exec-{i}", daemon=True).start()

    def serve_forever(self) -> None:
        for i in range(1, self._concurrency):
            threading.Thread(target=self._work, name=f"fray-exec-{i}", daemon=True).start()
        self._work()

    def close(self) -> None:
        self._loop.remove_reader(self._listener)
        self._loop.call_soon(self._listener.close)

    def _work(self) -> None:
        get = self._queue.get
        while True:
            item = get()
            if item is None:
                return
            self._execute(*item)

    def _execute(self, conn: _ServerConn, header: tuple, parts: list, received: float) -> None:
        _, rid, method, deadline, key, timeout = header
        d = self.dispatcher
        if deadline and time.time() > deadline:
            body = msgpack.packb((d.name, method, timeout))
            conn.send([msgpack.packb((EXPIRED, rid)), body])
            return
        if key is not None:
            respond = lambda reply: conn.send([msgpack.packb((reply[0], rid)), *reply[1]])
            if not d.dedup_begin(key, respond):
                return
        try:
            args, kwargs = loads(parts[1:]) if len(parts) > 1 else ((), {})
        except Exception as e:  # e.g. an argument's class does not import here
            ok, value = False, error_info(e)
        else:
            try:
                ok, value = d.invoke(method, args, kwargs)
            except SystemExit as e:
                self._on_exit(e.code)
                return
        if ok:
            try:
                payload = dumps(value)
            except Exception as e:
                ok, value = False, error_info(e)
            else:
                size = frame_size(payload) + _HEADER_BYTES
                if size > self._max:  # sending it would fail; say why instead of dying
                    too_big = ProtocolError(
                        f"{d.name}.{method}() returned {size} bytes, more than "
                        f"max_frame_bytes={self._max}; return it in pieces or raise the "
                        "cluster's max_frame_bytes"
                    )
                    ok, value = False, error_info(too_big)
        if not ok:
            payload = dumps((d.name, method, value))
        reply = (OK if ok else ERR, payload)
        d.record(ok, received)
        if key is not None:
            d.dedup_finish(key, reply)
        else:
            conn.send([msgpack.packb((reply[0], rid)), *payload])

    def stats(self) -> dict:
        return self.dispatcher.stats.snapshot()


def _exit_process(code) -> None:
    """`sys.exit(code)` inside a method ends the actor's process with that code."""
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


class _ServerConn:
    __slots__ = ("server", "sock", "hs", "reader", "send_lock", "timer", "closed", "loop")

    def __init__(self, server: Server, sock: socket.socket):
        self.server = server
        self.sock = sock
        self.loop = server._loop
        self.closed = False
        self.send_lock = threading.Lock()
        self.reader: FrameReader | None = None
        sock.setblocking(True)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.hs: ServerHandshake | None = ServerHandshake(server._secret)
        try:
            sock.send(self.hs.challenge())
        except OSError:
            sock.close()
            self.closed = True
            return
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
        self.timer = self.loop.call_at(deadline, lambda: self.drop("handshake timed out"))
        self.loop.add_reader(sock, self._on_readable)

    def drop(self, why: str) -> None:
        if self.closed:
            return
        self.closed = True
        if self.hs is not None:
            # Never echo what the peer sent; say only that it was refused.
            print(f"fray: dropped unauthenticated connection: {why}", file=sys.stderr, flush=True)
        IOLoop.cancel(self.timer)
        self.loop.remove_reader(self.sock)
        self.sock.close()

    def send(self, parts: list) -> None:
        if self.closed:
            return
        try:
            with self.send_lock:
                send_frame(self.sock, parts, self.server._max)
        except OSError:
            pass  # the caller went away; its handle reports the lost connection
        except ProtocolError as e:  # never let one reply end the server: drop this caller
            print(f"fray: dropped a reply: {e}", file=sys.stderr, flush=True)
            self.loop.call_soon(lambda: self.drop("a reply broke the protocol"))

    def _on_readable(self) -> None:
        if self.hs is not None:
            self._handshake_step()
            return
        try:
            frames = self.reader.read(self.sock)
        except (OSError, ProtocolError) as e:
            self.drop(f"bad frame: {e}")
            return
        if frames is None:
            self.drop("peer closed")
            return
        server = self.server
        for parts in frames:
            header = msgpack.unpackb(parts[0], use_list=False)
            kind = header[0]
            if kind == CALL:
                server._queue.put((self, header, parts, time.perf_counter()))
            elif kind == PING:
                stats = msgpack.packb(server.stats())
                self.send([msgpack.packb((PONG, header[1])), stats])
            else:
                self.drop(f"unknown frame kind {kind}")
                return

    def _handshake_step(self) -> None:
        try:
            data = self.sock.recv(self.hs.wanted())
        except OSError as e:
            self.drop(f"read failed during handshake: {e}")
            return
        if not data:
            self.drop("peer closed during handshake")
            return
        try:
            proof = self.hs.feed(data)
        except AuthenticationError as e:
            self.drop(str(e))
            return
        if proof is None:
            return
        try:
            self.sock.sendall(proof)
        except OSError:
            self.drop("peer closed after handshake")
            return
        self.hs = None
        IOLoop.cancel(self.timer)
        self.reader = FrameReader(self.server._max)


def ping(conn: ClientConnection, fut: Future) -> None:
    conn.request([PING, next_rid()], [], fut)


def encode_call(method: str, payload: list, deadline_wall: float, key, timeout):
    """A CALL frame's header and payload; `payload` is `dumps((args, kwargs))` or [] for none."""
    header = [CALL, next_rid(), method, deadline_wall, key, timeout]
    return header, payload
