"""LocalCluster security: nothing is unpickled before the HMAC handshake; wrong secrets fail."""

from __future__ import annotations

import json
import os
import pickle
import secrets
import shutil
import socket
import stat
import struct
import subprocess
import sys
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


def _listening_addresses(port: int) -> set[str]:
    """The local addresses of the TCP sockets listening on `port`, as the kernel lists them
    (`/proc/net/tcp*` on Linux; psutil elsewhere): what the socket is bound to, not what the
    cluster reports."""
    found = set()
    if os.path.exists("/proc/net/tcp"):
        for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
            try:
                with open(f"/proc/net/{name}") as f:
                    rows = f.read().splitlines()[1:]
            except FileNotFoundError:  # a kernel without IPv6
                continue
            for row in rows:
                local, state = row.split()[1], row.split()[3]
                addr, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: TCP_LISTEN
                    raw = bytes.fromhex(addr)  # 32-bit words in host (little-endian) order
                    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                    found.add(socket.inet_ntop(family, raw))
        return found
    import psutil

    return {c.laddr.ip for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}  # fmt: skip


def test_actors_listen_on_loopback_only(cluster):
    counter = cluster.spawn(Counter)
    assert counter.noop() is None  # up and serving
    assert counter.address[0] == "127.0.0.1"  # what the cluster reports ...
    assert _listening_addresses(counter.address[1]) == {"127.0.0.1"}  # ... and the kernel


def test_the_listen_check_sees_a_socket_bound_to_every_interface():
    # The check above can fail: a socket bound to all interfaces is listed as such.
    with socket.create_server(("0.0.0.0", 0)) as everywhere:
        assert _listening_addresses(everywhere.getsockname()[1]) == {"0.0.0.0"}
    with socket.create_server(("127.0.0.1", 0)) as loopback:
        assert _listening_addresses(loopback.getsockname()[1]) == {"127.0.0.1"}


# Run in a private network namespace holding only `lo` and a non-loopback address on it
# (198.51.100.7, TEST-NET-2): an actor's port must refuse that address, while a socket bound
# to every interface accepts it (so the probe itself works).
_IN_NAMESPACE = """
import json, socket, sys
sys.path[:0] = json.loads(sys.argv[1])
from fray_test_actors import Counter
from meltemi import fray

def reached(port):
    with socket.socket() as probe:
        probe.bind(("198.51.100.7", 0))
        try:
            probe.connect(("198.51.100.7", port))
        except OSError:
            return False
        return True

with fray.LocalCluster() as cluster:
    counter = cluster.spawn(Counter)
    actor = reached(counter.address[1])
    assert counter.add(1) == 1
with socket.create_server(("0.0.0.0", 0)) as everywhere:
    control = reached(everywhere.getsockname()[1])
print(json.dumps({"actor": actor, "control": control}))
"""
_NETNS = ["unshare", "-rn", "sh", "-c",
          'ip link set lo up && ip addr add 198.51.100.7/32 dev lo && exec "$@"', "sh"]  # fmt: skip


def _namespace_works() -> bool:
    if not (shutil.which("unshare") and shutil.which("ip")):
        return False
    probe = subprocess.run([*_NETNS, "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


def test_a_non_loopback_address_cannot_reach_an_actor():
    if _namespace_works():
        paths = [p or os.getcwd() for p in sys.path]
        code = [sys.executable, "-c", _IN_NAMESPACE, json.dumps(paths)]
        proc = subprocess.run([*_NETNS, *code], capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(proc.stdout.splitlines()[-1]) == {"actor": False, "control": True}
        return
    # No network namespace here: probe from this machine's own outbound interface.
    address = _non_loopback_address()
    with fray.LocalCluster() as cluster, socket.socket() as probe:
        counter = cluster.spawn(Counter)
        probe.bind((address, 0))
        with pytest.raises(OSError):
            probe.connect((address, counter.address[1]))


def _non_loopback_address() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent; picks the outbound interface
            address = s.getsockname()[0]
        except OSError:
            address = "127.0.0.1"
    if address.startswith("127."):
        pytest.skip(
            "no network namespace (unshare -rn) and no non-loopback interface to probe from; "
            "test_actors_listen_on_loopback_only still checked the bound address"
        )
    return address
