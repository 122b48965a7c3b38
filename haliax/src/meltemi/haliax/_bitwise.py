"""Bitwise ops on named arrays: elementwise (aligned by name), counts, shifts, pack/unpack.

>>> import jax.numpy as jnp
>>> import meltemi.haliax as hax
>>> x = hax.named(jnp.array([1, 2, 3], dtype=jnp.uint8), "b")
>>> hax.bitwise_left_shift(x, 2).array
Array([ 4,  8, 12], dtype=uint8)
>>> hax.packbits(x > 1, "b").shape
{'b': 1}
"""

from __future__ import annotations

import jax.numpy as jnp

from meltemi.haliax._core import AxisSelector, NamedArray
from meltemi.haliax._ops import _wrap_binary, _wrap_unary

__all__ = [
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "bitwise_not",
    "bitwise_invert",
    "invert",
    "bitwise_count",
    "left_shift",
    "right_shift",
    "bitwise_left_shift",
    "bitwise_right_shift",
    "packbits",
    "unpackbits",
]

bitwise_and = _wrap_binary(jnp.bitwise_and)
bitwise_or = _wrap_binary(jnp.bitwise_or)
bitwise_xor = _wrap_binary(jnp.bitwise_xor)
bitwise_not = _wrap_unary(jnp.bitwise_not)
bitwise_invert = _wrap_unary(jnp.bitwise_invert)
invert = _wrap_unary(jnp.invert)
bitwise_count = _wrap_unary(jnp.bitwise_count)
left_shift = _wrap_binary(jnp.left_shift)
right_shift = _wrap_binary(jnp.right_shift)
bitwise_left_shift = _wrap_binary(jnp.bitwise_left_shift)
bitwise_right_shift = _wrap_binary(jnp.bitwise_right_shift)


def packbits(a: NamedArray, axis: AxisSelector, *, bitorder: str = "big") -> NamedArray:
    """Packs the bits along `axis` into uint8; the axis keeps its name, size `ceil(n / 8)`."""
    i = a.axis_index(axis)
    out = jnp.packbits(a.array, axis=i, bitorder=bitorder)
    new = a.axes[i].resize((a.axes[i].size + 7) // 8)
    return NamedArray(out, a.axes[:i] + (new,) + a.axes[i + 1 :])


def unpackbits(
    a: NamedArray, axis: AxisSelector, *, count: int | None = None, bitorder: str = "big"
) -> NamedArray:
    """Unpacks uint8 along `axis` into bits; the axis keeps its name, size `8 n` (or `count`).

    Args:
        a: uint8 array.
        axis: the axis to unpack along.
        count: keep this many bits along the axis (default all, `8 n`).
        bitorder: `"big"` or `"little"`.
    """
    i = a.axis_index(axis)
    out = jnp.unpackbits(a.array, axis=i, count=count, bitorder=bitorder)
    new = a.axes[i].resize(out.shape[i])
    return NamedArray(out, a.axes[:i] + (new,) + a.axes[i + 1 :])
