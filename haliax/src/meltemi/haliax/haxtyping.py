"""`haliax.haxtyping`: dtype-and-axes annotations for NamedArray, `f32["batch embed"]`.

`f32[...]`, `i32[...]`, ... pin a dtype, `Float[...]`, `Int[...]`, ... a dtype category; the
argument is an axes spec (`"batch ... embed"`, a tuple, a set) or `(NamedArray, spec)`. For a base
type other than NamedArray they hand over to jaxtyping (`f32[jax.Array, "b e"]`).
`x.matches_axes(annotation)` checks an array at run time.

>>> import jax.numpy as jnp
>>> import meltemi.haliax as hax
>>> x = hax.zeros((hax.Axis("batch", 2), hax.Axis("embed", 3)))
>>> x.matches_axes(f32["batch embed"]), x.matches_axes(Int["batch embed"])
(True, False)
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import jax.numpy as jnp
import jaxtyping

from meltemi.haliax._core import NamedArray
from meltemi.haliax._typing import DTypeCategory, Named, parse_axes_spec

__all__ = [
    "DTypeCategory",
    "Complex",
    "Float",
    "Int",
    "Named",
    "UInt",
    "bf16",
    "bool_",
    "complex64",
    "complex128",
    "f16",
    "f32",
    "f64",
    "i8",
    "i16",
    "i32",
    "i64",
    "u8",
    "u16",
    "u32",
    "u64",
]


def _split(item: Any) -> tuple[Any, Any]:
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], type):
        return item
    return NamedArray, item


class _DTypeAnnotation:
    """`f32[spec]` / `f32[NamedArray, spec]`: `Annotated[NamedArray, axes with dtype]`."""

    def __init__(self, dtype: Any, jaxtyping_name: str):
        self.dtype = dtype
        self._jaxtyping = jaxtyping_name

    def __getitem__(self, item: Any) -> Any:
        base, spec = _split(item)
        if base is not NamedArray:
            return getattr(jaxtyping, self._jaxtyping)[base, spec]
        axes = parse_axes_spec(spec)
        if axes.dtype is None:
            axes = dataclasses.replace(axes, dtype=self.dtype)
        return typing.Annotated[NamedArray, axes]

    def __repr__(self) -> str:
        return f"haxtyping[{self._jaxtyping}]"


def _dtype(dtype: Any, jaxtyping_name: str) -> Any:
    return _DTypeAnnotation(dtype, jaxtyping_name)


def _category(name: str, category: Any, jaxtyping_name: str) -> Any:
    return _DTypeAnnotation(DTypeCategory(name, category), jaxtyping_name)


f16 = _dtype(jnp.float16, "Float16")
f32 = _dtype(jnp.float32, "Float32")
f64 = _dtype(jnp.float64, "Float64")
bf16 = _dtype(jnp.bfloat16, "BFloat16")
i8 = _dtype(jnp.int8, "Int8")
i16 = _dtype(jnp.int16, "Int16")
i32 = _dtype(jnp.int32, "Int32")
i64 = _dtype(jnp.int64, "Int64")
u8 = _dtype(jnp.uint8, "UInt8")
u16 = _dtype(jnp.uint16, "UInt16")
u32 = _dtype(jnp.uint32, "UInt32")
u64 = _dtype(jnp.uint64, "UInt64")
bool_ = _dtype(jnp.bool_, "Bool")
complex64 = _dtype(jnp.complex64, "Complex64")
complex128 = _dtype(jnp.complex128, "Complex128")

Float = _category("float", jnp.floating, "Float")
Complex = _category("complex", jnp.complexfloating, "Complex")
Int = _category("int", jnp.signedinteger, "Int")
UInt = _category("uint", jnp.unsignedinteger, "UInt")
