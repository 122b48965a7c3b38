"""`RayCluster`: the fray API on Ray (`pip install meltemi-fray[ray]`).

Each actor is a Ray actor wrapping the user's class in a small shim that runs calls through
fray's dispatcher, so errors, deadlines, request-id deduplication, `actor_context()` and
`sys.exit(code)` behave as on the other backends. Restart policies, gangs and heartbeats are
fray's (Ray's own `max_restarts` is off): the supervisor is the same code as LocalCluster's.

Where Ray keeps its files and its token: Ray (2.60 and later) turns token authentication on for
the clusters `ray.init()` starts and, by default, writes the token to `~/.ray/auth_token`, which
fails where the home directory is read-only (CI sandboxes, some containers). When a RayCluster
starts Ray itself, it instead makes a private session directory (`$TMPDIR/ray-XXXXXXXX`, mode
0700) holding Ray's temp dir (`r/`, instead of the shared `/tmp/ray`) and a fresh token
(`auth_token`, mode 0600), handed to Ray and every process Ray starts through
`RAY_AUTH_TOKEN_PATH`; both are removed at
`shutdown()`. A token the user configured (`RAY_AUTH_TOKEN`, `RAY_AUTH_TOKEN_PATH`) or
`RAY_AUTH_MODE=disabled` is respected. When it joins a running cluster, a missing token is a
`fray.AuthenticationError` that names the setting to change.
"""

from __future__ import annotations

import inspect
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
import traceback
import warnings
import weakref
from typing import Any

import cloudpickle
import ray
import ray.exceptions

from meltemi.fray._cluster import Cluster
from meltemi.fray._config import Resources
from meltemi.fray._context import ActorContext, set_context
from meltemi.fray._errors import AuthenticationError, CallTimeout, ConnectionLost
from meltemi.fray._future import Future
from meltemi.fray._methods import Dispatcher, error_info, remote_error
from meltemi.fray._records import ActorRecord, DeathInfo

__all__ = ["RayCluster"]


# Pings run on their own thread, as on LocalCluster's I/O thread: with max_concurrency=1 a ping
# queued behind an hour-long method would make a busy actor look hung.
_PING_GROUP = "fray_ping"


class _Shim:
    """The Ray actor: holds the user's instance and runs calls on it."""

    def __init__(self, blob: bytes, spec: dict):
        for path in spec["sys_path"]:  # so the user's class imports as in the driver
            if path not in sys.path:
                sys.path.append(path)
        set_context(ActorContext(**spec["context"]), process=True)
        self._error = None
        self._dispatcher = None
        try:
            cls, args, kwargs = cloudpickle.loads(blob)
            self._dispatcher = Dispatcher(cls(*args, **kwargs), spec["context"]["name"])
        except BaseException as e:
            lines = traceback.format_exc().rstrip().splitlines()
            self._error = (f"{type(e).__name__}: {e}", lines[-20:])

    @ray.method(concurrency_group=_PING_GROUP)  # answered while a long method runs
    def ping(self) -> dict:
        if self._error is not None:
            return {"error": self._error[0], "traceback": self._error[1]}
        return self._dispatcher.stats.snapshot()

    def call(self, method: str, packed: tuple, key, deadline_wall: float | None, timeout):
        d = self._dispatcher
        args, kwargs = packed  # Ray resolved it if the driver sent an object reference
        if deadline_wall is not None and time.time() > deadline_wall:
            return ("expired", timeout)
        started = time.perf_counter()
        if key is None:
            return self._run(method, args, kwargs, started)
        box: list = []
        done = threading.Event()

        def respond(reply):
            box.append(reply)
            done.set()

        if d.dedup_begin(key, respond):
            d.dedup_finish(key, self._run(method, args, kwargs, started))
        done.wait()
        return box[0]

    def _run(self, method, args, kwargs, started):
        d = self._dispatcher
        try:
            ok, value = d.invoke(method, args, kwargs)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            # Answer first, then end the process, so the caller learns the exit code.
            threading.Timer(0.2, os._exit, (code,)).start()
            return ("exit", code)
        d.record(ok, started)
        if not ok:
            return ("err", value)
        try:
            cloudpickle.dumps(value)
        except Exception as e:
            return ("err", error_info(e))
        return ("ok", value)


_RemoteShim = ray.remote(concurrency_groups={_PING_GROUP: 1})(_Shim)


