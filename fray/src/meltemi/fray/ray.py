"""`RayCluster`: the fray API on Ray (`pip install meltemi-fray[ray]`).

Each actor is a Ray actor wrapping the user's class in a small shim that runs calls through
fray's dispatcher, so errors, deadlines, request-id deduplication, `actor_context()` and
`sys.exit(code)` behave as on the other backends. Restart policies, gangs and heartbeats are
fray's (Ray's own `max_restarts` is off): the supervisor is the same code as LocalCluster's.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from typing import Any

import cloudpickle
import ray
import ray.exceptions

from meltemi.fray._cluster import Cluster, DeathInfo, _Actor
from meltemi.fray._config import Resources
from meltemi.fray._context import ActorContext, set_context
from meltemi.fray._errors import CallTimeout, ConnectionLost
from meltemi.fray._future import Future
from meltemi.fray._methods import Dispatcher, error_info, remote_error

__all__ = ["RayCluster"]


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

    def ping(self) -> dict:
        if self._error is not None:
            return {"error": self._error[0], "traceback": self._error[1]}
        return self._dispatcher.stats.snapshot()

    def call(self, method: str, args, kwargs, key, deadline_wall: float | None, timeout):
        d = self._dispatcher
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


_RemoteShim = ray.remote(_Shim)


class _RayIncarnation:
    def __init__(self, actor: _Actor, epoch: int, handle):
        self.actor = actor
        self.epoch = epoch
        self.handle = handle


def _death_from(error: BaseException) -> DeathInfo:
    text = str(error).strip().splitlines()
    preempted = bool(getattr(error, "preempted", False)) or None
    return DeathInfo(f"the Ray actor died: {text[0] if text else type(error).__name__}",
                     log_tail=tuple(text[1:21]), preempted=preempted)  # fmt: skip


class RayCluster(Cluster):
    """Actors as Ray actors, with fray's API, errors and supervision.

    Connects to the running Ray instance if `ray.init` was already called; otherwise starts
    one with `ray.init(address=address, **init_kwargs)` and stops it at `shutdown()`.

    Args:
        address: Ray address to connect to (None: start a local Ray).
        call_timeout: default deadline of every call, in seconds (None: no deadline).
        heartbeat_interval_s: how often each actor is pinged.
        heartbeat_timeout_s: an actor silent this long is killed as hung.
        start_timeout_s: how long an actor may take to be scheduled and constructed.
        **init_kwargs: passed to `ray.init` when this cluster starts Ray.
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
        if self._owns_ray:
            init_kwargs.setdefault("include_dashboard", False)
            init_kwargs.setdefault("log_to_driver", False)
            ray.init(address=address, **init_kwargs)
        self.start_timeout_s = float(start_timeout_s)
        super().__init__(
            call_timeout=call_timeout,
            heartbeat_interval_s=heartbeat_interval_s,
            heartbeat_timeout_s=heartbeat_timeout_s,
        )

    def _check_resources(self, resources: Resources, n: int) -> None:
        return None  # Ray schedules by reservation itself

    def _options(self, m: _Actor) -> dict[str, Any]:
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

    def _launch(self, members: list[_Actor]) -> list:
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

    def _submit(self, handle, inc: _RayIncarnation, info, args, kwargs, deadline, key, fut):
        wall = None if deadline is None else time.time() + (deadline - time.monotonic())
        ref = inc.handle.call.remote(info.name, args, kwargs, key, wall, fut._timeout)
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


def _cancel(ref) -> None:
    try:
        ray.cancel(ref)
    except Exception:
        pass  # best effort: the actor also drops calls whose deadline passed
