"""`InProcessCluster`: every actor is a few threads of the calling process (for unit tests)."""

from __future__ import annotations

import queue
import threading
import time
import traceback

from meltemi.fray._cluster import Cluster
from meltemi.fray._context import ActorContext, set_context
from meltemi.fray._errors import CallTimeout, ConnectionLost
from meltemi.fray._future import Future
from meltemi.fray._methods import Dispatcher, error_info, remote_error
from meltemi.fray._records import ActorRecord, DeathInfo
from meltemi.fray._wire import dumps, loads

__all__ = ["InProcessCluster"]


class _ThreadActor:
    """One incarnation: an instance and its executor threads."""

    def __init__(self, cluster: InProcessCluster, actor: ActorRecord):
        self.init_args = (actor.args, actor.kwargs)
        if cluster.serialize:  # in the caller: an argument that cannot travel fails the spawn
            self.init_args = _copy(self.init_args)
        self.cluster = cluster
        self.actor = actor
        self.epoch = actor.epoch
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.dead = False
        self.running: set[Future] = set()
        self.lock = threading.Lock()
        self.dispatcher: Dispatcher | None = None
        self.ready = threading.Event()
        self.failure: DeathInfo | None = None
        self.context = ActorContext(
            name=actor.name,
            rank=actor.rank,
            group_size=actor.group_size,
            group=actor.group,
            epoch=actor.epoch,
            backend="inprocess",
        )
        self.threads = [
            threading.Thread(
                target=self._work,
                args=(i,),
                name=f"fray-actor-{actor.name}-{i}",
                daemon=True,
            )
            for i in range(actor.max_concurrency)
        ]
        for t in self.threads:
            t.start()

    def _construct(self) -> None:
        a = self.actor
        try:
            args, kwargs = self.init_args
            instance = a.cls(*args, **kwargs)
            self.dispatcher = Dispatcher(instance, a.name)
        except BaseException as e:
            lines = traceback.format_exc().rstrip().splitlines()
            self.failure = DeathInfo(f"its constructor raised {type(e).__name__}: {e}", 1, None,
                                     tuple(lines[-20:]))  # fmt: skip
            self.dead = True
        self.ready.set()

    def _work(self, index: int) -> None:
        set_context(self.context)
        if index == 0:
            self._construct()
        else:
            self.ready.wait()
        while not self.dead:
            item = self.queue.get()
            if item is None or self.dead:
                if item is not None:
                    item[5]._set_error(ConnectionLost(self.actor.name, "actor stopped"))
                break
            self._run(*item)
        self._drain()

    def _run(self, method, args, kwargs, deadline, key, fut, timeout, started) -> None:
        name = self.actor.name
        if deadline is not None and time.monotonic() > deadline:
            fut._set_error(
                CallTimeout(name, method, timeout, "its deadline passed before it started")
            )
            return
        d = self.dispatcher
        if key is not None and not d.dedup_begin(key, lambda reply: _deliver(fut, *reply)):
            return
        with self.lock:
            self.running.add(fut)
        try:
            ok, value = d.invoke(method, args, kwargs)
        except SystemExit as e:
            self._die(e.code)
            return
        finally:
            with self.lock:
                self.running.discard(fut)
        if ok and self.cluster.serialize:
            try:
                value = _copy(value)
            except Exception as e:
                ok, value = False, error_info(e)
        if not ok:
            value = remote_error(name, method, value)
        d.record(ok, started)
        if key is not None:
            d.dedup_finish(key, (ok, value))
        else:
            _deliver(fut, ok, value)

    def _die(self, code) -> None:
        if code is None:
            status = 0
        elif isinstance(code, int):
            status = code
        else:
            status = 1
        self.stop()
        self.cluster._report_death(self.actor, self.epoch, DeathInfo("exited", exit_code=status))

    def stop(self) -> None:
        self.dead = True
        for _ in self.threads:
            self.queue.put(None)
        with self.lock:
            running, self.running = self.running, set()
        for fut in running:
            fut._set_error(ConnectionLost(self.actor.name, "actor stopped"))
        self._drain()

    def _drain(self) -> None:
        while True:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item[5]._set_error(ConnectionLost(self.actor.name, "actor stopped"))


def _copy(obj):
    """A copy made by pickling, as between processes (out-of-band buffers copied too)."""
    return _unpickle_copy(dumps(obj))


def _unpickle_copy(parts: list):
    return loads([parts[0], *(bytearray(b) for b in parts[1:])])


def _deliver(fut: Future, ok: bool, value) -> None:
    if ok:
        fut._set_value(value)
    else:
        fut._set_error(value)


class InProcessCluster(Cluster):
    """Actors as threads of this process: fast to start, for unit tests and notebooks.

    With `serialize=True` (the default) arguments and results are pickled on the way, as they
    would be between processes, so a test catches values that cannot travel. `sys.exit(code)`
    inside a method ends the actor with that exit code (and restart policies apply); hung
    actors are not detected (threads cannot be killed).

    Example:
        >>> class Counter:
        ...     def __init__(self):
        ...         self.n = 0
        ...     def add(self, k):
        ...         self.n += k
        ...         return self.n
        >>> with InProcessCluster() as cluster:
        ...     counter = cluster.spawn(Counter, name="counter")
        ...     counter.add(2), counter.add.remote(3).result()
        (2, 5)
    """

    backend = "inprocess"

    def __init__(
        self,
        *,
        serialize: bool = True,
        call_timeout: float | None = 60.0,
        heartbeat_interval_s: float = 1.0,
    ):
        self.serialize = serialize
        super().__init__(call_timeout=call_timeout, heartbeat_interval_s=heartbeat_interval_s)

    def _launch(self, members: list[ActorRecord]) -> list:
        incs = [_ThreadActor(self, m) for m in members]
        results = []
        for inc in incs:
            inc.ready.wait()
            results.append(inc.failure or inc)
        return results

    def _stop(self, inc: _ThreadActor, *, graceful: bool) -> None:
        inc.stop()

    def _ping(self, inc: _ThreadActor) -> Future:
        fut = Future(inc.actor.name, "ping", deadline=None)
        fut._set_value(inc.dispatcher.stats.snapshot())
        return fut

    def _submit(self, handle, inc, info, call_args, deadline, key, fut) -> None:
        args, kwargs = call_args.args, call_args.kwargs
        if self.serialize and call_args:  # pickled once per CallArgs, unpickled per call
            args, kwargs = _unpickle_copy(call_args.encoded())
        if inc.dead:
            fut._set_error(ConnectionLost(inc.actor.name, "actor stopped"))
            return
        inc.queue.put(
            (info.name, args, kwargs, deadline, key, fut, fut._timeout, time.perf_counter())
        )
        if inc.dead:
            inc._drain()
