"""The evaluation's error type."""

from __future__ import annotations

from meltemi.levanter.config import ConfigError


class EvalError(ConfigError):
    """A checkpoint, config or evaluation file that cannot be evaluated (names the fix)."""
