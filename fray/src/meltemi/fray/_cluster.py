"""`Cluster`: the API every backend shares.

A backend (in-process threads, local processes, Ray) only knows how to start, stop, ping and
call one incarnation of an actor: it subclasses `Cluster` and implements the hooks below. Names,
epochs, restarts and heartbeats are the `Supervisor`'s (`_supervisor.py`); handles reach the
cluster only through the `Caller` interface (`_handle.py`): `_call` and `_address`.
"""

from __future__ import annotations

import abc
import difflib
import itertools
import os
import time
from collections.abc import Callable
from typing import Any

from meltemi.fray._config import Resources, RestartPolicy, check_timeout
from meltemi.fray._errors import FrayError
from meltemi.fray._future import Future
from meltemi.fray._handle import DEFAULT, ActorGroup, ActorHandle, ActorInfo
from meltemi.fray._methods import MethodInfo
from meltemi.fray._records import ActorRecord, CallArgs, DeathInfo, Gang
from meltemi.fray._supervisor import Supervisor

__all__ = ["Cluster", "DeathInfo"]


def _check_concurrency(value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"max_concurrency={value!r}: must be an int >= 1 (1 runs calls one at a time, in order)"
        )


class Cluster(abc.ABC):
    """A set of actors with one API over every backend.

    Use as a context manager (or call `shutdown()`): leaving it stops every actor.

    Args:
        call_timeout: default deadline of every call, in seconds (None or inf: no deadline).
        heartbeat_interval_s: how often the supervisor pings each actor.
        heartbeat_timeout_s: an actor that has not answered a ping for this long is hung: it
            is killed and handled as a failure.
    """

    backend: str = "abstract"

    def __init__(
        self,
        *,
        call_timeout: float | None = 60.0,
        heartbeat_interval_s: float = 1.0,
        heartbeat_timeout_s: float = 30.0,
    ):
        owner = type(self).__name__
        self.call_timeout = check_timeout(f"{owner}(call_timeout", call_timeout)
        for field, value in (
            ("heartbeat_interval_s", heartbeat_interval_s),
            ("heartbeat_timeout_s", heartbeat_timeout_s),
        ):
            if check_timeout(f"{owner}({field}", value) is None:
                raise ValueError(f"{owner}({field}={value!r}): must be a finite number of seconds")
        self._counter = itertools.count()
        self._sup = Supervisor(self, float(heartbeat_interval_s), float(heartbeat_timeout_s))

    # -- public API ------------------------------------------------------------------------
    def spawn(
        self,
        cls: type,
        *args,
        name: str | None = None,
        resources: Resources | None = None,
        restart: RestartPolicy | None = None,
        max_concurrency: int = 1,
        **kwargs,
    ) -> ActorHandle:
        """Starts one actor, `cls(*args, **kwargs)`, and returns a handle once it is ready.

        Args:
            cls: the actor's class; its public methods become remote methods.
            *args: constructor arguments (keyword ones go in **kwargs).
            name: unique name among live actors (default: class name and a counter); see
                `get`. The name of a killed actor, or of one whose restart budget is spent,
                may be taken again.
            resources: what it reserves (default: nothing).
            restart: its restart policy (default: never restart).
            max_concurrency: calls it runs at once (1 keeps calls strictly ordered).

        Raises:
            ActorDied: its constructor raised or its process could not start.
            ValueError: the name is taken or an option is invalid.
        """
        name = self._new_name(cls, name)
        _check_concurrency(max_concurrency)
        gang = Gang(name, restart or RestartPolicy(), is_group=False)
        resources = self._check(resources)
        actor = ActorRecord(name, cls, args, kwargs, gang, 0, resources, max_concurrency)
        gang.members.append(actor)
        self._sup.start([actor])
        return ActorHandle(self, actor, 0)

    def spawn_group(
        self,
        cls: type,
        n: int,
        *args,
        name: str | None = None,
        resources: Resources | None = None,
        restart: RestartPolicy | None = None,
        max_concurrency: int = 1,
        gang: bool = True,
        **kwargs,
    ) -> ActorGroup:
        """Starts `n` actors `cls(*args, **kwargs)` named `"<name>/<rank>"` at once.

        Each member sees its rank in `actor_context().rank`. With `gang=True` the group lives
        and dies as one: when a member dies, the others are stopped and all restart together
        under one `restart` budget; callers of every member are told (`ActorDied` for the
        member that died, `ActorRestarted` for the others). With `gang=False` each member
        restarts alone under its own copy of the policy.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"spawn_group(n={n!r}): n must be an int >= 1")
        group = self._new_name(cls, name)
        _check_concurrency(max_concurrency)
        policy = restart or RestartPolicy()
        resources = self._check(resources, n)
        shared = Gang(group, policy, is_group=True)
        members = []
        for rank in range(n):
            g = shared if gang else Gang(f"{group}/{rank}", policy, is_group=True)
            m = ActorRecord(f"{group}/{rank}", cls, args, kwargs, g, rank, resources,
                            max_concurrency)  # fmt: skip
            m.group, m.group_size = group, n
            g.members.append(m)
            members.append(m)
        self._sup.start(members, group=group)
        return ActorGroup(group, [ActorHandle(self, m, 0) for m in members])

    def get(self, name: str) -> ActorHandle | ActorGroup:
        """A new handle to the actor (or group) called `name`."""
        sup = self._sup
        with sup.cond:
            if name in sup.groups:
                members = sup.groups[name]
                return ActorGroup(name, [ActorHandle(self, m, m.epoch) for m in members])
            actor = sup.actors.get(name)
            if actor is None:
                close = difflib.get_close_matches(name, list(sup.actors) + list(sup.groups))
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise KeyError(f"no actor or group named {name!r} in this cluster{hint}")
            return ActorHandle(self, actor, actor.epoch)

    def kill(self, target: ActorHandle | ActorGroup | str) -> None:
        """Stops an actor for good (with its whole gang); its callers get `ActorDied`.

        Its name is free again at once (a new `spawn` may take it) and `actors()` no longer
        lists it; handles to it keep raising `ActorDied`.
        """
        if isinstance(target, str):
            target = self.get(target)
        handles = list(target) if isinstance(target, ActorGroup) else [target]
        gangs = {id(h._actor.gang): h._actor.gang for h in handles}
        self._sup.kill(list(gangs.values()))

    def actors(self) -> list[ActorInfo]:
        """One `ActorInfo` per actor: state, restarts, calls and latency percentiles."""
        with self._sup.cond:
            rows = []
            for a in self._sup.actors.values():
                s = a.stats
                rows.append(
                    ActorInfo(
                        name=a.name,
                        cls=a.cls.__name__,
                        state=a.state,
                        epoch=a.epoch,
                        failures=a.gang.failures,
                        preemptions=a.gang.preemptions,
                        pid=self._pid(a),
                        address=self._address(a),
                        calls=int(s.get("calls", 0)),
                        errors=int(s.get("errors", 0)),
                        p50_us=float(s.get("p50_us", 0.0)),
                        p99_us=float(s.get("p99_us", 0.0)),
                        group=a.group,
                    )
                )
            return rows

    def shutdown(self) -> None:
        """Stops every actor and the supervisor; idempotent."""
        if self._sup.close():
            self._close_backend()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    # -- backend hooks ---------------------------------------------------------------------
    @abc.abstractmethod
    def _launch(self, members: list[ActorRecord]) -> list[Any]:
        """Starts one incarnation per member (at `member.epoch`), all at once.

        Returns, per member, the incarnation object or a `DeathInfo` if it failed to start.
        """

    @abc.abstractmethod
    def _stop(self, inc: Any, *, graceful: bool) -> None:
        """Stops an incarnation (without reporting its death)."""

    def _stop_all(self, incs: list[Any]) -> None:
        for inc in incs:
            self._stop(inc, graceful=True)

    @abc.abstractmethod
    def _submit(self, handle: ActorHandle, inc: Any, info: MethodInfo, args: CallArgs,
                deadline: float | None, key, fut: Future) -> None:  # fmt: skip
        """Sends one call; completes `fut` (lost connections as ConnectionLost).

        `args` may be shared by several calls (a group call, retries): encode it with
        `args.encoded()` (pickled once) rather than pickling `args.args` again.
        """

    def _ping(self, inc: Any) -> Future | None:
        return None

    def _abandon(self, inc: Any) -> None:
        """Fails the calls still waiting on an incarnation whose death is recorded."""
        return None

    def _poll(self, inc: Any) -> DeathInfo | Callable[[], DeathInfo] | None:
        """How the incarnation ended, if the backend can tell it has (checked per heartbeat)."""
        return None

    def _address(self, actor: ActorRecord) -> tuple[str, int] | None:
        return None

    def _pid(self, actor: ActorRecord) -> int | None:
        return None

    def _close_backend(self) -> None:
        """Releases what the backend holds beyond its actors (files, servers)."""
        return None

    def _check_resources(self, resources: Resources, n: int) -> None:
        """Raises ValueError if `n` actors reserving `resources` cannot be placed."""
        return None

    # -- reporting (any thread) ------------------------------------------------------------
    def _report_death(self, actor: ActorRecord, epoch: int, info: DeathInfo | Callable) -> None:
        """Called by a backend when incarnation `epoch` of `actor` ended."""
        self._sup.report_death(actor, epoch, info)

    def _reserved(self) -> list[ActorRecord]:
        """Actors holding their resources (for `_check_resources`, called under the lock)."""
        return self._sup.reserved()

    # -- calls -----------------------------------------------------------------------------
    def _call(self, handle, info: MethodInfo, args: CallArgs, timeout, retries) -> Future:
        timeout = self.call_timeout if timeout is DEFAULT else timeout
        key = None
        if info.idempotent:
            key = (self._client_id(), next(self._counter))
            retries = info.retries if retries is None else retries
        return self._attempt(handle, info, args, timeout, key, retries or 0)

    def _client_id(self) -> bytes:
        cid = getattr(self, "_cid", None)
        if cid is None:
            cid = self._cid = os.urandom(8)
        return cid

    def _attempt(self, handle, info, args: CallArgs, timeout, key, retries) -> Future:
        deadline = None if timeout is None else time.monotonic() + timeout
        actor = handle._actor
        fut = Future(actor.name, info.name, deadline, timeout)
        try:
            inc = self._sup.acquire(handle, info, deadline, timeout)
        except FrayError as e:
            fut._set_error(e)
            inc = None
        if key is not None and retries > 0:
            fut._retry = lambda: self._attempt(handle, info, args, timeout, key, retries - 1)
        if inc is None:
            return fut
        epoch = handle._epoch
        fut._resolver = lambda lost: self._sup.resolve_lost(handle, epoch, lost)
        self._submit(handle, inc, info, args, deadline, key, fut)
        return fut

    # -- spawning --------------------------------------------------------------------------
    def _new_name(self, cls, name) -> str:
        if not isinstance(cls, type):
            raise TypeError(f"spawn expects a class, got {cls!r}; pass the class, not an instance")
        if name is None:
            name = f"{cls.__name__}-{next(self._counter)}"
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(
                f"actor name {name!r} must be a non-empty str without '/' ('/' separates a "
                "group's name from a member's rank)"
            )
        sup = self._sup
        with sup.cond:
            if sup.closed:
                raise RuntimeError("this cluster was shut down; create a new one")
            if sup.taken(name):
                raise ValueError(
                    f"an actor or group named {name!r} already exists; pick another name or "
                    f"use cluster.get({name!r})"
                )
        return name

    def _check(self, resources, n: int = 1):
        resources = resources or Resources()
        if not isinstance(resources, Resources):
            raise TypeError(f"resources must be a fray.Resources, got {resources!r}")
        with self._sup.cond:
            self._check_resources(resources, n)
        return resources
