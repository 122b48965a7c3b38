"""Installs operators and convenience methods on NamedArray.

`_core` sits at the bottom of the import graph; the methods that call into the op modules are
attached here (imported once by `meltemi.haliax`), so no module needs a function-local import.
"""

from __future__ import annotations

import jax.numpy as jnp

from meltemi.haliax import _dot, _indexing, _ops, _reductions
from meltemi.haliax._core import NamedArray, _raw_operands

__all__: list[str] = []


def _binop(fn, reflected=False):
    def method(self, other):
        a, b = (other, self) if reflected else (self, other)
        axes, (ra, rb) = _raw_operands(a, b)
        return NamedArray(fn(ra, rb), axes)

    return method


_BINARY = {
    "add": jnp.add,
    "sub": jnp.subtract,
    "mul": jnp.multiply,
    "truediv": jnp.true_divide,
    "floordiv": jnp.floor_divide,
    "mod": jnp.mod,
    "pow": jnp.power,
    "and": jnp.logical_and,
    "or": jnp.logical_or,
    "xor": jnp.logical_xor,
    "lshift": jnp.left_shift,
    "rshift": jnp.right_shift,
    "matmul": None,
}
for _n, _f in _BINARY.items():
    if _f is None:
        continue
    setattr(NamedArray, f"__{_n}__", _binop(_f))
    setattr(NamedArray, f"__r{_n}__", _binop(_f, reflected=True))


def _bool_binop(fn):
    def method(self, other):
        if self.dtype == jnp.bool_ or getattr(other, "dtype", None) == jnp.bool_:
            return _binop(fn)(self, other)
        return _binop(
            {jnp.logical_and: jnp.bitwise_and, jnp.logical_or: jnp.bitwise_or}.get(
                fn, jnp.bitwise_xor
            )
        )(self, other)

    return method


NamedArray.__and__ = _bool_binop(jnp.logical_and)
NamedArray.__or__ = _bool_binop(jnp.logical_or)
NamedArray.__xor__ = _bool_binop(jnp.logical_xor)
NamedArray.__rand__ = NamedArray.__and__
NamedArray.__ror__ = NamedArray.__or__
NamedArray.__eq__ = _binop(jnp.equal)  # type: ignore[assignment]
NamedArray.__ne__ = _binop(jnp.not_equal)  # type: ignore[assignment]
NamedArray.__lt__ = _binop(jnp.less)
NamedArray.__le__ = _binop(jnp.less_equal)
NamedArray.__gt__ = _binop(jnp.greater)
NamedArray.__ge__ = _binop(jnp.greater_equal)
NamedArray.__hash__ = None  # type: ignore[assignment]
NamedArray.__neg__ = lambda self: NamedArray(-self.array, self.axes)
NamedArray.__pos__ = lambda self: self
NamedArray.__abs__ = lambda self: NamedArray(jnp.abs(self.array), self.axes)
NamedArray.__invert__ = lambda self: NamedArray(jnp.invert(self.array), self.axes)

NamedArray.__getitem__ = lambda self, idx: _indexing.index(self, idx)
NamedArray.at = property(lambda self: _indexing._AtHelper(self))  # type: ignore[attr-defined]
NamedArray.take = lambda self, axis, index: _indexing.take(self, axis, index)
NamedArray.slice = lambda self, *a, **k: _indexing.slice(self, *a, **k)
NamedArray.updated_slice = lambda self, start, update: _indexing.updated_slice(self, start, update)

for _name in ("sum", "mean", "max", "min", "prod", "std", "var", "any", "all", "logsumexp"):
    setattr(NamedArray, _name, getattr(_reductions, _name))
NamedArray.argmax = _reductions.argmax
NamedArray.argmin = _reductions.argmin
NamedArray.dot = lambda self, *others, axis, **kw: _dot.dot(self, *others, axis=axis, **kw)
NamedArray.clip = _ops.clip
NamedArray.round = _ops.round  # type: ignore[attr-defined]
NamedArray.cumsum = _ops.cumsum
NamedArray.sort = _ops.sort
NamedArray.argsort = _ops.argsort
NamedArray.roll = lambda self, shift, axis: _ops.roll(self, shift, axis)
NamedArray.unbind = _ops.unbind
for _name in ("exp", "log", "sqrt", "tanh", "sin", "cos", "square"):
    setattr(NamedArray, _name, getattr(_ops, _name))
NamedArray.real = property(lambda self: NamedArray(jnp.real(self.array), self.axes))
NamedArray.imag = property(lambda self: NamedArray(jnp.imag(self.array), self.axes))
