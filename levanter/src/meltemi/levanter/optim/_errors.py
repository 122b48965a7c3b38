"""The exception the optimizers raise for invalid configuration."""

from __future__ import annotations


class OptimizerConfigError(ValueError):
    """An optimizer or schedule was configured with an invalid value.

    The message names the field, shows the value and says how to fix it.
    """


def check_window(name: str, window: int, sigma: float, warmup: int | None) -> int:
    """Validates a rolling-window rule (`window`, `sigma`, `warmup`); returns the warmup used."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 2:
        raise OptimizerConfigError(f"{name}: window={window!r} must be an int >= 2, e.g. 128")
    if not sigma >= 0:
        raise OptimizerConfigError(f"{name}: sigma={sigma!r} must be >= 0, e.g. 2.0")
    if warmup is None:
        return window
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 2:
        raise OptimizerConfigError(
            f"{name}: warmup={warmup!r} (steps recorded before the rule applies) must be an "
            f"int >= 2 (a std needs two values), e.g. warmup={window}"
        )
    return warmup
