"""LocalCluster security: nothing is unpickled before the HMAC handshake; wrong secrets fail."""

from __future__ import annotations

import os
import pickle
import secrets
import socket
import stat
import struct
import threading

import msgpack
import pytest
from fray_test_actors import Counter

from meltemi import fray
from meltemi.fray import _server, _wire


class _CreatesFile:
    """Unpickling this creates the file at `path` (what an attacker's pickle would do)."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _malicious_frame(path: str) -> bytes:
    header = b"\x91\x00"  # msgpack [0]: what a CALL header starts like
    body = pickle.dumps(_CreatesFile(path), protocol=5)
    parts = [header, body]
    return struct.pack("<I2Q", 2, *map(len, parts)) + b"".join(parts)


def _assert_dropped(sock: socket.socket) -> None:
    sock.settimeout(15)
    received = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except ConnectionResetError:
            return
        if not chunk:
            break
        received += chunk
    # Whatever arrived was at most the 40-byte challenge: the server never answered a frame.
    assert len(received) <= _wire.CHALLENGE_BYTES


@pytest.fixture
def cluster():
    with fray.LocalCluster() as cluster:
        yield cluster


def test_raw_pickle_without_handshake_is_dropped_and_never_loaded(cluster, tmp_path):
    counter = cluster.spawn(Counter)
    target = tmp_path / "pwned"
    with socket.create_connection(counter.address) as sock:
        sock.sendall(_malicious_frame(str(target)))
        _assert_dropped(sock)
    assert not target.exists()
    assert counter.add(1) == 1  # the actor is unharmed


def test_pickle_sent_in_place_of_the_handshake_response_is_dropped(cluster, tmp_path):
    counter = cluster.spawn(Counter)
    target = tmp_path / "pwned"
    with socket.create_connection(counter.address) as sock:
        challenge = sock.recv(_wire.CHALLENGE_BYTES)
        assert challenge.startswith(_wire.MAGIC)
        sock.sendall(_malicious_frame(str(target)))
        _assert_dropped(sock)
    assert not target.exists()


def test_handshake_with_the_wrong_secret_is_refused(cluster, tmp_path):
    counter = cluster.spawn(Counter)
    target = tmp_path / "pwned"
    with socket.create_connection(counter.address) as sock:
        with pytest.raises(fray.AuthenticationError, match="wrong cluster secret"):
            _wire.client_handshake(sock, secrets.token_bytes(32), timeout=10)
        # Even a peer that ignores the refusal cannot get a frame read.
        try:
            sock.sendall(_malicious_frame(str(target)))
        except OSError:
            pass
        _assert_dropped(sock)
    assert not target.exists()


def test_connection_with_the_right_secret_is_served(cluster):
    counter = cluster.spawn(Counter, 30)
    secret = _wire.read_secret(cluster.secret_path)
    with socket.create_connection(counter.address) as sock:
        _wire.client_handshake(sock, secret, timeout=10)
        # Served means answered: a raw CALL frame on this socket gets the method's result.
        header, payload = _server.encode_call("add", _wire.dumps(((7,), {})), 0.0, None, None)
        _wire.send_frame(sock, [msgpack.packb(header), *payload], 1 << 20)
        sock.settimeout(15)
        reply = _wire.recv_frame(sock, 1 << 20)
    kind, rid = msgpack.unpackb(reply[0])
    assert (kind, rid) == (_server.OK, header[1])
    assert _wire.loads(reply[1:]) == 37
    assert counter.value() == 37  # it ran in the actor, once


def test_client_refuses_a_server_that_cannot_prove_the_secret():
    listener = socket.create_server(("127.0.0.1", 0))

    def fake_server():
        conn, _ = listener.accept()
        with conn:
            conn.sendall(_wire.MAGIC + secrets.token_bytes(32))
            conn.recv(_wire.RESPONSE_BYTES)
            conn.sendall(secrets.token_bytes(_wire.MAC_BYTES))  # a guess, not a proof
            conn.recv(1)

    thread = threading.Thread(target=fake_server, daemon=True)
    thread.start()
    with socket.create_connection(listener.getsockname()) as sock:
        with pytest.raises(fray.AuthenticationError, match="failed to prove"):
            _wire.client_handshake(sock, secrets.token_bytes(32), timeout=10)
    listener.close()


def test_secret_file_is_private_and_never_logged(cluster):
    counter = cluster.spawn(Counter)
    counter.noop()
    info = os.stat(cluster.secret_path)
    assert stat.S_IMODE(info.st_mode) == 0o600
    secret = _wire.read_secret(cluster.secret_path)
    logs = os.path.join(cluster.dir, "logs")
    for name in os.listdir(logs):
        with open(os.path.join(logs, name), "rb") as f:
            text = f.read()
        assert secret not in text and secret.hex().encode() not in text


def test_group_readable_secret_is_refused(tmp_path):
    path = str(tmp_path / "secret")
    _wire.create_secret(path)
    os.chmod(path, 0o640)
    with pytest.raises(fray.AuthenticationError, match="chmod 600"):
        _wire.read_secret(path)


def test_message_larger_than_the_frame_limit_is_refused():
    with fray.LocalCluster(max_frame_bytes=64 * 1024) as cluster:
        counter = cluster.spawn(Counter)
        with pytest.raises(fray.ProtocolError, match="exceeds max_frame_bytes=65536"):
            counter.echo(b"x" * 100_001)
        assert counter.add(1) == 1


def test_authenticated_peer_announcing_a_huge_frame_is_dropped(cluster):
    counter = cluster.spawn(Counter)
    secret = _wire.read_secret(cluster.secret_path)
    with socket.create_connection(counter.address) as sock:
        _wire.client_handshake(sock, secret, timeout=10)
        sock.sendall(struct.pack("<I2Q", 2, 8, 1 << 40))
        sock.settimeout(15)
        assert sock.recv(16) == b""
    assert counter.add(1) == 1


def test_actors_listen_on_loopback_only(cluster):
    counter = cluster.spawn(Counter)
    assert counter.address[0] == "127.0.0.1"
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        with pytest.raises(OSError):
            # Any address other than loopback cannot reach the port.
            probe.connect((_non_loopback_address(), counter.address[1]))


def _non_loopback_address() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent; picks the outbound interface
            address = s.getsockname()[0]
        except OSError:
            address = "127.0.0.1"
    if address.startswith("127."):
        pytest.skip("this machine has no non-loopback interface")
    return address
