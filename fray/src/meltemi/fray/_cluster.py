"""`Cluster`: the API every backend shares, and the supervisor that restarts actors.

A backend (in-process threads, local processes, Ray) only knows how to start, stop, ping and
call one incarnation of an actor. Everything else lives here: names, epochs, restart policies
and their budgets, gang restarts, heartbeats, and what each caller is told when an actor dies.

Every actor belongs to a *gang*: a lone actor is a gang of one; `spawn_group(..., gang=True)`
makes one gang of n members that die and restart together and share a restart budget.
"""

from __future__ import annotations

import abc
import collections
import copy
import dataclasses
import difflib
import itertools
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from meltemi.fray._config import Resources, RestartPolicy
from meltemi.fray._errors import (
    ActorDied,
    ActorRestarted,
    CallTimeout,
    ConnectionLost,
    FrayError,
)
from meltemi.fray._future import Future
from meltemi.fray._handle import DEFAULT, ActorGroup, ActorHandle, ActorInfo
from meltemi.fray._methods import MethodInfo, method_table

__all__ = ["Cluster", "DeathInfo"]

STARTING, ALIVE, RESTARTING, DEAD, STOPPED = "starting", "alive", "restarting", "dead", "stopped"


@dataclasses.dataclass
class DeathInfo:
    """How an incarnation ended, as a backend saw it."""

    reason: str
    exit_code: int | None = None
    signal: int | None = None
    log_tail: tuple[str, ...] = ()
    preempted: bool | None = None  # None: classify with the restart policy


class _Gang:
    def __init__(self, name: str, policy: RestartPolicy, is_group: bool):
        self.name = name
        self.policy = policy
        self.is_group = is_group
        self.members: list[_Actor] = []
        self.failures = 0
        self.preemptions = 0
        self.restart_at: float | None = None


class _Actor:
    """The supervisor's record of one actor across its incarnations."""

    def __init__(self, name, cls, args, kwargs, gang, rank, resources, max_concurrency):
        self.name: str = name
        self.cls: type = cls
        self.args: tuple = args
        self.kwargs: dict = kwargs
        self.gang: _Gang = gang
        self.rank: int = rank
        self.resources: Resources = resources
        self.max_concurrency: int = max_concurrency
        self.methods: dict[str, MethodInfo] = method_table(cls)
        self.epoch = 0
        self.state = STARTING
        self.inc: Any = None  # the backend's incarnation object
        self.outcomes: dict[int, FrayError] = {}
        self.final: ActorDied | None = None
        self.hung: str | None = None
        self.stats: dict = {}
        self.ping: tuple[Future, float] | None = None
        self.blob: Any = None  # backend cache (e.g. the pickled class and arguments)
        self.group: str | None = None
        self.group_size = 1


def _check_concurrency(value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"max_concurrency={value!r}: must be an int >= 1 (1 runs calls one at a time, in order)"
        )


