"""`field`: `equinox.field` with optional `axis_names` metadata."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx

__all__ = ["field"]


def field(
    *,
    converter: Callable[[Any], Any] | None = None,
    static: bool = False,
    axis_names: tuple[str, ...] | None = None,
    **kwargs: Any,
) -> Any:
    """A module field (`eqx.field`) that records the names of its array's axes in its metadata.

    >>> import dataclasses
    >>> import equinox as eqx
    >>> import meltemi.haliax as hax
    >>> class M(eqx.Module):
    ...     w: object = hax.field(axis_names=("out", "in"))
    >>> dataclasses.fields(M)[0].metadata["axis_names"]
    ('out', 'in')
    """
    if static and axis_names is not None:
        raise ValueError(
            f"field: axis_names={axis_names!r} describes an array, but static=True fields hold "
            f"no arrays; drop one of the two"
        )
    metadata = dict(kwargs.pop("metadata", {}))
    metadata["axis_names"] = axis_names
    if converter is not None:
        kwargs["converter"] = converter
    return eqx.field(static=static, metadata=metadata, **kwargs)
