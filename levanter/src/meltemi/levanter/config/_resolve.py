"""Loading config files, applying command-line overrides, and recording where values came from."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import hashlib
import importlib.util
import json
import os
import pathlib
import traceback
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import ml_collections

from meltemi.levanter.config._base import base_config
from meltemi.levanter.config._errors import ConfigError, ConfigTypeError, UnknownConfigKeyError

PROVENANCES = ("default", "file", "variant", "flag")


def flatten(config: ml_collections.ConfigDict | Mapping[str, Any], prefix: str = "") -> dict:
    """Returns `{"a.b.c": value}` for every leaf of a (nested) config.

    Example:
        >>> flatten({"trainer": {"seed": 0, "num_train_steps": 5}, "run_dir": ""})
        {'trainer.seed': 0, 'trainer.num_train_steps': 5, 'run_dir': ''}
    """
    items = config.items() if isinstance(config, Mapping) else config.items()
    out: dict[str, Any] = {}
    for key, value in items:
        path = f"{prefix}{key}"
        if isinstance(value, (ml_collections.ConfigDict, Mapping)):
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def closest_key(key: str, keys: Iterable[str]) -> str | None:
    """The valid key most similar to `key`, compared whole and by last component."""
    keys = list(keys)
    best = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    if best:
        return best[0]
    by_leaf = {k.rsplit(".", 1)[-1]: k for k in keys}
    leaf = difflib.get_close_matches(key.rsplit(".", 1)[-1], list(by_leaf), n=1, cutoff=0.6)
    return by_leaf[leaf[0]] if leaf else None


def _unknown_key(key: str, config: ml_collections.ConfigDict, how: str) -> UnknownConfigKeyError:
    keys = list(flatten(config))
    suggestion = closest_key(key, keys)
    hint = f" Did you mean `{how}{suggestion}`?" if suggestion else ""
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    siblings = sorted(k for k in keys if parent and k.startswith(parent + "."))
    listing = f" Keys under `{parent}`: {', '.join(siblings)}." if siblings else ""
    return UnknownConfigKeyError(f"`{how}{key}`: the config has no key `{key}`.{hint}{listing}")


def _get(config: ml_collections.ConfigDict, key: str, how: str) -> tuple[Any, str]:
    """Returns (the ConfigDict holding `key`'s leaf, the leaf name), checking it exists."""
    node = config
    parts = key.split(".")
    for part in parts[:-1]:
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            raise _unknown_key(key, config, how)
        node = node[part]
    if not isinstance(node, ml_collections.ConfigDict) or parts[-1] not in node:
        raise _unknown_key(key, config, how)
    if isinstance(node[parts[-1]], ml_collections.ConfigDict):
        leaves = sorted(k for k in flatten(config) if k.startswith(key + "."))
        raise ConfigError(
            f"`{how}{key}` is a section, not a value; set its fields one by one, "
            f"e.g. `{how}{leaves[0]}=...` (fields: {', '.join(leaves)})."
        )
    return node, parts[-1]


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_value(key: str, raw: str, field_type: type, how: str = "--config.") -> Any:
    """Converts the command-line text `raw` to `field_type`, naming the field if it cannot.

    Example:
        >>> parse_value("trainer.seed", "7", int)
        7
        >>> parse_value("trainer.progress_bar", "false", bool)
        False
    """
    try:
        if field_type is bool:
            if raw.lower() in _TRUE:
                return True
            if raw.lower() in _FALSE:
                return False
            raise ValueError(raw)
        if field_type is int:
            return int(raw)
        if field_type is float:
            return float(raw)
        if field_type is str:
            return raw
        if field_type in (object, type(None)):
            if raw.lower() in _TRUE - {"1"} or raw.lower() in _FALSE - {"0"}:
                return raw.lower() in _TRUE
            try:
                return ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                return raw  # a bare word: a string
        value = ast.literal_eval(raw)
        if field_type in (tuple, list):
            if not isinstance(value, (tuple, list)):
                raise ValueError(raw)
            return field_type(value)
        return value
    except (ValueError, SyntaxError):
        example = {bool: "true", int: "3", float: "0.001", str: "text", tuple: "'(1, 2)'"}
        hint = example.get(field_type, repr(raw))
        raise ConfigTypeError(
            f"`{how}{key}={raw}`: {raw!r} is not a valid {field_type.__name__}, the type of "
            f"`{key}`; pass e.g. `{how}{key}={hint}`."
        ) from None


def set_value(config: ml_collections.ConfigDict, key: str, raw: str, how: str = "--config.") -> Any:
    """Sets the dotted `key` of `config` from command-line text; returns the parsed value."""
    node, leaf = _get(config, key, how)
    value = parse_value(key, raw, node.get_type(leaf), how)
    try:
        node[leaf] = value
    except TypeError as e:
        raise ConfigTypeError(f"`{how}{key}={raw}`: {e}") from None
    return value


def apply_overrides(
    config: ml_collections.ConfigDict, overrides: Mapping[str, Any], how: str = ""
) -> ml_collections.ConfigDict:
    """Sets dotted keys of `config` to Python values, checking each key exists.

    Example:
        >>> from meltemi.levanter.config import base_config
        >>> config = apply_overrides(base_config(), {"trainer.seed": 3})
        >>> config.trainer.seed
        3
    """
    for key, value in overrides.items():
        node, leaf = _get(config, key, how)
        try:
            node[leaf] = value
        except TypeError as e:
            raise ConfigTypeError(f"`{how}{key}`: {value!r}: {e}") from None
    return config


def with_variant(
    config: ml_collections.ConfigDict,
    variant: str | None,
    variants: Mapping[str, Mapping[str, Any]],
) -> ml_collections.ConfigDict:
    """Applies `variants[variant]` (dotted key -> value) to `config` and locks it.

    Config files call this at the end of `get_config(variant=None)`, so variants are a few
    overrides of one base rather than copied files.

    Example:
        >>> from meltemi.levanter.config import base_config
        >>> variants = {"short": {"trainer.num_train_steps": 10}}
        >>> with_variant(base_config(), "short", variants).trainer.num_train_steps
        10
    """
    if variant:
        if variant not in variants:
            best = difflib.get_close_matches(variant, list(variants), n=1)
            hint = f" Did you mean `:{best[0]}`?" if best else ""
            names = ", ".join(sorted(variants)) or "(none)"
            raise ConfigError(f"unknown variant `:{variant}`.{hint} Variants: {names}.")
        apply_overrides(config, variants[variant], how=f":{variant} ")
    config.lock()
    return config


def resolve_path(path: str) -> pathlib.Path:
    """Finds a config file given relative to the user's directory (also under `bazel run`)."""
    candidate = pathlib.Path(path).expanduser()
    if candidate.is_absolute():
        return candidate
    roots = [os.environ.get("BUILD_WORKING_DIRECTORY"), os.getcwd()]
    for root in roots:
        if root and (pathlib.Path(root) / candidate).is_file():
            return (pathlib.Path(root) / candidate).resolve()
    return candidate.resolve()


def split_spec(spec: str) -> tuple[str, str | None]:
    """Splits `path.py[:variant]`.

    Example:
        >>> split_spec("levanter/configs/default.py:smoke")
        ('levanter/configs/default.py', 'smoke')
    """
    path, sep, variant = spec.partition(".py:")
    if sep:
        return path + ".py", variant or None
    return spec, None


def _load_module(path: pathlib.Path):
    if not path.is_file():
        raise ConfigError(
            f"config file {str(path)!r} does not exist; pass `--config=path/to/file.py[:variant]`"
            f" (e.g. `--config=levanter/configs/default.py`)."
        )
    name = "meltemi_config_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ConfigError:
        raise
    except Exception as e:  # the user's code: one line naming the file and line, no traceback
        raise _raised_in(path, e, "while loading the file") from None
    if not hasattr(module, "get_config"):
        raise ConfigError(f"config file {str(path)!r} defines no `get_config(variant=None)`.")
    return module


def _raised_in(path: pathlib.Path, error: Exception, during: str) -> ConfigError:
    """`error`, raised by the code of the config file `path`, as one line: `file:line: ...`."""
    if isinstance(error, SyntaxError) and error.filename and _same_file(error.filename, path):
        line = error.lineno
        what = f"{type(error).__name__}: {error.msg}"
    else:
        frames = [f for f in traceback.extract_tb(error.__traceback__)
                  if _same_file(f.filename, path)]  # fmt: skip
        line = frames[-1].lineno if frames else None
        lines = str(error).strip().splitlines()
        what = type(error).__name__ + (f": {lines[0]}" if lines else "")
    where = f"{path}:{line}" if line else str(path)
    return ConfigError(f"{where}: {what} ({during}); fix the config file there.")


def _same_file(name: str, path: pathlib.Path) -> bool:
    try:
        return os.path.samefile(name, path)
    except OSError:
        return False


def _call(module, variant: str | None, path: pathlib.Path) -> ml_collections.ConfigDict:
    call = f"get_config({variant!r})" if variant else "get_config()"
    try:
        config = module.get_config(variant) if variant else module.get_config()
    except ConfigError:  # with_variant's unknown variant or key: already one line naming it
        raise
    except Exception as e:
        raise _raised_in(path, e, f"in {call}") from None
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(
            f"{path}: get_config() returned {type(config).__name__}; it must return a locked "
            "ml_collections.ConfigDict (end it with "
            "`return with_variant(config, variant, VARIANTS)`)."
        )
    if not config.is_locked:
        raise ConfigError(
            f"{path}: get_config() returned an unlocked ConfigDict; lock it (`config.lock()`) so "
            "that a misspelt key is an error instead of a new field."
        )
    return config


@dataclasses.dataclass(frozen=True)
class ResolvedConfig:
    """A locked config plus where each value came from.

    Attributes:
        config: the locked ConfigDict the trainer reads.
        provenance: dotted key -> one of "default", "file", "variant", "flag".
        spec: the `--config` value (`path.py[:variant]`).
        overrides: the `key=value` command-line overrides, in order.
    """

    config: ml_collections.ConfigDict
    provenance: Mapping[str, str]
    spec: str = ""
    overrides: tuple[str, ...] = ()

    def format(self) -> str:
        """One line per key: `key = value  # provenance`."""
        values = flatten(self.config)
        width = max(len(k) for k in values)
        lines = [f"# config: {self.spec}"]
        for key, value in values.items():
            lines.append(f"{key:<{width}} = {value!r:<24} # {self.provenance.get(key, 'file')}")
        return "\n".join(lines)

    def to_json(self) -> str:
        """The resolved values and their provenance, as saved in run dirs and checkpoints."""
        return json.dumps(
            {
                "spec": self.spec,
                "overrides": list(self.overrides),
                "config": self.config.to_dict(),
                "provenance": dict(self.provenance),
            },
            indent=1,
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> ResolvedConfig:
        """Reads what `to_json` wrote (e.g. a checkpoint's config)."""
        data = json.loads(text)
        config = ml_collections.ConfigDict(_tuples(data["config"]))
        config.lock()
        return cls(config, data["provenance"], data["spec"], tuple(data["overrides"]))


def _tuples(value: Any) -> Any:
    # JSON has no tuples: config sequences are tuples, so lists read back become tuples again.
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def parse_override_args(argv: Sequence[str], flag: str = "config") -> list[tuple[str, str]]:
    """Extracts `--config.a.b=value` (or `--config.a.b value`) pairs from a command line.

    Example:
        >>> parse_override_args(["train", "--config=x.py", "--config.trainer.seed=3"])
        [('trainer.seed', '3')]
    """
    out = []
    prefix = f"--{flag}."
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith(prefix) or arg.startswith(prefix[1:]):
            body = arg.split(".", 1)[1]
            if "=" in body:
                key, value = body.split("=", 1)
            elif i + 1 < len(args):
                key, value = body, args[i + 1]
                i += 1
            else:
                raise ConfigError(f"`{arg}` has no value; write `{arg}=VALUE`.")
            out.append((key, value))
        i += 1
    return out


def load_config(spec: str, overrides: Sequence[tuple[str, str]] = ()) -> ResolvedConfig:
    """Loads `path.py[:variant]`, applies `(dotted key, text)` overrides, records provenance.

    Args:
        spec: a config file path, optionally followed by `:variant`.
        overrides: command-line overrides, e.g. `[("trainer.seed", "3")]`.

    Returns:
        The locked config with the provenance of every value.

    Raises:
        ConfigError: the file is missing or does not define a locked `get_config`.
        UnknownConfigKeyError: an override names no key (the message suggests the closest).
        ConfigTypeError: an override's value does not parse as its field's type.
    """
    path_text, variant = split_spec(spec)
    path = resolve_path(path_text)
    module = _load_module(path)
    defaults = flatten(base_config())
    from_file = flatten(_call(module, None, path))
    config = _call(module, variant, path)
    resolved = flatten(config)
    flagged = {}
    for key, raw in overrides:
        set_value(config, key, raw)
        flagged[key] = raw
    provenance = {}
    for key in flatten(config):
        if key in flagged:
            provenance[key] = "flag"
        elif variant and (key not in from_file or from_file[key] != resolved[key]):
            provenance[key] = "variant"
        elif key not in defaults or defaults[key] != from_file.get(key):
            provenance[key] = "file"
        else:
            provenance[key] = "default"
    return ResolvedConfig(config, provenance, spec, tuple(f"{k}={v}" for k, v in overrides))
