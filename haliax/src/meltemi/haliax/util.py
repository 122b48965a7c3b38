"""Small helpers Haliax code imports from `haliax.util`.

>>> from meltemi.haliax.util import ensure_tuple, maybe_untuple
>>> ensure_tuple("a"), maybe_untuple(("a",))
(('a',), 'a')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import jax

from meltemi.haliax._core import NamedArray, is_named_array

__all__ = ["is_named_array", "ensure_tuple", "maybe_untuple", "is_jax_or_hax_array_like"]

T = TypeVar("T")


def ensure_tuple(x: Sequence[T] | T) -> tuple[T, ...]:
    """`x` as a tuple: strings and non-sequences become 1-tuples."""
    if isinstance(x, str) or not isinstance(x, Sequence):
        return (x,)  # type: ignore[return-value]
    return tuple(x)


def maybe_untuple(x: Sequence[T] | T) -> T | Sequence[T]:
    """The element of a 1-tuple (or list), else `x` itself."""
    if isinstance(x, tuple | list) and len(x) == 1:
        return x[0]
    return x


def is_jax_or_hax_array_like(x: Any) -> bool:
    """Whether `x` is a jax array, a NamedArray, or anything with a shape and dtype."""
    return isinstance(x, NamedArray | jax.Array) or (hasattr(x, "shape") and hasattr(x, "dtype"))
