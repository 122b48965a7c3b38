"""What an actor knows about itself: `actor_context()`, plus `free_port()`."""

from __future__ import annotations

import dataclasses
import socket
import threading

__all__ = ["ActorContext", "actor_context", "free_port"]


@dataclasses.dataclass(frozen=True)
class ActorContext:
    """Identity of the running actor, as seen from inside its methods and constructor.

    Attributes:
        name: the actor's name (`"<group>/<rank>"` for group members).
        rank: its index in its group (0 for a lone actor).
        group_size: the number of members of its group (1 for a lone actor).
        group: the group's name, or None for a lone actor.
        epoch: its incarnation (0 at first, +1 per restart).
        backend: "inprocess", "local" or "ray".
    """

    name: str
    rank: int = 0
    group_size: int = 1
    group: str | None = None
    epoch: int = 0
    backend: str = "inprocess"


_thread_context = threading.local()
_process_context: list[ActorContext | None] = [None]


def set_context(ctx: ActorContext | None, *, process: bool = False) -> None:
    """Sets the context of the current thread (and, with process=True, the process default)."""
    _thread_context.value = ctx
    if process:
        _process_context[0] = ctx


def actor_context() -> ActorContext:
    """The `ActorContext` of the actor running the current method.

    Inside a spawned group, `actor_context().rank` tells a member which one it is, e.g. to pick
    the `jax.distributed` process id.

    Raises:
        RuntimeError: when called outside an actor's constructor or methods.

    Example:
        >>> actor_context()
        Traceback (most recent call last):
        ...
        RuntimeError: actor_context() was called outside an actor; it works inside ...
    """
    ctx = getattr(_thread_context, "value", None) or _process_context[0]
    if ctx is None:
        raise RuntimeError(
            "actor_context() was called outside an actor; it works inside the constructor "
            "and methods of actors started with cluster.spawn(...) or cluster.spawn_group(...)"
        )
    return ctx


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that was free a moment ago (for `jax.distributed` coordinators).

    Another process may take it before you bind it; bind soon after asking.

    Example:
        >>> 0 < free_port() < 65536
        True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
