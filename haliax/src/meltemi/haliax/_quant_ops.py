"""The `dot_general` ops a `Linear` can use: plain, FP8 (scaled, with amax history), INT8.

Kept below `nn` so `Linear` can default to `DefaultDotGeneralOp`; `hax.quantization` is the
public module.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

import equinox as eqx
import jax
import jax.numpy as jnp

__all__ = [
    "OverwriteWithGradient",
    "DotGeneralOp",
    "DefaultDotGeneralOp",
    "Fp8DotGeneralOp",
    "Int8DotGeneralOp",
]


class OverwriteWithGradient(eqx.Module):
    """Marks state whose "gradient" is its new value (e.g. FP8 scales and amax histories):
    `hax.quantization.apply_updates` replaces it with the gradient instead of adding to it."""


class DotGeneralOp(Protocol):
    """A callable with `jax.lax.dot_general`'s signature."""

    def __call__(
        self,
        lhs: Any,
        rhs: Any,
        dimension_numbers: Any,
        precision: Any = None,
        preferred_element_type: Any = None,
        **kwargs: Any,
    ) -> jax.Array:
        """Computes the contraction.

        Args:
            lhs: left operand.
            rhs: right operand.
            dimension_numbers: as `jax.lax.dot_general`.
            precision: as `jax.lax.dot_general`.
            preferred_element_type: as `jax.lax.dot_general`.
            **kwargs: passed on.
        """
        ...

    @staticmethod
    def default() -> DefaultDotGeneralOp:
        return DefaultDotGeneralOp.init()


class DefaultDotGeneralOp(eqx.Module):
    """`jax.lax.dot_general` as a module (so a model holds no bare functions)."""

    def __call__(
        self,
        lhs: Any,
        rhs: Any,
        dimension_numbers: Any,
        precision: Any = None,
        preferred_element_type: Any = None,
        **kwargs: Any,
    ) -> jax.Array:
        """

        Args:
            lhs: left operand.
            rhs: right operand.
            dimension_numbers: as `jax.lax.dot_general`.
            precision: as `jax.lax.dot_general`.
            preferred_element_type: as `jax.lax.dot_general`.
            **kwargs: passed on.
        """
        return jax.lax.dot_general(
            lhs, rhs, dimension_numbers, precision, preferred_element_type, **kwargs
        )

    @staticmethod
    def init() -> DefaultDotGeneralOp:
        return _DEFAULT


_DEFAULT = DefaultDotGeneralOp()


# --- FP8: delayed scaling (Micikevicius et al. 2022, "FP8 formats for deep learning") ---------
def _fp8_max(dtype: Any) -> jax.Array:
    return jnp.asarray(jnp.finfo(dtype).max, jnp.float32)


def compute_scale(amax: Any, scale: Any, fp8_max: Any, margin: int = 0) -> jax.Array:
    """The delayed-scaling FP8 scale `amax * 2**margin / fp8_max` (the old `scale` where `amax`
    is 0 or not finite), as Transformer Engine's `update_fp8_metas` computes it.

    >>> float(compute_scale(jnp.float32(448.0), jnp.float32(1.0), 448.0)), float(
    ...     compute_scale(jnp.float32(0.0), jnp.float32(3.0), 448.0))
    (1.0, 3.0)
    """
    new = amax * (2.0**margin) / fp8_max
    return jnp.where((amax > 0.0) & jnp.isfinite(amax), new, scale)


def _new_scale(amax_history: jax.Array, scale: jax.Array, fp8_dtype: Any) -> jax.Array:
    """`amax / fp8_max` from the largest |x| seen recently (keep the old scale if that is 0)."""
    return compute_scale(jnp.max(amax_history, axis=0), scale, _fp8_max(fp8_dtype))


def _qdq(x: jax.Array, fp8_dtype: Any, scale: jax.Array, compute_dtype: Any) -> jax.Array:
    """Round `x / scale` to FP8 (saturating) and scale back: what an FP8 matmul would see."""
    m = _fp8_max(fp8_dtype).astype(compute_dtype)
    s = scale.astype(compute_dtype)
    q = jnp.clip(x.astype(compute_dtype) / s, -m, m).astype(fp8_dtype)
    return q.astype(x.dtype) * scale.astype(x.dtype)


def _roll_history(x: jax.Array, history: jax.Array) -> jax.Array:
    amax = jnp.max(jnp.abs(x)).astype(history.dtype)
    return jnp.roll(history, -1).at[0].set(amax)


def _qdq_and_state(x, fp8_dtype, scale, history, compute_dtype):
    new_scale = _new_scale(history, scale, fp8_dtype)
    return _qdq(x, fp8_dtype, new_scale, compute_dtype), new_scale, _roll_history(x, history)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def in_qdq(compute_dtype: Any, x: jax.Array, scale: jax.Array, history: jax.Array) -> jax.Array:
    """Forward: quantize an input to e4m3. Backward: the "gradients" of `scale`/`history` are
    their updated values (so `apply_updates` can overwrite them).

    Args:
        compute_dtype: dtype of the emulated arithmetic.
        x: input.
        scale: current scale.
        history: amax history.
    """
    return _qdq_and_state(x, jnp.float8_e4m3fn, scale, history, compute_dtype)[0]


