"""One definition per config key: a section dataclass field carrying default, help and check.

A section (`TrainerSpec`, `EvalSpec`, ...) is a frozen dataclass. A field made by `key(...)` is
a config key of that section: `base_config()` takes its default from here, `key_reference()`
its help, and `read(...)` runs its check when the config is resolved. A field made by
`derived()` is computed by the section's builder from other keys (e.g. `batch_sizes`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import ml_collections
from ml_collections.config_dict import FieldReference, placeholder

_KEY = "meltemi.config_key"


@dataclasses.dataclass(frozen=True)
class Key:
    """What a key's field says about it.

    Attributes:
        default: the value in `base_config()` (a dict is a sub-section, e.g. `mesh.ici`).
        help: one sentence for the key reference.
        check: called as `check(dotted_key, value)`, returns the checked value; its `wrong`
            attribute is a value it refuses.
        kind: the type of a key whose default is None (a `placeholder`).
        keep: False for a key the builder reads into other fields (not an attribute).
    """

    default: Any
    help: str
    check: Any
    kind: type = object
    keep: bool = True


def key(default: Any, help: str, check: Any, *, kind: type = object, keep: bool = True) -> Any:
    """A section field that is a config key (see `Key` for the arguments).

    Example:
        >>> import dataclasses
        >>> from meltemi.levanter.config._checks import AtLeast
        >>> @dataclasses.dataclass(frozen=True, kw_only=True)
        ... class Section:
        ...     limit: int = key(0, "Documents per task (0: all).", AtLeast(0, example=100))
        >>> base_section(Section).limit
        0
    """
    meta = {_KEY: Key(default, help, check, kind, keep)}
    if not keep:
        return dataclasses.field(init=False, repr=False, compare=False, metadata=meta)
    try:
        hash(default)
    except TypeError:  # a sub-section: the builder always sets the field
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def derived() -> Any:
    """A section field computed by the section's builder, not a config key."""
    return dataclasses.field()


def keys_of(cls: type) -> Iterator[tuple[str, Key]]:
    """The `(field name, Key)` of every key field of a section class, in field order."""
    for field in dataclasses.fields(cls):
        if _KEY in field.metadata:
            yield field.name, field.metadata[_KEY]


def base_section(cls: type) -> ml_collections.ConfigDict:
    """A section's keys with their defaults, typed as overrides parse them.

    Tuples and unions are `FieldReference(field_type=object)` (any Python literal), a None
    default is a `placeholder` of the key's kind, a dict is a nested section.
    """
    section = ml_collections.ConfigDict()
    for name, k in keys_of(cls):
        if isinstance(k.default, dict):
            section[name] = ml_collections.ConfigDict(k.default)
        elif k.default is None:
            section[name] = placeholder(k.kind)
        elif isinstance(k.default, tuple):
            section[name] = FieldReference(k.default, field_type=object)
        else:
            section[name] = k.default
    return section


def read(cls: type, c: ml_collections.ConfigDict, prefix: str) -> dict[str, Any]:
    """Every key of section `cls` in `c`, checked; the ones the section keeps, by field name."""
    values = {}
    for name, k in keys_of(cls):
        value = c[name]
        if isinstance(value, ml_collections.ConfigDict):
            value = value.to_dict()
        value = k.check(prefix + name, value)
        if k.keep:
            values[name] = value
    return values


def _literal(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{a}={v}" for a, v in value.items()) or "{}"
    return repr(value)


def reference_rows(cls: type, prefix: str) -> list[tuple[str, str, str]]:
    """`(dotted key, default, help)` of every key of a section (for `key_reference`)."""
    return [
        (prefix + name + (".*" if isinstance(k.default, dict) else ""), _literal(k.default), k.help)
        for name, k in keys_of(cls)
    ]
