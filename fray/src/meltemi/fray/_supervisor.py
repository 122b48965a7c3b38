"""`Supervisor`: the actor registry and the thread that restarts actors.

It owns every `ActorRecord` and the one condition variable that guards them: names, epochs,
restart policies and their budgets, gang restarts, heartbeats, and what each caller is told
when an actor dies. It starts, stops and pings incarnations only through a `Backend`'s hooks,
and knows nothing of the public API (`_cluster.py`) beyond what a handle carries (its actor
record and the epoch it has seen).

Every actor belongs to a *gang*: a lone actor is a gang of one; `spawn_group(..., gang=True)`
makes one gang of n members that die and restart together and share a restart budget.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

from meltemi.fray._errors import (
    ActorDied,
    ActorRestarted,
    CallTimeout,
    ConnectionLost,
    FrayError,
)
from meltemi.fray._future import Future
from meltemi.fray._handle import ActorHandle
from meltemi.fray._methods import MethodInfo
from meltemi.fray._records import (
    ALIVE,
    DEAD,
    RESTARTING,
    STARTING,
    STOPPED,
    ActorRecord,
    DeathInfo,
    Gang,
)

__all__ = ["Backend", "Supervisor"]


class Backend(Protocol):
    """The hooks through which the supervisor acts on incarnations (see `Cluster`)."""

    backend: str

    def _launch(self, members: list[ActorRecord]) -> list[Any]: ...

    def _stop(self, inc: Any, *, graceful: bool) -> None: ...

    def _stop_all(self, incs: list[Any]) -> None: ...

    def _ping(self, inc: Any) -> Future | None: ...

    def _poll(self, inc: Any) -> DeathInfo | Callable[[], DeathInfo] | None: ...

    def _abandon(self, inc: Any) -> None: ...


class Supervisor:
    """The registry of a cluster's actors and the daemon thread that supervises them.

    Args:
        backend: the hooks that start, stop, ping and poll incarnations.
        heartbeat_interval_s: how often every alive actor is pinged.
        heartbeat_timeout_s: an actor whose ping has not been answered this long is hung.
    """

    def __init__(self, backend: Backend, heartbeat_interval_s: float, heartbeat_timeout_s: float):
        self._backend = backend
        self._hb_interval = heartbeat_interval_s
        self._hb_timeout = heartbeat_timeout_s
        self.cond = threading.Condition()
        self.actors: dict[str, ActorRecord] = {}
        self.groups: dict[str, list[ActorRecord]] = {}
        self.closed = False
        self._events: collections.deque = collections.deque()
        self._thread = threading.Thread(
            target=self._run, name=f"fray-supervisor-{backend.backend}", daemon=True
        )
        self._thread.start()

    # -- registry (any thread) -------------------------------------------------------------
    def reserved(self) -> list[ActorRecord]:
        """Actors that hold their resources (not dead or stopped); call under `cond`."""
        return [a for a in self.actors.values() if a.state not in (DEAD, STOPPED)]

    def start(self, members: list[ActorRecord], group: str | None = None) -> None:
        """Registers new actors and starts their first incarnations, all at once.

        Raises:
            ActorDied: one of them failed to start (none is kept; the names are free again).
            ValueError: a name is taken.
        """
        names = [m.name for m in members] + ([group] if group is not None else [])
        with self.cond:
            taken = [n for n in names if self.taken(n)]
            if taken:
                raise ValueError(f"an actor or group named {taken[0]!r} exists")
            for name in names:
                self._release(name)
            for m in members:
                self.actors[m.name] = m
            if group is not None:
                self.groups[group] = members
        try:
            results = self._backend._launch(members)
        except BaseException:
            self._forget(members, group)
            raise
        failed = [(m, r) for m, r in zip(members, results) if isinstance(r, DeathInfo)]
        if failed:
            for r in results:
                if not isinstance(r, DeathInfo):
                    self._backend._stop(r, graceful=False)
            self._forget(members, group)
            m, info = failed[0]
            raise ActorDied(
                m.name,
                f"it failed to start: {info.reason}",
                exit_code=info.exit_code,
                signal=info.signal,
                log_tail=info.log_tail,
            )
        with self.cond:
            for m, inc in zip(members, results):
                m.inc, m.state = inc, ALIVE
            self.cond.notify_all()

    def taken(self, name: str) -> bool:
        """Whether `name` belongs to a live actor or group (dead ones give their names up)."""
        actor = self.actors.get(name)
        if actor is not None and actor.state not in (DEAD, STOPPED):
            return True
        members = self.groups.get(name, ())
        return any(m.state not in (DEAD, STOPPED) for m in members)

    def _release(self, name: str) -> None:
        """Forgets the dead actor or group called `name` (call under `cond`)."""
        for m in [self.actors.get(name), *self.groups.pop(name, ())]:
            if m is not None and self.actors.get(m.name) is m:
                del self.actors[m.name]

    def _forget(self, members: list[ActorRecord], group: str | None) -> None:
        with self.cond:
            for m in members:
                self.actors.pop(m.name, None)
            if group is not None:
                self.groups.pop(group, None)

    def kill(self, gangs: list[Gang]) -> None:
        """Stops every member of `gangs` for good; their callers get `ActorDied`."""
        to_stop = []
        with self.cond:
            for gang in gangs:
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
                for m in gang.members:  # stopped for good: the names are free again
                    if self.actors.get(m.name) is m:
                        del self.actors[m.name]
            for name, members in list(self.groups.items()):
                if all(self.actors.get(m.name) is not m for m in members):
                    del self.groups[name]
            self.cond.notify_all()
        for inc in to_stop:
            self._backend._stop(inc, graceful=False)

    def close(self) -> bool:
        """Stops every actor and the supervisor thread; False if already closed."""
        with self.cond:
            if self.closed:
                return False
            self.closed = True
            incs = []
            for a in self.actors.values():
                if a.state in (DEAD, STOPPED):
                    continue
                died = ActorDied(a.name, "the cluster was shut down", epoch=a.epoch)
                a.outcomes.setdefault(a.epoch, died)
                a.final, a.state = died, STOPPED
                if a.inc is not None:
                    incs.append(a.inc)
                    a.inc = None
            self.cond.notify_all()
        self._backend._stop_all(incs)
        self._thread.join(timeout=5)
        return True

    def report_death(self, actor: ActorRecord, epoch: int, info: DeathInfo | Callable) -> None:
        """Called by a backend when incarnation `epoch` of `actor` ended (any thread)."""
        with self.cond:
            self._events.append((actor, epoch, info))
            self.cond.notify_all()

    # -- what callers see ------------------------------------------------------------------
    def acquire(self, handle: ActorHandle, info: MethodInfo, deadline, timeout) -> Any:
        """The incarnation a call through `handle` goes to, waiting while it (re)starts.

        Raises:
            ActorDied, ActorRestarted (once per restart the handle was not told of),
            CallTimeout.
        """
        actor = handle._actor
        inc = actor.inc
        if inc is not None and actor.state == ALIVE and handle._epoch == actor.epoch:
            return inc
        with self.cond:
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
                self.cond.wait(left)

    def resolve_lost(self, handle: ActorHandle, epoch: int, lost: ConnectionLost) -> FrayError:
        """What a call that lost its connection to incarnation `epoch` should raise."""
        actor = handle._actor
        with self.cond:
            if not self.cond.wait_for(lambda: epoch in actor.outcomes, timeout=10.0):
                return lost
            out = actor.outcomes[epoch]
            if handle._epoch == epoch:
                handle._epoch = epoch + 1
            return copy.copy(out)

    # -- the supervisor thread -------------------------------------------------------------
    def _run(self) -> None:
        next_beat = time.monotonic() + self._hb_interval
        while True:
            with self.cond:
                while not self._events and not self.closed:
                    now = time.monotonic()
                    due = [g.restart_at for g in self._gangs() if g.restart_at is not None]
                    wake = min([next_beat, *due])
                    if wake <= now:
                        break
                    self.cond.wait(wake - now)
                if self.closed:
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

    def _gangs(self) -> list[Gang]:
        with self.cond:
            return list({id(a.gang): a.gang for a in self.actors.values()}.values())

    def _on_death(self, actor: ActorRecord, epoch: int, info: DeathInfo) -> None:
        to_stop, abandoned = [], []
        with self.cond:
            if epoch != actor.epoch or actor.state not in (ALIVE, STARTING) or self.closed:
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
            self.cond.notify_all()
        for inc in abandoned:
            self._backend._abandon(inc)
        for inc in to_stop:
            self._backend._stop(inc, graceful=False)

    def _restart(self, gang: Gang) -> None:
        with self.cond:
            gang.restart_at = None
            members = [m for m in gang.members if m.state == RESTARTING]
            if len(members) != len(gang.members) or self.closed:
                return
            for m in members:
                m.epoch += 1
                m.state = STARTING
        try:
            results = self._backend._launch(members)
        except Exception as e:  # never let a backend error end the supervisor
            why = f"it could not be restarted: {type(e).__name__}: {e}"
            results = [DeathInfo(why)] * len(members)
        failed, orphans = None, []
        with self.cond:
            for m, r in zip(members, results):
                if isinstance(r, DeathInfo):
                    failed = failed or (m, r)
                elif m.state == STARTING:
                    m.inc, m.state = r, ALIVE
                    m.ping, m.stats = None, {}
                else:  # stopped (kill/shutdown) while starting
                    orphans.append(r)
            self.cond.notify_all()
        for inc in orphans:
            self._backend._stop(inc, graceful=False)
        if failed is not None:
            m, info = failed
            self._on_death(m, m.epoch, info)

    def _heartbeat(self) -> None:
        now = time.monotonic()
        with self.cond:
            alive = [a for a in self.actors.values() if a.state == ALIVE]
        for a in alive:
            inc, ping = a.inc, a.ping
            if inc is None:
                continue
            death = self._backend._poll(inc)
            if death is not None:
                self.report_death(a, a.epoch, death)
                continue
            if ping is not None and not ping[0].done():
                if now - ping[1] > self._hb_timeout and a.hung is None:
                    a.hung = f"hung: no heartbeat reply for {now - ping[1]:.1f} s"
                    self._backend._stop(inc, graceful=False)
                    self.report_death(a, a.epoch, DeathInfo(a.hung, signal=9, preempted=False))
                continue
            fut = self._backend._ping(inc)
            a.ping = None if fut is None else (fut, now)
            if fut is not None:
                fut.add_done_callback(lambda f, a=a: _take_stats(a, f))


def _take_stats(actor: ActorRecord, ping: Future) -> None:
    try:
        actor.stats = ping.result(0)
    except Exception:
        pass  # a failed ping says nothing about call statistics