class _RayIncarnation:
    def __init__(self, actor: ActorRecord, epoch: int, handle):
        self.actor = actor
        self.epoch = epoch
        self.handle = handle


def _death_from(error: BaseException) -> DeathInfo:
    text = str(error).strip().splitlines()
    preempted = bool(getattr(error, "preempted", False)) or None
    return DeathInfo(f"the Ray actor died: {text[0] if text else type(error).__name__}",
                     log_tail=tuple(text[1:21]), preempted=preempted)  # fmt: skip


# Ray puts its Unix sockets at <temp dir>/session_<date>_<time>_<us>_<pid>/sockets/plasma_store,
# a path that must fit in 107 bytes; with Ray's temp dir at <base>/ray-XXXXXXXX/r, a $TMPDIR
# longer than this (Bazel's) is replaced by /tmp.
_MAX_TEMP_BASE = 25
_TOKEN_VARS = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
_RESTORED_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")  # set by this module or by ray.init
_RayAuthError = getattr(ray.exceptions, "AuthenticationError", ())  # Ray >= 2.60


def _session_base() -> str:
    base = tempfile.gettempdir()
    return base if len(base) <= _MAX_TEMP_BASE else "/tmp"


def _has_token(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return bool(f.read(1024).strip())
    except OSError:
        return False


def _write_token(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, secrets.token_hex(32).encode())  # what `ray get-auth-token` makes
    finally:
        os.close(fd)


# Ray has no public call to forget the token it cached: `ray._raylet.AuthenticationTokenLoader`
# (Ray 2.60, the upper bound in fray/pyproject.toml) is checked for exactly these signatures.
_LOADER = "ray._raylet.AuthenticationTokenLoader"
_LOADER_SIGNATURES = {"instance": (), "reset_cache": ("self",)}
_warned_loader = threading.Event()


def _parameter_names(fn: Any) -> tuple[str, ...] | None:
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def token_loader() -> Any:
    """Ray's private token cache, if exactly as tested; else None and one warning a process."""
    loader = getattr(getattr(ray, "_raylet", None), "AuthenticationTokenLoader", None)
    found = "missing"
    if loader is not None:
        names = {m: _parameter_names(getattr(loader, m, None)) for m in _LOADER_SIGNATURES}
        if names == _LOADER_SIGNATURES:
            return loader
        found = f"parameters {names}"
    if not _warned_loader.is_set():
        _warned_loader.set()
        warnings.warn(
            f"{_LOADER} is not as tested with Ray 2.60 ({found}): Ray keeps the token of this "
            "process's first ray.init, so a later RayCluster that starts Ray in this process "
            "may fail to authenticate; start it in a new process, or install the Ray version "
            "meltemi-fray[ray] requires",
            RuntimeWarning,
            stacklevel=3,
        )
    return None


def _reload_token() -> None:
    """Makes Ray read its token settings again: it caches the token of the first `ray.init`."""
    loader = token_loader()
    if loader is not None:
        loader.instance().reset_cache()


def _starts_ray(address: str | None) -> bool:
    """Whether `ray.init(address=address)` starts a new local Ray rather than joining one."""
    if address is None:
        return not os.environ.get("RAY_ADDRESS")
    return address == "local"


class _RaySession:
    """What a RayCluster that starts Ray owns: a private directory holding the token and Ray's
    temp dir (`r/`, which Ray makes world-writable; the 0700 parent keeps others out).

    The environment variables set here are inherited by every process `ray.init` starts (GCS,
    raylet, workers), so they all read the same token; they are restored at `close()`.
    """

    def __init__(self, init_kwargs: dict):
        path = os.environ.get("RAY_AUTH_TOKEN_PATH")
        if path and not os.environ.get("RAY_AUTH_TOKEN") and not _has_token(path):
            raise AuthenticationError(
                f"RAY_AUTH_TOKEN_PATH={path!r} names no readable, non-empty token file; write "
                "the token there, or unset RAY_AUTH_TOKEN_PATH to let RayCluster make a token "
                "for the Ray it starts"
            )
        self._saved = {k: os.environ.get(k) for k in _RESTORED_VARS}
        self.dir = tempfile.mkdtemp(prefix="ray-", dir=_session_base())  # mode 0700
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.dir, ignore_errors=True)
        self.token_path: str | None = None
        mode = os.environ.get("RAY_AUTH_MODE", "").strip().lower()
        if mode in ("", "token") and not any(os.environ.get(k) for k in _TOKEN_VARS):
            self.token_path = os.path.join(self.dir, "auth_token")
            _write_token(self.token_path)
            os.environ["RAY_AUTH_TOKEN_PATH"] = self.token_path
            _reload_token()
        init_kwargs.setdefault("_temp_dir", os.path.join(self.dir, "r"))

    def close(self) -> None:
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _reload_token()
        self._cleanup()