class Cluster(abc.ABC):
    """A set of actors with one API over every backend.

    Use as a context manager (or call `shutdown()`): leaving it stops every actor.

    Args:
        call_timeout: default deadline of every call, in seconds (None: no deadline).
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
        for field, value in (
            ("call_timeout", 1.0 if call_timeout is None else call_timeout),
            ("heartbeat_interval_s", heartbeat_interval_s),
            ("heartbeat_timeout_s", heartbeat_timeout_s),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(
                    f"{type(self).__name__}({field}={value!r}): must be a positive number "
                    "of seconds"
                )
        self.call_timeout = None if call_timeout is None else float(call_timeout)
        self._hb_interval = float(heartbeat_interval_s)
        self._hb_timeout = float(heartbeat_timeout_s)
        self._cond = threading.Condition()
        self._actors: dict[str, _Actor] = {}
        self._groups: dict[str, list[_Actor]] = {}
        self._events: collections.deque = collections.deque()
        self._counter = itertools.count()
        self._closed = False
        self._supervisor = threading.Thread(
            target=self._supervise, name=f"fray-supervisor-{self.backend}", daemon=True
        )
        self._supervisor.start()

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
            name: unique name (default: class name and a counter); see `get`.
            resources: what it reserves (default: nothing).
            restart: its restart policy (default: never restart).
            max_concurrency: calls it runs at once (1 keeps calls strictly ordered).

        Raises:
            ActorDied: its constructor raised or its process could not start.
            ValueError: the name is taken or an option is invalid.
        """
        name = self._new_name(cls, name)
        _check_concurrency(max_concurrency)
        gang = _Gang(name, restart or RestartPolicy(), is_group=False)
        actor = _Actor(name, cls, args, kwargs, gang, 0, self._check(resources), max_concurrency)
        gang.members.append(actor)
        self._start_new([actor])
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
        shared = _Gang(group, policy, is_group=True)
        members = []
        for rank in range(n):
            g = shared if gang else _Gang(f"{group}/{rank}", policy, is_group=True)
            m = _Actor(f"{group}/{rank}", cls, args, kwargs, g, rank, resources, max_concurrency)
            m.group, m.group_size = group, n
            g.members.append(m)
            members.append(m)
        self._start_new(members, group=group)
        return ActorGroup(group, [ActorHandle(self, m, 0) for m in members])

    def get(self, name: str) -> ActorHandle | ActorGroup:
        """A new handle to the actor (or group) called `name`."""
        with self._cond:
            if name in self._groups:
                members = self._groups[name]
                return ActorGroup(name, [ActorHandle(self, m, m.epoch) for m in members])
            actor = self._actors.get(name)
            if actor is None:
                close = difflib.get_close_matches(name, list(self._actors) + list(self._groups))
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise KeyError(f"no actor or group named {name!r} in this cluster{hint}")
            return ActorHandle(self, actor, actor.epoch)

    def kill(self, target: ActorHandle | ActorGroup | str) -> None:
        """Stops an actor for good (with its whole gang); its callers get `ActorDied`."""
        if isinstance(target, str):
            target = self.get(target)
        handles = list(target) if isinstance(target, ActorGroup) else [target]
        to_stop = []
        with self._cond:
            for gang in {id(h._actor.gang): h._actor.gang for h in handles}.values():
                for m in gang.members:
                    if m.state in (DEAD, STOPPED):
                        continue
                    died = ActorDied(m.name, "killed by cluster.kill()", epoch=m.epoch)
                    m.outcomes.setdefault(m.epoch, died)
                    m.final, m.state = died, STOPPED
                    if m.inc is not None:
                        to_stop.append(m.inc)
                        m.inc = None
                gang.restart_at = None
            self._cond.notify_all()
        for inc in to_stop:
            self._stop(inc, graceful=False)

    def actors(self) -> list[ActorInfo]:
        """One `ActorInfo` per actor: state, restarts, calls and latency percentiles."""
        with self._cond:
            rows = []
            for a in self._actors.values():
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
        with self._cond:
            if self._closed:
                return
            self._closed = True
            incs = []
            for a in self._actors.values():
                if a.state in (DEAD, STOPPED):
                    continue
                died = ActorDied(a.name, "the cluster was shut down", epoch=a.epoch)
                a.outcomes.setdefault(a.epoch, died)
                a.final, a.state = died, STOPPED
                if a.inc is not None:
                    incs.append(a.inc)
                    a.inc = None
            self._cond.notify_all()
        self._stop_all(incs)
        self._supervisor.join(timeout=5)
        self._close_backend()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    # -- backend hooks ---------------------------------------------------------------------
    @abc.abstractmethod
    def _launch(self, members: list[_Actor]) -> list[Any]:
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
    def _submit(self, handle: ActorHandle, inc: Any, info: MethodInfo, args, kwargs,
                deadline: float, key, fut: Future) -> None:  # fmt: skip
        """Sends one call; completes `fut` (lost connections as ConnectionLost)."""

    def _ping(self, inc: Any) -> Future | None:
        return None

    def _abandon(self, inc: Any) -> None:
        """Fails the calls still waiting on an incarnation whose death is recorded."""
        return None

    def _poll(self, inc: Any) -> DeathInfo | Callable[[], DeathInfo] | None:
        """How the incarnation ended, if the backend can tell it has (checked per heartbeat)."""
        return None

    def _address(self, actor: _Actor) -> tuple[str, int] | None:
        return None

    def _pid(self, actor: _Actor) -> int | None:
        return None

    def _close_backend(self) -> None:
        """Releases what the backend holds beyond its actors (files, servers)."""
        return None

    def _check_resources(self, resources: Resources, n: int) -> None:
        """Raises ValueError if `n` actors reserving `resources` cannot be placed."""
        return None

    # -- reporting (any thread) ------------------------------------------------------------
    def _report_death(self, actor: _Actor, epoch: int, info: DeathInfo | Callable) -> None:
        """Called by a backend when incarnation `epoch` of `actor` ended."""
        with self._cond:
            self._events.append((actor, epoch, info))
            self._cond.notify_all()

    # -- calls -----------------------------------------------------------------------------
    def _call(self, handle, info: MethodInfo, args, kwargs, timeout, retries) -> Future:
        timeout = self.call_timeout if timeout is DEFAULT else timeout
        key = None
        if info.idempotent:
            key = (self._client_id(), next(self._counter))
            retries = info.retries if retries is None else retries
        return self._attempt(handle, info, args, kwargs, timeout, key, retries or 0)

    def _client_id(self) -> bytes:
        cid = getattr(self, "_cid", None)
        if cid is None:
            cid = self._cid = os.urandom(8)
        return cid

    def _attempt(self, handle, info, args, kwargs, timeout, key, retries) -> Future:
        deadline = None if timeout is None else time.monotonic() + timeout
        actor = handle._actor
        fut = Future(actor.name, info.name, deadline, timeout)
        try:
            inc = self._acquire(handle, info, deadline, timeout)
        except FrayError as e:
            fut._set_error(e)
            inc = None
        if key is not None and retries > 0:
            fut._retry = lambda: self._attempt(
                handle, info, args, kwargs, timeout, key, retries - 1
            )
        if inc is None:
            return fut
        epoch = handle._epoch
        fut._resolver = lambda lost: self._resolve_lost(handle, actor, epoch, lost)
        self._submit(handle, inc, info, args, kwargs, deadline, key, fut)
        return fut

    def _acquire(self, handle, info, deadline, timeout):
        actor = handle._actor
        inc = actor.inc
        if inc is not None and actor.state == ALIVE and handle._epoch == actor.epoch:
            return inc
        with self._cond:
            while True:
                state = actor.state
                if state in (DEAD, STOPPED):
                    raise copy.copy(actor.final)
                if handle._epoch < actor.epoch or (
                    handle._epoch == actor.epoch and state == RESTARTING
                ):
                    old = handle._epoch
                    handle._epoch = actor.epoch + (state == RESTARTING)
                    if not info.idempotent:
                        cause = actor.outcomes.get(old)
                        why = str(cause).splitlines()[0] if cause else ""
                        raise ActorRestarted(actor.name, old, handle._epoch, why)
                    continue
                if state == ALIVE:
                    return actor.inc
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise CallTimeout(actor.name, info.name, timeout, f"the actor was {state}")
                self._cond.wait(left)

    def _resolve_lost(self, handle, actor, epoch, lost: ConnectionLost) -> FrayError:
        with self._cond:
            if not self._cond.wait_for(lambda: epoch in actor.outcomes, timeout=10.0):
                return lost
            out = actor.outcomes[epoch]
            if handle._epoch == epoch:
                handle._epoch = epoch + 1
            return copy.copy(out)

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
        with self._cond:
            if self._closed:
                raise RuntimeError("this cluster was shut down; create a new one")
            if name in self._actors or name in self._groups:
                raise ValueError(
                    f"an actor or group named {name!r} already exists; pick another name or "
                    f"use cluster.get({name!r})"
                )
        return name

    def _check(self, resources, n: int = 1):
        resources = resources or Resources()
        if not isinstance(resources, Resources):
            raise TypeError(f"resources must be a fray.Resources, got {resources!r}")
        with self._cond:
            self._check_resources(resources, n)
        return resources

    def _reserved(self) -> list[_Actor]:
        return [a for a in self._actors.values() if a.state not in (DEAD, STOPPED)]

    def _start_new(self, members: list[_Actor], group: str | None = None) -> None:
        with self._cond:
            taken = [n for n in [m.name for m in members] + [group] if n in self._actors]
            if taken or group in self._groups:
                raise ValueError(f"an actor or group named {(taken or [group])[0]!r} exists")
            for m in members:
                self._actors[m.name] = m
            if group is not None:
                self._groups[group] = members
        try:
            results = self._launch(members)
        except BaseException:
            self._forget(members, group)
            raise
        failed = [(m, r) for m, r in zip(members, results) if isinstance(r, DeathInfo)]
        if failed:
            for r in results:
                if not isinstance(r, DeathInfo):
                    self._stop(r, graceful=False)
            self._forget(members, group)
            m, info = failed[0]
            raise ActorDied(
                m.name,
                f"it failed to start: {info.reason}",
                exit_code=info.exit_code,
                signal=info.signal,
                log_tail=info.log_tail,
            )
        with self._cond:
            for m, inc in zip(members, results):
                m.inc, m.state = inc, ALIVE
            self._cond.notify_all()

    def _forget(self, members: list[_Actor], group: str | None) -> None:
        with self._cond:
            for m in members:
                self._actors.pop(m.name, None)
            if group is not None:
                self._groups.pop(group, None)

    # -- supervision -----------------------------------------------------------------------
    def _supervise(self) -> None:
        next_beat = time.monotonic() + self._hb_interval
        while True:
            with self._cond:
                while not self._events and not self._closed:
                    now = time.monotonic()
                    due = [g.restart_at for g in self._gangs() if g.restart_at is not None]
                    wake = min([next_beat, *due])
                    if wake <= now:
                        break
                    self._cond.wait(wake - now)
                if self._closed:
                    return
                events = list(self._events)
                self._events.clear()
            try:
                for actor, epoch, info in events:
                    if callable(info):
                        info = info()
                    self._on_death(actor, epoch, info)
                now = time.monotonic()
                for gang in self._gangs():
                    if gang.restart_at is not None and gang.restart_at <= now:
                        self._restart(gang)
                if time.monotonic() >= next_beat:
                    self._heartbeat()
                    next_beat = time.monotonic() + self._hb_interval
            except Exception:  # keep supervising the other actors
                traceback.print_exc()
                print("fray: supervisor step failed (above); continuing", file=sys.stderr)

    def _gangs(self) -> list[_Gang]:
        with self._cond:
            return list({id(a.gang): a.gang for a in self._actors.values()}.values())

    def _on_death(self, actor: _Actor, epoch: int, info: DeathInfo) -> None:
        to_stop, abandoned = [], []
        with self._cond:
            if epoch != actor.epoch or actor.state not in (ALIVE, STARTING) or self._closed:
                return
            gang, policy = actor.gang, actor.gang.policy
            if actor.hung:
                info = dataclasses.replace(info, reason=actor.hung, preempted=False)
                actor.hung = None
            preempted = info.preempted
            if preempted is None:
                preempted = policy.is_preemption(info.exit_code, info.signal)
            if preempted:
                will_restart = gang.preemptions < policy.max_preemptions
                gang.preemptions += will_restart
                delay = policy.backoff(gang.preemptions) if will_restart else 0.0
            else:
                will_restart = gang.failures < policy.max_failures
                gang.failures += will_restart
                delay = policy.backoff(gang.failures) if will_restart else 0.0
            died = ActorDied(
                actor.name,
                info.reason + (" (a preemption)" if preempted else ""),
                epoch=epoch,
                exit_code=info.exit_code,
                signal=info.signal,
                log_tail=info.log_tail,
                will_restart=will_restart,
            )
            for m in gang.members:
                if m.state not in (ALIVE, STARTING):
                    continue
                if m is actor:
                    m.outcomes[m.epoch] = died
                elif will_restart:
                    m.outcomes[m.epoch] = ActorRestarted(
                        m.name, m.epoch, m.epoch + 1, f"gang restart: {actor.name} died"
                    )
                else:
                    m.outcomes[m.epoch] = ActorDied(
                        m.name,
                        f"stopped because group member {actor.name!r} died and the group's "
                        "restart budget is spent",
                        epoch=m.epoch,
                    )
                if m.inc is not None:
                    (to_stop if m is not actor else abandoned).append(m.inc)
                m.inc = None
                m.state = RESTARTING if will_restart else DEAD
                if not will_restart:
                    m.final = m.outcomes[m.epoch]
            gang.restart_at = time.monotonic() + delay if will_restart else None
            self._cond.notify_all()
        for inc in abandoned:
            self._abandon(inc)
        for inc in to_stop:
            self._stop(inc, graceful=False)

    def _restart(self, gang: _Gang) -> None:
        with self._cond:
            gang.restart_at = None
            members = [m for m in gang.members if m.state == RESTARTING]
            if len(members) != len(gang.members) or self._closed:
                return
            for m in members:
                m.epoch += 1
                m.state = STARTING
        try:
            results = self._launch(members)
        except Exception as e:  # never let a backend error end the supervisor
            results = [DeathInfo(f"it could not be restarted: {type(e).__name__}: {e}")] * len(
                members
            )
        failed, orphans = None, []
        with self._cond:
            for m, r in zip(members, results):
                if isinstance(r, DeathInfo):
                    failed = failed or (m, r)
                elif m.state == STARTING:
                    m.inc, m.state = r, ALIVE
                    m.ping, m.stats = None, {}
                else:  # stopped (kill/shutdown) while starting
                    orphans.append(r)
            self._cond.notify_all()
        for inc in orphans:
            self._stop(inc, graceful=False)
        if failed is not None:
            m, info = failed
            self._on_death(m, m.epoch, info)

    def _heartbeat(self) -> None:
        now = time.monotonic()
        with self._cond:
            alive = [a for a in self._actors.values() if a.state == ALIVE]
        for a in alive:
            inc, ping = a.inc, a.ping
            if inc is None:
                continue
            death = self._poll(inc)
            if death is not None:
                self._report_death(a, a.epoch, death)
                continue
            if ping is not None and not ping[0].done():
                if now - ping[1] > self._hb_timeout and a.hung is None:
                    a.hung = f"hung: no heartbeat reply for {now - ping[1]:.1f} s"
                    self._stop(inc, graceful=False)
                    self._report_death(a, a.epoch, DeathInfo(a.hung, signal=9, preempted=False))
                continue
            fut = self._ping(inc)
            a.ping = None if fut is None else (fut, now)
            if fut is not None:
                fut.add_done_callback(lambda f, a=a: _take_stats(a, f))


def _take_stats(actor: _Actor, ping: Future) -> None:
    try:
        actor.stats = ping.result(0)
    except Exception:
        pass  # a failed ping says nothing about call statistics