def _in_fwd(compute_dtype, x, scale, history):
    q, new_scale, new_history = _qdq_and_state(x, jnp.float8_e4m3fn, scale, history, compute_dtype)
    return q, (new_scale, new_history)


def _in_bwd(compute_dtype, res, g):
    return (g, *res)


in_qdq.defvjp(_in_fwd, _in_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def out_qdq(compute_dtype: Any, y: jax.Array, scale: jax.Array, history: jax.Array) -> jax.Array:
    """Identity forward; quantizes the incoming gradient to e5m2 on the way back.

    Args:
        compute_dtype: dtype of the emulated arithmetic.
        y: matmul output.
        scale: current gradient scale.
        history: gradient amax history.
    """
    return y


def _out_fwd(compute_dtype, y, scale, history):
    return y, (scale, history)


def _out_bwd(compute_dtype, res, g):
    scale, history = res
    return _qdq_and_state(g, jnp.float8_e5m2, scale, history, compute_dtype)


out_qdq.defvjp(_out_fwd, _out_bwd)


class Fp8DotGeneralOp(OverwriteWithGradient):
    """FP8 matmul by quantize-dequantize (e4m3 inputs, e5m2 output gradients) with delayed
    per-tensor scaling from an amax history. The arithmetic is emulated in `compute_dtype`, so it
    runs (and is tested) on the CPU; on FP8 hardware XLA fuses it into FP8 matmuls."""

    input_scale: jax.Array
    output_grad_scale: jax.Array
    kernel_scale: jax.Array
    input_amax_history: jax.Array
    output_grad_amax_history: jax.Array
    kernel_amax_history: jax.Array
    compute_dtype: Any = eqx.field(static=True, default=None)

    @classmethod
    def init(cls, amax_history_length: int = 1024, compute_dtype: Any = None) -> Fp8DotGeneralOp:
        def ones():
            return jnp.ones(1, jnp.float32)

        def hist():
            return jnp.zeros(amax_history_length, jnp.float32)

        return cls(ones(), ones(), ones(), hist(), hist(), hist(), compute_dtype)

    def __call__(
        self,
        lhs: Any,
        rhs: Any,
        dimension_numbers: Any,
        precision: Any = None,
        preferred_element_type: Any = None,
        **kwargs: Any,
    ) -> jax.Array:
        """

        Args:
            lhs: left operand (cast to the compute dtype).
            rhs: right operand (the kernel).
            dimension_numbers: as `jax.lax.dot_general`.
            precision: ignored (the emulation uses the default).
            preferred_element_type: ignored.
            **kwargs: passed to `jax.lax.dot_general`.
        """
        dtype = rhs.dtype if self.compute_dtype is None else self.compute_dtype
        x = in_qdq(dtype, jnp.asarray(lhs, dtype), self.input_scale, self.input_amax_history)
        k = in_qdq(dtype, rhs, self.kernel_scale, self.kernel_amax_history)
        y = jax.lax.dot_general(x, k, dimension_numbers, preferred_element_type=None, **kwargs)
        return out_qdq(dtype, y, self.output_grad_scale, self.output_grad_amax_history)


# --- INT8: symmetric per-tensor quantization, straight-through gradients ----------------------
def _int8(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    scale = jnp.maximum(jnp.max(jnp.abs(x)), 1e-30) / 127.0
    return jnp.clip(jnp.round(x / scale), -127, 127).astype(jnp.int8), scale


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _int8_dot(lhs: jax.Array, rhs: jax.Array, dimension_numbers: Any) -> jax.Array:
    ql, sl = _int8(lhs)
    qr, sr = _int8(rhs)
    acc = jax.lax.dot_general(ql, qr, dimension_numbers, preferred_element_type=jnp.int32)
    return (acc.astype(jnp.float32) * (sl * sr)).astype(jnp.result_type(lhs, rhs))


def _int8_fwd(lhs, rhs, dimension_numbers):
    return _int8_dot(lhs, rhs, dimension_numbers), (lhs, rhs)


def _int8_bwd(dimension_numbers, res, g):
    lhs, rhs = res
    _, vjp = jax.vjp(lambda a, b: jax.lax.dot_general(a, b, dimension_numbers), lhs, rhs)
    return vjp(g)


_int8_dot.defvjp(_int8_fwd, _int8_bwd)


class Int8DotGeneralOp(OverwriteWithGradient):
    """INT8 matmul: per-tensor symmetric int8 inputs, int32 accumulation, float gradients
    (straight-through). A pure-JAX reference for Haliax's AQT-based op (see the README)."""

    @classmethod
    def init(cls) -> Int8DotGeneralOp:
        return cls()

    def __call__(
        self,
        lhs: Any,
        rhs: Any,
        dimension_numbers: Any,
        precision: Any = None,
        preferred_element_type: Any = None,
        **kwargs: Any,
    ) -> jax.Array:
        """

        Args:
            lhs: left operand.
            rhs: right operand.
            dimension_numbers: as `jax.lax.dot_general`.
            precision: ignored (int8 arithmetic is exact).
            preferred_element_type: ignored (int32 accumulation).
            **kwargs: ignored.
        """
        return _int8_dot(lhs, rhs, dimension_numbers)
