"""The value checks of config keys, shared by the trainer's sections and `experiments` (`sweep.*`).

Each function checks one value and raises a one-line error naming the key, the value and the
fix. The small check classes carry one of them into a key's definition (`_keys.key`), with
`wrong`: a value the check refuses (the tests set every key to its `wrong` value).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from typing import Any

from meltemi.levanter.config._errors import ConfigError


def check_int(
    key: str,
    value: Any,
    *,
    minimum: int,
    example: int | None = None,
    error: type[ConfigError] = ConfigError,
) -> int:
    """`value` if it is an int (not a bool) >= `minimum`.

    Without `example` (the `sweep.*` keys) the message ends at the bound.

    Example:
        >>> check_int("eval.harness_limit", 100, minimum=0, example=100)
        100
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        if example is None:
            raise error(f"{key}={value!r}: must be an integer >= {minimum}.")
        raise error(f"{key}={value!r}: must be an int >= {minimum}; e.g. --config.{key}={example}.")
    return value


def check_number(key: str, value: Any, *, example: float) -> float:
    """`value` as a float if it is a number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ConfigError(f"{key}={value!r}: must be a number >= 0; e.g. --config.{key}={example}.")
    return float(value)


def check_choice(
    key: str,
    value: Any,
    choices: tuple,
    *,
    suggest: bool = True,
    error: type[ConfigError] = ConfigError,
) -> Any:
    """`value` if it is one of `choices`; with `suggest`, the message names the closest one.

    Example:
        >>> check_choice("data.packing", "stream", ("stream", "whole_documents"))
        'stream'
    """
    if value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=1) if suggest else []
        hint = f" Did you mean --config.{key}={close[0]}?" if close else ""
        raise error(f"{key}={value!r}: must be one of {choices}.{hint}")
    return value


def check_paths(key: str, value: Any) -> tuple[str, ...]:
    """A tuple of paths; a bare string (a path, not a tuple of one) is refused with the fix."""
    if isinstance(value, str):
        raise ConfigError(
            f"{key}={value!r} is a string; it takes a tuple of paths or globs: "
            f'--config.{key}="({value!r},)".'
        )
    if not isinstance(value, tuple | list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(
            f"{key}={value!r}: a tuple of paths or globs, e.g. --config.{key}=\"('a/*.txt',)\"."
        )
    return tuple(value)


def check_flag(key: str, value: Any) -> bool:
    """`value` if it is a bool."""
    if not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r}: true or false, e.g. --config.{key}=true.")
    return value


def check_text(key: str, value: Any, *, optional: bool = False) -> str | None:
    """`value` if it is a string (or None, when `optional`)."""
    if not isinstance(value, str) and not (optional and value is None):
        raise ConfigError(f"{key}={value!r}: must be a string; e.g. --config.{key}=text.")
    return value


# --- checks as values, for key definitions ---


@dataclasses.dataclass(frozen=True)
class AtLeast:
    """An int >= `minimum` (`example` goes in the message)."""

    minimum: int
    example: int

    @property
    def wrong(self) -> int:
        return self.minimum - 1

    def __call__(self, key: str, value: Any) -> int:
        return check_int(key, value, minimum=self.minimum, example=self.example)


@dataclasses.dataclass(frozen=True)
class AnyInt:
    """Any int (a seed)."""

    example: int = 0
    wrong: Any = 1.5

    def __call__(self, key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(
                f"{key}={value!r}: must be an int; e.g. --config.{key}={self.example}."
            )
        return value


@dataclasses.dataclass(frozen=True)
class Number:
    """A number >= 0, as a float."""

    example: float
    wrong: Any = -1.0

    def __call__(self, key: str, value: Any) -> float:
        return check_number(key, value, example=self.example)


@dataclasses.dataclass(frozen=True)
class OneOf:
    """One of `choices`; `aliases` maps former names to current ones first."""

    choices: tuple[str, ...]
    aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)
    wrong: Any = "no-such-choice"

    def __call__(self, key: str, value: Any) -> str:
        return check_choice(key, self.aliases.get(value, value), self.choices)


@dataclasses.dataclass(frozen=True)
class Flag:
    """A bool."""

    wrong: Any = "yes"

    def __call__(self, key: str, value: Any) -> bool:
        return check_flag(key, value)


@dataclasses.dataclass(frozen=True)
class Text:
    """A string (or None, when `optional`)."""

    optional: bool = False
    wrong: Any = 3

    def __call__(self, key: str, value: Any) -> str | None:
        return check_text(key, value, optional=self.optional)


@dataclasses.dataclass(frozen=True)
class Paths:
    """A tuple of paths or globs."""

    wrong: Any = "corpus.txt"

    def __call__(self, key: str, value: Any) -> tuple[str, ...]:
        return check_paths(key, value)


@dataclasses.dataclass(frozen=True)
class Custom:
    """A section's own check function, and a value it refuses."""

    check: Callable[[str, Any], Any]
    wrong: Any

    def __call__(self, key: str, value: Any) -> Any:
        return self.check(key, value)


@dataclasses.dataclass(frozen=True)
class InSection:
    """Checked by the section's builder with other keys (e.g. against `num_train_steps`)."""

    wrong: Any

    def __call__(self, key: str, value: Any) -> Any:
        return value
