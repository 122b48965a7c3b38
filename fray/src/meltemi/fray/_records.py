"""The supervisor's records of actors and gangs, shared by the supervisor, the API and backends.

The bottom layer of the runtime: plain state with no behaviour, so that `_handle.py` (what
callers hold), `_supervisor.py` (restarts, heartbeats) and `_cluster.py` (the public API) can
each depend on it without depending on one another.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from meltemi.fray._config import Resources, RestartPolicy
from meltemi.fray._errors import ActorDied, FrayError
from meltemi.fray._future import Future
from meltemi.fray._methods import MethodInfo, method_table
from meltemi.fray._wire import dumps

__all__ = [
    "ALIVE",
    "DEAD",
    "RESTARTING",
    "STARTING",
    "STOPPED",
    "ActorRecord",
    "CallArgs",
    "DeathInfo",
    "Gang",
]

STARTING, ALIVE, RESTARTING, DEAD, STOPPED = "starting", "alive", "restarting", "dead", "stopped"


@dataclasses.dataclass
class DeathInfo:
    """How an incarnation ended, as a backend saw it."""

    reason: str
    exit_code: int | None = None
    signal: int | None = None
    log_tail: tuple[str, ...] = ()
    preempted: bool | None = None  # None: classify with the restart policy


class Gang:
    """Actors that die and restart together under one restart budget (a lone actor: one)."""

    def __init__(self, name: str, policy: RestartPolicy, is_group: bool):
        self.name = name
        self.policy = policy
        self.is_group = is_group
        self.members: list[ActorRecord] = []
        self.failures = 0
        self.preemptions = 0
        self.restart_at: float | None = None


class ActorRecord:
    """One actor across its incarnations: what it is, and its current state."""

    def __init__(self, name, cls, args, kwargs, gang, rank, resources, max_concurrency):
        self.name: str = name
        self.cls: type = cls
        self.args: tuple = args
        self.kwargs: dict = kwargs
        self.gang: Gang = gang
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


class CallArgs:
    """The arguments of one call, pickled at most once however many actors receive them.

    `ActorGroup.call` sends one `CallArgs` to every member (`shared=True`), and retries of an
    idempotent call reuse it, so a 50 MB array is pickled once, not once per member or attempt.
    """

    __slots__ = ("args", "kwargs", "shared", "_wire", "cache")

    def __init__(self, args: tuple, kwargs: dict, *, shared: bool = False):
        self.args = args
        self.kwargs = kwargs
        self.shared = shared
        self._wire: list | None = None
        self.cache: Any = None  # a backend's own encoding (e.g. a Ray object reference)

    def __bool__(self) -> bool:
        return bool(self.args or self.kwargs)

    def encoded(self) -> list:
        """`[pickle, *out_of_band_buffers]` of `(args, kwargs)`, made on first use; [] if none."""
        if self._wire is None:
            self._wire = dumps((self.args, self.kwargs)) if self else []
        return self._wire
