"""What callers hold: `ActorHandle`, its `ActorMethod`s, `ActorGroup`, and `ActorInfo` rows.

A handle knows its actor's record (name, rank, methods) and talks to the runtime through one
small interface, `Caller`, which every `Cluster` implements; it never sees the supervisor.
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, Protocol

from meltemi.fray._config import check_timeout
from meltemi.fray._future import Future
from meltemi.fray._methods import MethodInfo
from meltemi.fray._records import ActorRecord, CallArgs

__all__ = ["ActorGroup", "ActorHandle", "ActorInfo", "ActorMethod", "Caller"]

_UNSET: Any = object()
DEFAULT: Any = _UNSET  # "use the cluster's call_timeout"


class Caller(Protocol):
    """What a handle needs from the runtime that made it (implemented by `Cluster`)."""

    backend: str

    def _call(self, handle: ActorHandle, info: MethodInfo, args: CallArgs, timeout: Any,
              retries: int | None) -> Future:  # fmt: skip
        """Starts one call of `info` on the handle's actor; `timeout` may be `DEFAULT`."""

    def _address(self, actor: ActorRecord) -> tuple[str, int] | None:
        """Where the actor's current incarnation serves, if it has an address."""


class ActorMethod:
    """One method of an actor, bound to a handle.

    `handle.m(*a)` blocks for the result; `handle.m.remote(*a)` returns a `Future`;
    `await handle.m.aio(*a)` awaits it; `handle.m.options(timeout=5).remote(*a)` sets this
    call's deadline (seconds; `timeout=None` or `float("inf")` waits without a deadline, e.g.
    for a whole training run; NaN is refused) and, for idempotent methods, its `retries`.
    """

    __slots__ = ("_handle", "_info", "_timeout", "_retries")

    def __init__(self, handle: ActorHandle, info: MethodInfo, timeout=_UNSET, retries=None):
        self._handle = handle
        self._info = info
        self._timeout = timeout
        self._retries = retries

    def options(self, *, timeout: float | None = _UNSET, retries: int | None = _UNSET):
        """A copy of this method with its own deadline (seconds, or None for none) and retries."""
        timeout = self._timeout if timeout is _UNSET else timeout
        retries = self._retries if retries is _UNSET else retries
        if timeout is not _UNSET:
            where = f"{self._handle.name}.{self._info.name}.options(timeout"
            timeout = check_timeout(where, timeout)
        if retries is not None and retries and not self._info.idempotent:
            raise ValueError(
                f"{self._handle.name}.{self._info.name}.options(retries={retries!r}): only "
                f"methods marked @fray.idempotent may be retried (at-most-once otherwise); "
                f"decorate {self._info.name} with @fray.idempotent if running it twice is safe"
            )
        return ActorMethod(self._handle, self._info, timeout, retries)

    def remote(self, *args, **kwargs) -> Future:
        """Starts the call and returns its `Future` (calls through one handle stay ordered)."""
        return self._start(CallArgs(args, kwargs))

    def _start(self, args: CallArgs) -> Future:
        h = self._handle
        return h._caller._call(h, self._info, args, self._timeout, self._retries)

    def __call__(self, *args, **kwargs) -> Any:
        return self.remote(*args, **kwargs).result()

    async def aio(self, *args, **kwargs) -> Any:
        """Awaitable form of the call, for asyncio code."""
        return await self.remote(*args, **kwargs)._as_asyncio()

    def __repr__(self) -> str:
        return f"<fray.ActorMethod {self._handle.name}.{self._info.name}>"


class ActorHandle:
    """A reference to an actor: attribute access gives its public methods.

    Handles are cheap; each holds its own connection (LocalCluster), so calls through one
    handle run in the order they were made. The handle follows its actor across restarts,
    telling the caller once (`ActorRestarted` or `ActorDied(will_restart=True)`) per restart.
    """

    __slots__ = ("_caller", "_actor", "_epoch", "_conn", "_conn_lock", "__weakref__")

    def __init__(self, caller: Caller, actor: ActorRecord, epoch: int):
        self._caller = caller
        self._actor = actor
        self._epoch = epoch
        self._conn = None
        self._conn_lock = threading.Lock()

    @property
    def name(self) -> str:
        """The actor's name (unique in its cluster)."""
        return self._actor.name

    @property
    def epoch(self) -> int:
        """The incarnation this handle talks to (0 at first, +1 per restart)."""
        return self._epoch

    @property
    def address(self) -> tuple[str, int] | None:
        """`(host, port)` of the actor's RPC server (LocalCluster), else None."""
        return self._caller._address(self._actor)

    @property
    def rank(self) -> int:
        """The actor's rank in its group (0 for a lone actor)."""
        return self._actor.rank

    def __getattr__(self, attr: str) -> ActorMethod:
        if attr.startswith("_"):
            raise AttributeError(attr)
        info = self._actor.methods.get(attr)
        if info is None:
            cls = self._actor.cls.__name__
            close = difflib.get_close_matches(attr, list(self._actor.methods), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            known = ", ".join(sorted(self._actor.methods)) or "none"
            raise AttributeError(
                f"actor {self.name!r} ({cls}) has no public method {attr!r}{hint} "
                f"(public methods: {known})"
            )
        return ActorMethod(self, info)

    def __repr__(self) -> str:
        return (
            f"<fray.ActorHandle {self.name!r} ({self._actor.cls.__name__}) epoch={self._epoch} "
            f"on {self._caller.backend}>"
        )

    def __reduce__(self):
        raise TypeError(
            f"a handle to actor {self.name!r} cannot be pickled: handles work only in the "
            "process that made the cluster (actors cannot call actors yet). Make the call "
            f"there and pass its result instead, e.g. `other.m(h.f())` rather than `other.m(h)`"
        )

    def __del__(self):
        conn = self._conn
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass


class ActorGroup(Sequence):
    """The members of a group made by `spawn_group`, in rank order (a sequence of handles).

    Members are named `"<group>/<rank>"`; with gang semantics (the default) they live, die
    and restart together.
    """

    def __init__(self, name: str, handles: list[ActorHandle]):
        self.name = name
        self._handles = tuple(handles)

    def __getitem__(self, i):
        return self._handles[i]

    def __len__(self) -> int:
        return len(self._handles)

    def __iter__(self) -> Iterator[ActorHandle]:
        return iter(self._handles)

    def call(self, method: str, *args, **kwargs) -> list[Future]:
        """Starts `method(*args, **kwargs)` on every member; returns their futures by rank.

        The arguments are pickled once and the same bytes go to every member.
        """
        methods = [getattr(h, method) for h in self._handles]  # unknown names fail first
        shared = CallArgs(args, kwargs, shared=True)
        return [m._start(shared) for m in methods]

    def __repr__(self) -> str:
        return f"<fray.ActorGroup {self.name!r} of {len(self)}>"


class ActorInfo(NamedTuple):
    """One row of `cluster.actors()` (and of `bazel run //fray:status`)."""

    name: str
    cls: str
    state: str
    epoch: int
    failures: int
    preemptions: int
    pid: int | None
    address: tuple[str, int] | None
    calls: int
    errors: int
    p50_us: float
    p99_us: float
    group: str | None
