"""`LocalCluster`: every actor is a subprocess serving authenticated RPC on loopback TCP."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref

import cloudpickle
import msgpack

from meltemi.fray._cluster import Cluster
from meltemi.fray._config import Resources
from meltemi.fray._errors import AuthenticationError, ConnectionLost
from meltemi.fray._future import Future
from meltemi.fray._loop import IOLoop
from meltemi.fray._methods import Dispatcher
from meltemi.fray._records import ActorRecord, DeathInfo
from meltemi.fray._server import ClientConnection, Server, encode_call, ping
from meltemi.fray._wire import (
    DEFAULT_MAX_FRAME_BYTES,
    create_secret,
    read_secret,
    recv_frame,
    send_frame,
)

__all__ = ["LocalCluster", "cluster_root"]

_LOG_TAIL_LINES = 20


def cluster_root() -> str:
    """Where LocalClusters keep their directories: `$FRAY_ROOT` or `<tmp>/fray-<uid>`."""
    return os.environ.get("FRAY_ROOT") or os.path.join(tempfile.gettempdir(), f"fray-{os.getuid()}")


def _private_dir(path: str) -> str:
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.stat(path)
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(
            f"fray directory {path} must belong to uid {os.getuid()} with mode 0700 (it has "
            f"uid {info.st_uid}, mode {oct(info.st_mode & 0o777)}); set FRAY_ROOT to a private "
            "directory"
        )
    return path


class _Process:
    """One incarnation: a child process, its life line, and the supervisor's ping connection."""

    def __init__(self, actor, epoch, proc, life, address, log_path, ctrl):
        self.actor: ActorRecord = actor
        self.epoch: int = epoch
        self.proc: subprocess.Popen = proc
        self.life: socket.socket = life
        self.address: tuple[str, int] = address
        self.log_path: str = log_path
        self.ctrl: ClientConnection = ctrl
        self.conns: weakref.WeakSet[ClientConnection] = weakref.WeakSet()
        self.stopping = False

    def close_connections(self, why: str) -> None:
        self.ctrl.close(why)
        for conn in list(self.conns):
            conn.close(why)


def _log_tail(path: str) -> tuple[str, ...]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 8192))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ()
    return tuple(text.rstrip().splitlines()[-_LOG_TAIL_LINES:])


def _death_info(returncode: int | None, log_path: str, reason: str | None = None) -> DeathInfo:
    tail = _log_tail(log_path)
    if returncode is None:
        return DeathInfo(reason or "its process vanished", log_tail=tail)
    if returncode < 0:
        sig = -returncode
        try:
            signame = signal.Signals(sig).name
        except ValueError:
            signame = f"signal {sig}"
        return DeathInfo(reason or f"killed by {signame}", signal=sig, log_tail=tail)
    return DeathInfo(reason or "exited", exit_code=returncode, log_tail=tail)


class _Controller:
    """Served by the driver so `fray:status` (another process) can list the actors."""

    def __init__(self, cluster: LocalCluster):
        self._cluster = cluster

    def actors(self) -> list[dict]:
        return [row._asdict() for row in self._cluster.actors()]


