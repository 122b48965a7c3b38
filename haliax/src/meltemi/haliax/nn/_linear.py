"""`Linear` and `Embedding`: weights with named axes, contracted by name.

>>> import jax
>>> import meltemi.haliax as hax
>>> Batch, In, Out = hax.Axis("batch", 3), hax.Axis("in", 5), hax.Axis("out", 7)
>>> layer = hax.nn.Linear.init(In, Out, key=jax.random.key(0))
>>> layer(hax.ones((Batch, In))).axes
(Axis(name='batch', size=3), Axis(name='out', size=7))
"""

from __future__ import annotations

import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from meltemi.haliax import random as hrandom
from meltemi.haliax._core import (
    Axis,
    AxisError,
    AxisSpec,
    NamedArray,
    _as_tuple,
    axis_size,
    concat_axes,
)
from meltemi.haliax._indexing import take
from meltemi.haliax._ops import zeros

__all__ = ["Linear", "Embedding"]


class Linear(eqx.Module):
    """`y = x . weight + bias`, contracting the input axes `In` by name.

    `In` and `Out` are each an Axis or a tuple of Axes. With `out_first=True` (the default, and
    PyTorch's layout) the weight's axes are `Out + In`.
    """

    weight: NamedArray
    bias: NamedArray | None
    In: AxisSpec = eqx.field(static=True)
    Out: AxisSpec = eqx.field(static=True)

    @staticmethod
    def init(
        In: AxisSpec,  # noqa: N803
        Out: AxisSpec,  # noqa: N803
        *,
        key: jax.Array,
        use_bias: bool = True,
        out_first: bool = True,
        init_scale: float = 1.0,
        dtype: Any = jnp.float32,
    ) -> Linear:
        """Truncated-normal weights with std `init_scale / sqrt(size(In))`; zero bias."""
        joint = concat_axes(Out, In) if out_first else concat_axes(In, Out)
        scale = init_scale / math.sqrt(axis_size(In))
        weight = hrandom.truncated_normal(key, joint, -3, 3, dtype) * scale
        bias = zeros(Out, dtype) if use_bias else None
        return Linear(weight, bias, In, Out)

    @property
    def out_first(self) -> bool:
        return self.weight.axes[0].name == _as_tuple(self.Out)[0].name  # type: ignore[union-attr]

    @jax.named_scope("linear")
    def __call__(self, inputs: NamedArray, *, key: jax.Array | None = None) -> NamedArray:
        for ax in _as_tuple(self.In):
            if not inputs.has_axis(ax.name):  # type: ignore[union-attr]
                raise AxisError(
                    f"Linear expects input axes {[a.name for a in _as_tuple(self.In)]} "  # type: ignore
                    f"but the input has axes {[a.name for a in inputs.axes]}; rename the input "
                    f"(x.rename({{...}})) or build the layer with the right In"
                )
        out = inputs.dot(self.weight, axis=self.In)
        if self.bias is not None:
            out = out + self.bias
        return out


class Embedding(eqx.Module):
    """A `(Vocab, Embed)` table: `embed(ids)` gathers rows, `unembed(x)` gives logits.

    >>> import jax
    >>> import meltemi.haliax as hax
    >>> Vocab, Embed, Pos = hax.Axis("vocab", 11), hax.Axis("embed", 4), hax.Axis("pos", 3)
    >>> emb = hax.nn.Embedding.init(Vocab, Embed, key=jax.random.key(0))
    >>> x = emb.embed(hax.arange(Pos))
    >>> x.shape, emb.unembed(x).shape
    ({'pos': 3, 'embed': 4}, {'pos': 3, 'vocab': 11})
    """

    weight: NamedArray
    Vocab: Axis = eqx.field(static=True)
    Embed: AxisSpec = eqx.field(static=True)

    @staticmethod
    def init(
        Vocab: Axis,  # noqa: N803
        Embed: AxisSpec,  # noqa: N803
        *,
        key: jax.Array,
        init_scale: float = 1.0,
        initializer_range: float | None = None,
        dtype: Any = jnp.float32,
    ) -> Embedding:
        """Normal weights with std `initializer_range` or else `init_scale / sqrt(size(Embed))`."""
        std = (
            initializer_range
            if initializer_range is not None
            else init_scale / math.sqrt(axis_size(Embed))
        )
        weight = hrandom.normal(key, concat_axes(Vocab, Embed), dtype) * std
        return Embedding(weight, Vocab, Embed)

    def embed(self, input_ids: NamedArray) -> NamedArray:
        """Rows of the table for integer ids: the result has the ids' axes plus `Embed`."""
        return take(self.weight, self.Vocab, input_ids)

    def __call__(self, input_ids: NamedArray, *, key: jax.Array | None = None) -> NamedArray:
        return self.embed(input_ids)

    def unembed(self, input_embeds: NamedArray) -> NamedArray:
        """Logits over `Vocab`: `input_embeds . weight` contracting `Embed` (tied output head)."""
        return input_embeds.dot(self.weight, axis=self.Embed)
