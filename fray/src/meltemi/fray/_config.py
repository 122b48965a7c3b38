"""Value types that configure actors: what they need and how they are restarted."""

from __future__ import annotations

import dataclasses
import math
import signal

__all__ = ["NO_DEADLINE_S", "Resources", "RestartPolicy", "check_timeout"]

# A timeout this long (~31 years) or infinite means no deadline: deadlines are added to clocks,
# and lock waits refuse more than threading.TIMEOUT_MAX (~292 years on Linux).
NO_DEADLINE_S = 1e9


def check_timeout(where: str, value, *, allow_zero: bool = False) -> float | None:
    """A timeout in seconds, validated: None, inf or >= 1e9 s mean no deadline.

    Args:
        where: how the caller wrote it, e.g. `"LocalCluster(call_timeout"`, for the error.
        value: the timeout given.
        allow_zero: whether 0 (do not wait) is allowed.

    Example:
        >>> check_timeout("f(timeout", float("inf")) is None
        True
        >>> check_timeout("f(timeout", float("nan"))
        Traceback (most recent call last):
        ...
        ValueError: f(timeout=nan): must be a positive number of seconds; ...
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{where}={value!r}): must be a number of seconds, or None for no deadline")
    if math.isnan(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(
            f"{where}={value!r}): must be a positive number of seconds; use None (or "
            "float('inf')) for no deadline"
        )
    return None if value >= NO_DEADLINE_S else float(value)


def _check_number(owner: str, field: str, value, *, minimum: float = 0.0) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise TypeError(f"{owner}.{field} must be a number, got {value!r}")
    if value < minimum:
        raise ValueError(
            f"{owner}.{field} must be >= {minimum:g}, got {value!r}; "
            f"e.g. {owner}({field}={max(minimum, 1) if minimum else 0})"
        )


@dataclasses.dataclass(frozen=True)
class Resources:
    """What one actor reserves.

    LocalCluster and RayCluster refuse to place an actor whose reservation cannot fit (Ray
    schedules it where it fits); InProcessCluster ignores reservations.

    Args:
        cpus: CPU cores reserved (0 = no reservation, the default).
        gpus: accelerators reserved.
        memory_bytes: memory reserved, or None.
        custom: other named resources, e.g. `{"tpu_slice": 1}` (Ray custom resources).

    Example:
        >>> Resources(cpus=2).cpus
        2
        >>> Resources(cpus=-1)
        Traceback (most recent call last):
        ...
        ValueError: Resources.cpus must be >= 0, got -1; e.g. Resources(cpus=0)
    """

    cpus: float = 0
    gpus: float = 0
    memory_bytes: int | None = None
    custom: dict[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        _check_number("Resources", "cpus", self.cpus)
        _check_number("Resources", "gpus", self.gpus)
        if self.memory_bytes is not None:
            _check_number("Resources", "memory_bytes", self.memory_bytes)
        for key, value in self.custom.items():
            if not isinstance(key, str):
                raise TypeError(f"Resources.custom keys must be str, got {key!r}")
            _check_number("Resources", f"custom[{key!r}]", value)

    def __hash__(self):
        return hash((self.cpus, self.gpus, self.memory_bytes, tuple(sorted(self.custom.items()))))


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """When and how fast a dead actor (or a whole group) is started again.

    A death is a *preemption* when the process was killed by one of `preemption_signals` (a
    scheduler reclaiming the machine sends SIGTERM) or exited with one of
    `preemption_exit_codes`; anything else is a *failure*. Each kind has its own budget:
    `max_failures` restarts after failures and `max_preemptions` after preemptions over the
    actor's lifetime. Restart number `n` of a kind waits
    `min(backoff_max_s, backoff_initial_s * backoff_multiplier ** (n - 1))` seconds.

    For a group spawned with `spawn_group`, the budget belongs to the group: one member dying
    restarts every member and spends one unit.

    Args:
        max_failures: restarts allowed after failures (crashes, non-zero exits, hangs).
        max_preemptions: restarts allowed after preemptions.
        backoff_initial_s: wait before the first restart of each kind.
        backoff_max_s: cap on the wait.
        backoff_multiplier: growth of the wait per restart of the same kind.
        preemption_signals: signals that mean "preempted" (default SIGTERM).
        preemption_exit_codes: exit codes that mean "preempted".

    Example:
        >>> policy = RestartPolicy(max_failures=3, backoff_initial_s=0.5)
        >>> [policy.backoff(n) for n in (1, 2, 3)]
        [0.5, 1.0, 2.0]
        >>> RestartPolicy(max_failures=-1)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: RestartPolicy.max_failures must be >= 0, got -1; e.g. ...
    """

    max_failures: int = 0
    max_preemptions: int = 0
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 30.0
    backoff_multiplier: float = 2.0
    preemption_signals: tuple[int, ...] = (int(signal.SIGTERM),)
    preemption_exit_codes: tuple[int, ...] = ()

    def __post_init__(self):
        for field in ("max_failures", "max_preemptions"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"RestartPolicy.{field} must be an int, got {value!r}")
            _check_number("RestartPolicy", field, value)
        _check_number("RestartPolicy", "backoff_initial_s", self.backoff_initial_s)
        _check_number("RestartPolicy", "backoff_max_s", self.backoff_max_s)
        _check_number("RestartPolicy", "backoff_multiplier", self.backoff_multiplier, minimum=1.0)
        object.__setattr__(self, "preemption_signals", tuple(map(int, self.preemption_signals)))
        object.__setattr__(self, "preemption_exit_codes", tuple(self.preemption_exit_codes))

    def backoff(self, n: int) -> float:
        """Seconds to wait before restart number `n` (1-based) of one kind."""
        if n < 1:
            raise ValueError(f"RestartPolicy.backoff(n) needs n >= 1, got {n}")
        wait = self.backoff_initial_s * self.backoff_multiplier ** (n - 1)
        return float(min(self.backoff_max_s, wait))

    def is_preemption(self, exit_code: int | None, signum: int | None) -> bool:
        """Whether a death with this exit code or signal counts as a preemption."""
        if signum is not None and signum in self.preemption_signals:
            return True
        return exit_code is not None and exit_code in self.preemption_exit_codes