class LocalCluster(Cluster):
    """Actors as subprocesses of this one, talking authenticated RPC over loopback TCP.

    Calls are real: arguments and results are pickled (protocol 5, large buffers out of band),
    crashes are real process deaths (`ActorDied` carries the exit code or signal and the last
    lines of the actor's log), hung processes are found by heartbeats. Every connection
    starts with an HMAC-SHA256 challenge-response on a per-cluster secret kept in
    `<dir>/secret` (mode 0600); see docs/design/fray.md for the protocol and threat model.

    Args:
        host: interface the actors listen on (loopback unless you need other machines).
        call_timeout: default deadline of every call, in seconds (None: no deadline).
        heartbeat_interval_s: how often each actor is pinged.
        heartbeat_timeout_s: an actor silent this long is killed as hung.
        start_timeout_s: how long an actor may take to import and construct itself.
        max_frame_bytes: the largest message accepted in either direction.
        cpus: CPU cores the actors may reserve in total (default: this machine's count).
        env: extra environment variables for the actor processes.

    Example:
        >>> class Echo:
        ...     def echo(self, x):
        ...         return x
        >>> with LocalCluster() as cluster:
        ...     echo = cluster.spawn(Echo, name="echo")
        ...     echo.echo([1, 2]), echo.address[0]
        ([1, 2], '127.0.0.1')
    """

    backend = "local"

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        call_timeout: float | None = 60.0,
        heartbeat_interval_s: float = 1.0,
        heartbeat_timeout_s: float = 30.0,
        start_timeout_s: float = 60.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        cpus: float | None = None,
        env: dict[str, str] | None = None,
    ):
        if isinstance(max_frame_bytes, bool) or not isinstance(max_frame_bytes, int):
            raise TypeError(f"LocalCluster(max_frame_bytes={max_frame_bytes!r}): must be an int")
        if max_frame_bytes < 1024:
            raise ValueError(
                f"LocalCluster(max_frame_bytes={max_frame_bytes}): must be at least 1024"
            )
        self.host = host
        self.start_timeout_s = float(start_timeout_s)
        self.max_frame_bytes = max_frame_bytes
        self.cpus = float(os.cpu_count() or 1) if cpus is None else float(cpus)
        self.dir = tempfile.mkdtemp(prefix="cluster-", dir=_private_dir(cluster_root()))
        os.makedirs(os.path.join(self.dir, "logs"), mode=0o700)
        self.secret_path = os.path.join(self.dir, "secret")
        create_secret(self.secret_path)
        self._secret = read_secret(self.secret_path)
        # Remove the secret even if shutdown() is never called (actors exit with the driver).
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.dir, ignore_errors=True)
        self._env = self._child_env(env or {})
        super().__init__(
            call_timeout=call_timeout,
            heartbeat_interval_s=heartbeat_interval_s,
            heartbeat_timeout_s=heartbeat_timeout_s,
        )
        self._controller = Server(
            Dispatcher(_Controller(self), "controller"),
            self._secret,
            host="127.0.0.1",
            max_frame_bytes=max_frame_bytes,
        )
        self._controller.start()
        info = {
            "pid": os.getpid(),
            "controller": list(self._controller.address),
            "started": time.time(),
        }
        with open(os.path.join(self.dir, "cluster.json"), "w") as f:
            json.dump(info, f)

    @staticmethod
    def _child_env(extra: dict[str, str]) -> dict[str, str]:
        env = dict(os.environ)
        paths = [p or os.getcwd() for p in sys.path]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env["PYTHONUNBUFFERED"] = "1"  # so the log tail in ActorDied is complete
        env.update(extra)
        return env

    # -- backend hooks ---------------------------------------------------------------------
    def _check_resources(self, resources: Resources, n: int) -> None:
        if resources.gpus:
            raise ValueError(
                f"Resources(gpus={resources.gpus}): LocalCluster does not manage accelerators; "
                "drop gpus= (the actor sees every device of this machine)"
            )
        used = sum(a.resources.cpus for a in self._reserved())
        if used + n * resources.cpus > self.cpus:
            raise ValueError(
                f"Resources(cpus={resources.cpus}) x {n}: only {self.cpus - used:g} of "
                f"LocalCluster(cpus={self.cpus:g}) are unreserved; reserve fewer cpus or raise "
                "LocalCluster(cpus=...)"
            )

    def _launch(self, members: list[ActorRecord]) -> list:
        started = []
        for m in members:
            if m.blob is None:
                m.blob = cloudpickle.dumps((m.cls, m.args, m.kwargs), protocol=5)
            started.append(self._popen(m))
        deadline = time.monotonic() + self.start_timeout_s
        return [self._await_ready(m, *s, deadline) for m, s in zip(members, started)]

    def _popen(self, m: ActorRecord):
        parent, child = socket.socketpair()
        safe = m.name.replace("/", "-")
        log_path = os.path.join(self.dir, "logs", f"{safe}.{m.epoch}.log")
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "meltemi.fray._worker", str(child.fileno())],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env,
                start_new_session=True,  # Ctrl-C goes to the driver, which stops the actors
            )
        child.close()
        spec = {
            "name": m.name,
            "rank": m.rank,
            "group": m.group,
            "group_size": m.group_size,
            "epoch": m.epoch,
            "secret_path": self.secret_path,
            "host": self.host,
            "max_frame_bytes": self.max_frame_bytes,
            "max_concurrency": m.max_concurrency,
        }
        try:
            send_frame(parent, [msgpack.packb(spec), m.blob], 1 << 62)
        except OSError:
            pass  # it died at once; _await_ready reports how
        return proc, parent, log_path

    def _await_ready(self, m, proc, life, log_path, deadline):
        life.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            msg = msgpack.unpackb(recv_frame(life, 1 << 20)[0])
        except (OSError, EOFError) as e:
            _kill(proc)
            life.close()
            if isinstance(e, TimeoutError):
                why = f"it did not start within start_timeout_s={self.start_timeout_s:g}"
                return _death_info(proc.returncode, log_path, why)
            return _death_info(proc.returncode, log_path)
        if "error" in msg:
            proc.wait()
            life.close()
            return _death_info(proc.returncode, log_path, f"its constructor raised {msg['error']}")
        life.settimeout(None)
        address = (self.host, msg["port"])
        try:
            ctrl = ClientConnection(
                address, self._secret, name=m.name, max_frame_bytes=self.max_frame_bytes
            )
        except (OSError, AuthenticationError) as e:
            _kill(proc)
            life.close()
            return _death_info(proc.returncode, log_path, f"its server refused us: {e}")
        inc = _Process(m, m.epoch, proc, life, address, log_path, ctrl)
        IOLoop.get().add_reader(life, lambda: self._on_life_line(inc))
        return inc

    def _on_life_line(self, inc: _Process) -> None:
        try:
            data = inc.life.recv(4096)
        except OSError:
            data = b""
        if data:
            return
        loop = IOLoop.get()
        loop.remove_reader(inc.life)
        loop.call_soon(inc.life.close)
        inc.ctrl.close("the actor died")
        if not inc.stopping:

            def info() -> DeathInfo:
                try:
                    code = inc.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    _kill(inc.proc)
                    code = None
                return _death_info(code, inc.log_path)

            self._report_death(inc.actor, inc.epoch, info)

    def _stop(self, inc: _Process, *, graceful: bool) -> None:
        self._stop_all([inc], graceful=graceful)

    def _stop_all(self, incs: list[_Process], graceful: bool = True) -> None:
        for inc in incs:
            inc.stopping = True
            inc.close_connections("the actor was stopped")
            if graceful:
                try:
                    inc.life.shutdown(socket.SHUT_WR)  # the actor exits on EOF
                except OSError:
                    pass
            else:
                _kill(inc.proc, wait=False)
        deadline = time.monotonic() + 3.0
        for inc in incs:
            try:
                inc.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill(inc.proc)
            _kill(inc.proc)  # reap and sweep up its process group

    def _abandon(self, inc: _Process) -> None:
        inc.close_connections("the actor died")

    def _poll(self, inc: _Process):
        # Normally the life line reports a death at once; this catches a child that forked
        # (its children keep the life line open) or a lost EOF.
        if inc.stopping or inc.proc.poll() is None:
            return None
        return lambda: _death_info(inc.proc.returncode, inc.log_path)

    def _ping(self, inc: _Process) -> Future:
        fut = Future(inc.actor.name, "ping", deadline=None)
        ping(inc.ctrl, fut)
        return fut

    def _address(self, actor: ActorRecord):
        inc = actor.inc
        return None if inc is None else inc.address

    def _pid(self, actor: ActorRecord):
        inc = actor.inc
        return None if inc is None else inc.proc.pid

    def _submit(self, handle, inc: _Process, info, args, deadline, key, fut) -> None:
        conn = handle._conn
        if conn is None or conn.closed or conn.inc is not inc:
            with handle._conn_lock:
                conn = handle._conn
                if conn is None or conn.closed or conn.inc is not inc:
                    if conn is not None:
                        conn.close()
                    try:
                        conn = ClientConnection(
                            inc.address,
                            self._secret,
                            name=inc.actor.name,
                            max_frame_bytes=self.max_frame_bytes,
                        )
                    except (OSError, AuthenticationError) as e:
                        fut._set_error(ConnectionLost(inc.actor.name, f"cannot connect: {e}"))
                        return
                    conn.inc = inc
                    inc.conns.add(conn)
                    handle._conn = conn
        wall = 0.0 if deadline is None else time.time() + (deadline - time.monotonic())
        header, payload = encode_call(info.name, args.encoded(), wall, key, fut._timeout)
        rid = header[1]
        fut._on_expire = lambda: conn.forget(rid)
        conn.request(header, payload, fut)

    def _close_backend(self) -> None:
        self._controller.close()
        self._cleanup()


def _kill(proc: subprocess.Popen, wait: bool = True) -> None:
    if proc.poll() is None:  # never signal a reaped pid: it may belong to someone else now
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if wait:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
