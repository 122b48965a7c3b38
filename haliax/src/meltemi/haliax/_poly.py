"""Polynomials with a named coefficient axis (`jax.numpy.poly*`).

Coefficients are 1-d, highest degree first (as numpy). The result's coefficient axis keeps the
name of the NamedArray input (resized), or is called `"degree"` when no input is named.

>>> import jax.numpy as jnp
>>> import meltemi.haliax as hax
>>> p = hax.named(jnp.array([1.0, -3.0, 2.0]), "coef")  # x^2 - 3x + 2
>>> hax.polyder(p).array
Array([ 2., -3.], dtype=float32)
>>> hax.polyval(p, hax.named(jnp.array([1.0, 2.0, 3.0]), "x")).array
Array([0., 0., 2.], dtype=float32)
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from meltemi.haliax._core import Axis, AxisError, AxisSelector, NamedArray, axis_name

__all__ = [
    "DEFAULT_POLY_AXIS_NAME",
    "poly",
    "polyadd",
    "polysub",
    "polymul",
    "polydiv",
    "polyint",
    "polyder",
    "polyval",
    "polyfit",
    "roots",
    "trim_zeros",
    "vander",
]

DEFAULT_POLY_AXIS_NAME = "degree"
"""Name of the coefficient axis when no input is a NamedArray."""


def _raw(p: Any) -> Any:
    if isinstance(p, NamedArray):
        if p.ndim != 1:
            raise AxisError(
                f"polynomial coefficients must have one axis, got {p.axes}; select one row first"
            )
        return p.array
    return jnp.asarray(p)


def _out(result: Any, *inputs: Any) -> NamedArray:
    named_ = [p for p in inputs if isinstance(p, NamedArray)]
    name = named_[0].axes[0].name if named_ else DEFAULT_POLY_AXIS_NAME
    return NamedArray(result, (Axis(name, result.shape[0]),))


def poly(seq_of_zeros: Any) -> NamedArray:
    """Coefficients of the monic polynomial with the given roots."""
    return _out(jnp.poly(_raw(seq_of_zeros)), seq_of_zeros)


def polyadd(p1: Any, p2: Any) -> NamedArray:
    """Sum of two polynomials."""
    return _out(jnp.polyadd(_raw(p1), _raw(p2)), p1, p2)


def polysub(p1: Any, p2: Any) -> NamedArray:
    """Difference of two polynomials."""
    return _out(jnp.polysub(_raw(p1), _raw(p2)), p1, p2)


def polymul(p1: Any, p2: Any) -> NamedArray:
    """Product of two polynomials."""
    return _out(jnp.polymul(_raw(p1), _raw(p2)), p1, p2)


def polydiv(p1: Any, p2: Any) -> tuple[NamedArray, NamedArray]:
    """Quotient and remainder of `p1 / p2`."""
    q, r = jnp.polydiv(_raw(p1), _raw(p2))
    return _out(q, p1, p2), _out(r, p1, p2)


def polyint(p: Any, m: int = 1, k: Any = None) -> NamedArray:
    """The `m`-th antiderivative, with integration constants `k`."""
    return _out(jnp.polyint(_raw(p), m=m, k=None if k is None else _raw(k)), p)


def polyder(p: Any, m: int = 1) -> NamedArray:
    """The `m`-th derivative."""
    return _out(jnp.polyder(_raw(p), m=m), p)


def polyval(p: Any, x: Any) -> Any:
    """`p` evaluated at `x`; a NamedArray `x` keeps its axes."""
    out = jnp.polyval(_raw(p), x.array if isinstance(x, NamedArray) else x)
    return NamedArray(out, x.axes) if isinstance(x, NamedArray) else out


def polyfit(
    x: Any,
    y: Any,
    deg: int,
    rcond: Any = None,
    full: bool = False,
    w: Any = None,
    cov: bool = False,
) -> Any:
    """Least-squares fit of a degree-`deg` polynomial to points `(x, y)`.

    Args:
        x: sample positions (1-d, named or not).
        y: sample values, same length as `x`.
        deg: degree of the fitted polynomial (`deg + 1` coefficients).
        rcond: relative cutoff for small singular values (as `jnp.polyfit`).
        full: also return residuals, rank, singular values and rcond.
        w: weights of the samples.
        cov: also return the coefficient covariance, axes `(c, c + "_cov")`.

    Returns:
        The coefficients (highest degree first); with `full` or `cov` a tuple as in numpy.
    """
    result = jnp.polyfit(
        _raw(x), _raw(y), deg, rcond=rcond, full=full, w=None if w is None else _raw(w), cov=cov
    )
    if full:
        return (_out(result[0], x, y), *result[1:])
    if cov:
        coeffs = _out(result[0], x, y)
        c = coeffs.axes[0]
        return coeffs, NamedArray(result[1], (c, c.alias(f"{c.name}_cov")))
    return _out(result, x, y)


def roots(p: Any) -> NamedArray:
    """Roots of the polynomial (complex); axis size `len(p) - 1` after trimming leading zeros."""
    return _out(jnp.roots(_raw(p)), p)


def trim_zeros(f: Any, trim: str = "fb") -> NamedArray:
    """`f` without leading (`"f"`) and/or trailing (`"b"`) zeros (needs concrete values)."""
    return _out(jnp.trim_zeros(_raw(f), trim=trim), f)


def vander(x: NamedArray, degree: AxisSelector) -> NamedArray:
    """Vandermonde matrix `x[i] ** (N - 1 - j)` with axes `(x's axis, degree)`.

    `degree` is an Axis (its size is N) or a name (N is the length of `x`).
    """
    if x.ndim != 1:
        raise AxisError(f"vander needs a 1-d array, got axes {x.axes}")
    deg = degree if isinstance(degree, Axis) else Axis(axis_name(degree), x.axes[0].size)  # type: ignore[arg-type]
    return NamedArray(jnp.vander(x.array, N=deg.size), (x.axes[0], deg))