def _join_error(error: BaseException, address: str | None) -> BaseException:
    """The fray error for a failed `ray.init` that joined a running cluster (or `error`)."""
    where = f"RayCluster(address={address!r})"
    fix = (
        "set RAY_AUTH_TOKEN_PATH to a file holding the cluster's token (or RAY_AUTH_TOKEN to "
        "the token itself) and RAY_AUTH_MODE=token"
    )
    if isinstance(error, _RayAuthError):
        detail = getattr(error, "message", str(error))
        return AuthenticationError(
            f"{where}: Ray token authentication is on but {detail[:1].lower()}{detail[1:]}; "
            f"{fix}, or RAY_AUTH_MODE=disabled if the cluster does not use tokens"
        )
    mode = os.environ.get("RAY_AUTH_MODE", "").strip().lower()
    if isinstance(error, ConnectionError) and mode != "token":
        return AuthenticationError(
            f"{where}: could not connect to the Ray cluster ({error}) and sent no token "
            f"(RAY_AUTH_MODE={os.environ.get('RAY_AUTH_MODE', '<unset>')}); clusters started "
            f"by Ray >= 2.60 require one: {fix}; if it does not use tokens, check the address"
        )
    return error


class RayCluster(Cluster):
    """Actors as Ray actors, with fray's API, errors and supervision.

    Uses the running Ray instance if `ray.init` was already called; otherwise calls
    `ray.init(address=address, **init_kwargs)` and shuts Ray down at `shutdown()`. When that
    starts a new local Ray (`address` None and no `RAY_ADDRESS`, or `"local"`), Ray's temp dir
    and auth token live in a private directory this cluster removes at `shutdown()`; nothing
    is written to the home directory (see the module docstring).

    Args:
        address: Ray address to connect to (None: start a local Ray).
        call_timeout: default deadline of every call, in seconds (None: no deadline).
        heartbeat_interval_s: how often each actor is pinged.
        heartbeat_timeout_s: an actor silent this long is killed as hung.
        start_timeout_s: how long an actor may take to be scheduled and constructed.
        **init_kwargs: passed to `ray.init` when this cluster starts Ray.

    Raises:
        AuthenticationError: joining a cluster without its token; the message names the
            setting to change (`RAY_AUTH_TOKEN_PATH`, `RAY_AUTH_TOKEN`, `RAY_AUTH_MODE`).
    """

    backend = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        call_timeout: float | None = 60.0,
        heartbeat_interval_s: float = 1.0,
        heartbeat_timeout_s: float = 60.0,
        start_timeout_s: float = 120.0,
        **init_kwargs,
    ):
        self._owns_ray = not ray.is_initialized()
        self._session: _RaySession | None = None
        if self._owns_ray:
            init_kwargs.setdefault("include_dashboard", False)
            init_kwargs.setdefault("log_to_driver", False)
            if _starts_ray(address):
                self._session = _RaySession(init_kwargs)
            try:
                ray.init(address=address, **init_kwargs)
            except Exception as e:
                if self._session is not None:
                    self._session.close()
                    raise
                error = _join_error(e, address)
                if error is e:
                    raise
                raise error from None  # the message carries Ray's; its traceback helps no one
        self.start_timeout_s = float(start_timeout_s)
        super().__init__(
            call_timeout=call_timeout,
            heartbeat_interval_s=heartbeat_interval_s,
            heartbeat_timeout_s=heartbeat_timeout_s,
        )

    def _check_resources(self, resources: Resources, n: int) -> None:
        return None  # Ray schedules by reservation itself

    def _options(self, m: ActorRecord) -> dict[str, Any]:
        r = m.resources
        options: dict[str, Any] = {
            "num_cpus": r.cpus,
            "num_gpus": r.gpus,
            "max_concurrency": m.max_concurrency,
            "max_restarts": 0,
        }
        if r.memory_bytes is not None:
            options["memory"] = r.memory_bytes
        if r.custom:
            options["resources"] = dict(r.custom)
        return options

    def _launch(self, members: list[ActorRecord]) -> list:
        started = []
        for m in members:
            if m.blob is None:
                m.blob = cloudpickle.dumps((m.cls, m.args, m.kwargs), protocol=5)
            spec = {
                "sys_path": [p for p in sys.path if p],
                "context": {
                    "name": m.name,
                    "rank": m.rank,
                    "group_size": m.group_size,
                    "group": m.group,
                    "epoch": m.epoch,
                    "backend": "ray",
                },
            }
            handle = _RemoteShim.options(**self._options(m)).remote(m.blob, spec)
            started.append((m, handle, handle.ping.remote()))
        deadline = time.monotonic() + self.start_timeout_s
        results = []
        for m, handle, ready in started:
            try:
                status = ray.get(ready, timeout=max(0.0, deadline - time.monotonic()))
            except ray.exceptions.GetTimeoutError:
                ray.kill(handle, no_restart=True)
                why = f"it did not start within start_timeout_s={self.start_timeout_s:g}"
                results.append(DeathInfo(why))
                continue
            except ray.exceptions.RayError as e:
                results.append(_death_from(e))
                continue
            if "error" in status:
                ray.kill(handle, no_restart=True)
                results.append(
                    DeathInfo(
                        f"its constructor raised {status['error']}",
                        exit_code=1,
                        log_tail=tuple(status["traceback"]),
                    )
                )
                continue
            results.append(_RayIncarnation(m, m.epoch, handle))
        return results

    def _stop(self, inc: _RayIncarnation, *, graceful: bool) -> None:
        try:
            ray.kill(inc.handle, no_restart=True)
        except Exception:
            pass  # already gone

    def _ping(self, inc: _RayIncarnation) -> Future:
        fut = Future(inc.actor.name, "ping", deadline=None)
        ref = inc.handle.ping.remote()
        ref.future().add_done_callback(lambda f: self._on_ping(inc, fut, f))
        return fut

    def _on_ping(self, inc: _RayIncarnation, fut: Future, done) -> None:
        try:
            fut._set_value(done.result())
        except ray.exceptions.RayActorError as e:
            self._report_death(inc.actor, inc.epoch, _death_from(e))
            fut._set_error(ConnectionLost(inc.actor.name, str(e)))
        except Exception as e:
            fut._set_error(ConnectionLost(inc.actor.name, str(e)))

    def _submit(self, handle, inc: _RayIncarnation, info, args, deadline, key, fut):
        wall = None if deadline is None else time.time() + (deadline - time.monotonic())
        packed = (args.args, args.kwargs)
        if args.shared and args:  # a group call: put the arguments in Ray's store once
            if args.cache is None:
                args.cache = ray.put(packed)
            packed = args.cache
        ref = inc.handle.call.remote(info.name, packed, key, wall, fut._timeout)
        fut._on_expire = lambda: _cancel(ref)
        name, method = inc.actor.name, info.name

        def done(ref_future) -> None:
            try:
                reply = ref_future.result()
            except ray.exceptions.RayActorError as e:
                self._report_death(inc.actor, inc.epoch, _death_from(e))
                fut._set_error(ConnectionLost(name, str(e)))
                return
            except Exception as e:  # cancelled, object lost, ...
                fut._set_error(ConnectionLost(name, f"{type(e).__name__}: {e}"))
                return
            tag = reply[0]
            if tag == "ok":
                fut._set_value(reply[1])
            elif tag == "err":
                fut._set_error(remote_error(name, method, reply[1]))
            elif tag == "expired":
                fut._set_error(CallTimeout(name, method, reply[1], "its deadline passed first"))
            else:  # "exit"
                death = DeathInfo("exited", exit_code=reply[1])
                self._report_death(inc.actor, inc.epoch, death)
                fut._set_error(ConnectionLost(name, f"the actor exited with code {reply[1]}"))

        ref.future().add_done_callback(done)

    def _close_backend(self) -> None:
        if self._owns_ray:
            ray.shutdown()
        if self._session is not None:
            self._session.close()


def _cancel(ref) -> None:
    try:
        ray.cancel(ref)
    except Exception:
        pass  # best effort: the actor also drops calls whose deadline passed
