"""The one error base of the trainer's configuration, and its kinds.

Every mistake in a config (a misspelt key, a value of the wrong type, a setting that cannot
be built or has no effect) is a `ConfigError`: the binary prints it as one `error: ...` line
and exits with status 2.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A config file, variant, override or setting that cannot be used as given.

    The message names the key, shows the value and says how to fix it.
    """


class UnknownConfigKeyError(ConfigError):
    """An override or variant names a key the config does not have."""


class ConfigTypeError(ConfigError):
    """An override's value cannot be converted to its field's type."""


class InertKeyError(ConfigError):
    """A key is set but has no effect under the other settings (which the message names)."""


class BuildError(ConfigError):
    """A model, data or optimizer setting that cannot be built (names the key and the fix)."""
