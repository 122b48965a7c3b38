"""Typed failures raised by fray calls.

Every error a caller can see derives from `FrayError`. All of them pickle, so a call made from
inside one actor to another can re-raise them unchanged.
"""

from __future__ import annotations

import signal as _signal

__all__ = [
    "ActorDied",
    "ActorRestarted",
    "AuthenticationError",
    "CallTimeout",
    "ConnectionLost",
    "FrayError",
    "ProtocolError",
    "RemoteError",
]


class FrayError(Exception):
    """Base class of every fray failure."""

    def __reduce__(self):
        return (_rebuild, (type(self), dict(self.__dict__)))


def _rebuild(cls, state):
    obj = cls.__new__(cls)
    obj.__dict__.update(state)
    Exception.__init__(obj, obj._message())
    return obj


def _signal_name(signum: int) -> str:
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class ActorDied(FrayError):
    """The actor's process (or thread) ended while, or before, it served this call.

    Attributes:
        name: the actor's name.
        reason: what happened, in words ("exited", "killed by SIGKILL", "hung: ...").
        epoch: the incarnation that died (0 for the first, +1 per restart).
        exit_code: the process exit code, if it exited.
        signal: the signal number that killed it, if one did.
        log_tail: the last lines the actor wrote to stdout/stderr (LocalCluster).
        will_restart: whether its restart policy will start a new incarnation.
    """

    def __init__(
        self,
        name: str,
        reason: str,
        *,
        epoch: int = 0,
        exit_code: int | None = None,
        signal: int | None = None,
        log_tail: tuple[str, ...] = (),
        will_restart: bool = False,
    ):
        self.name = name
        self.reason = reason
        self.epoch = epoch
        self.exit_code = exit_code
        self.signal = signal
        self.log_tail = tuple(log_tail)
        self.will_restart = will_restart
        super().__init__(self._message())

    def _message(self) -> str:
        how = []
        if self.exit_code is not None:
            how.append(f"exit code {self.exit_code}")
        if self.signal is not None:
            how.append(f"signal {_signal_name(self.signal)}")
        head = f"actor {self.name!r} (epoch {self.epoch}) died: {self.reason}"
        if how:
            head += f" ({', '.join(how)})"
        head += "; it will be restarted" if self.will_restart else "; it will not be restarted"
        if self.log_tail:
            head += "\n--- last lines of its log ---\n" + "\n".join(self.log_tail)
        return head


class ActorRestarted(FrayError):
    """The actor this handle was talking to was replaced by a new incarnation.

    Raised to a caller whose call was in flight when a gang restart stopped the actor, or,
    once, on the first call through a handle after a restart it had not been told about. The
    new incarnation starts from its constructor: any state the old one held is gone. The next
    call through the same handle goes to the new incarnation.

    Attributes:
        name: the actor's name.
        old_epoch: the incarnation the handle knew.
        new_epoch: the incarnation now serving calls.
        reason: why the restart happened.
    """

    def __init__(self, name: str, old_epoch: int, new_epoch: int, reason: str = ""):
        self.name = name
        self.old_epoch = old_epoch
        self.new_epoch = new_epoch
        self.reason = reason
        super().__init__(self._message())

    def _message(self) -> str:
        msg = (
            f"actor {self.name!r} was restarted (epoch {self.old_epoch} -> {self.new_epoch}); "
            "its state was rebuilt from its constructor"
        )
        return msg + (f": {self.reason}" if self.reason else "")


class CallTimeout(FrayError, TimeoutError):
    """A call did not finish before its deadline.

    At-most-once: a call whose deadline passed while it waited in the actor's queue is dropped
    without running; one that had already started may still finish (its result is discarded).

    Attributes:
        name: the actor's name.
        method: the method called.
        timeout: the deadline, in seconds after the call was made.
    """

    def __init__(self, name: str, method: str, timeout: float, detail: str = ""):
        self.name = name
        self.method = method
        self.timeout = timeout
        self.detail = detail
        super().__init__(self._message())

    def _message(self) -> str:
        msg = f"{self.name}.{self.method}() did not finish within {self.timeout:.3g} s"
        if self.detail:
            msg += f" ({self.detail})"
        return (
            msg + f"; give it more time with handle.{self.method}.options(timeout=...) "
            "or the cluster's call_timeout=..."
        )


class RemoteError(FrayError):
    """The actor's method raised; the actor itself is still alive.

    Attributes:
        name: the actor's name.
        method: the method called.
        type_name: the qualified name of the remote exception's type.
        message: `str()` of the remote exception.
        traceback: the remote traceback, as text.
        cause: the remote exception itself when it could be sent back, else None.
    """

    def __init__(
        self,
        name: str,
        method: str,
        type_name: str,
        message: str,
        traceback: str,
        cause: BaseException | None = None,
    ):
        self.name = name
        self.method = method
        self.type_name = type_name
        self.message = message
        self.traceback = traceback
        self.cause = cause
        super().__init__(self._message())

    def _message(self) -> str:
        return (
            f"{self.name}.{self.method}() raised {self.type_name}: {self.message}\n"
            f"--- remote traceback ---\n{self.traceback.rstrip()}"
        )


class ConnectionLost(FrayError):
    """The connection to a live actor broke; the call may or may not have run."""

    def __init__(self, name: str, detail: str):
        self.name = name
        self.detail = detail
        super().__init__(self._message())

    def _message(self) -> str:
        return f"connection to actor {self.name!r} lost: {self.detail}"


class AuthenticationError(FrayError, ConnectionError):
    """The peer failed the HMAC challenge-response (wrong or missing cluster secret)."""

    def __init__(self, detail: str):
        self.detail = detail
        super().__init__(self._message())

    def _message(self) -> str:
        return self.detail


class ProtocolError(FrayError, ValueError):
    """A frame broke the wire protocol (bad header, too many parts, too large)."""

    def __init__(self, detail: str):
        self.detail = detail
        super().__init__(self._message())

    def _message(self) -> str:
        return self.detail
