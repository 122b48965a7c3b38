"""`Linear` and `Embedding`: weights with named axes, contracted by name.

>>> import jax
>>> import meltemi.haliax as hax
>>> Batch, In, Out = hax.Axis("batch", 3), hax.Axis("in", 5), hax.Axis("out", 7)
>>> layer = hax.nn.Linear.init(In, Out, key=jax.random.key(0))
>>> layer(hax.ones((Batch, In))).axes
(Axis(name='batch', size=3), Axis(name='out', size=7))
"""

from __future__ import annotations

import dataclasses
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
    flatten_axes,
    unflatten_axis,
)
from meltemi.haliax._indexing import take
from meltemi.haliax._ops import zeros
from meltemi.haliax._quant_ops import DefaultDotGeneralOp, DotGeneralOp
from meltemi.haliax.nn.mup import (
    AbstractLinearReparam,
    HiddenLinearMup,
    InputLinearMup,
    LinearStandardParam,
    OutputLinearMup,
)

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
    dot_general: DotGeneralOp = eqx.field(default_factory=DefaultDotGeneralOp.init)
    _reparam_cls: type[AbstractLinearReparam] = eqx.field(static=True, default=LinearStandardParam)

    @property
    def reparam(self) -> AbstractLinearReparam:
        """The layer's abc-parameterisation (`hax.nn.mup`)."""
        return self._reparam_cls(self.In, self.Out)

    @staticmethod
    def input_reparam(use_mup: bool = True) -> type[AbstractLinearReparam]:
        """muP's input-layer parameterisation (or the standard one)."""
        return InputLinearMup if use_mup else LinearStandardParam

    @staticmethod
    def hidden_reparam(use_mup: bool = True) -> type[AbstractLinearReparam]:
        """muP's hidden-layer parameterisation (or the standard one)."""
        return HiddenLinearMup if use_mup else LinearStandardParam

    @staticmethod
    def output_reparam(use_mup: bool = True) -> type[AbstractLinearReparam]:
        """muP's output-layer parameterisation (or the standard one)."""
        return OutputLinearMup if use_mup else LinearStandardParam

    @staticmethod
    def init(
        In: AxisSpec,
        Out: AxisSpec,
        *,
        key: jax.Array,
        use_bias: bool = True,
        out_first: bool = True,
        init_scale: float = 1.0,
        dtype: Any = jnp.float32,
        dot_general: DotGeneralOp | None = None,
        reparam_cls: type[AbstractLinearReparam] = LinearStandardParam,
    ) -> Linear:
        """Truncated-normal weights with std `init_scale / sqrt(size(In))`; zero bias.

        Args:
            In: input axis (or axes), contracted by name.
            Out: output axis (or axes).
            key: PRNG key.
            use_bias: add a bias over `Out`.
            out_first: weight axes `Out + In` (PyTorch's layout) rather than `In + Out`.
            init_scale: scales the init std.
            dtype: parameter dtype.
            dot_general: the matmul (default `jax.lax.dot_general`; see `hax.quantization`).
            reparam_cls: the abc-parameterisation (`hax.nn.mup`); its `init_scale(In, Out)`
                replaces the default `1 / sqrt(size(In))`.

        Returns:
            The layer.
        """
        joint = concat_axes(Out, In) if out_first else concat_axes(In, Out)
        scale = init_scale * reparam_cls.init_scale(In, Out)
        weight = hrandom.truncated_normal(key, joint, -3, 3, dtype) * scale
        bias = zeros(Out, dtype) if use_bias else None
        dg = DefaultDotGeneralOp.init() if dot_general is None else dot_general
        return Linear(weight, bias, In, Out, dg, reparam_cls)

    @property
    def out_first(self) -> bool:
        return self.weight.axes[0].name == _as_tuple(self.Out)[0].name  # type: ignore[union-attr]

    def flatten_for_export(self) -> Linear:
        """This layer with `In` and `Out` each flattened into one axis (`__IN__`, `__OUT__`), the
        2-D layout of a PyTorch checkpoint; a layer with single axes is returned as is."""
        if isinstance(self.In, Axis) and isinstance(self.Out, Axis):
            return self
        ins, outs = _as_tuple(self.In), _as_tuple(self.Out)
        new_in = Axis("__IN__", math.prod(a.size for a in ins))
        new_out = Axis("__OUT__", math.prod(a.size for a in outs))
        order = ("__OUT__", "__IN__") if self.out_first else ("__IN__", "__OUT__")
        weight = flatten_axes(flatten_axes(self.weight, outs, new_out), ins, new_in)
        weight = weight.rearrange((..., *order))
        bias = None if self.bias is None else flatten_axes(self.bias, outs, new_out)
        return dataclasses.replace(self, weight=weight, bias=bias, In=new_in, Out=new_out)

    def unflatten_from_export(self, template: Linear) -> Linear:
        """The inverse of `flatten_for_export`, with `template`'s axes and layout."""
        if (template.In, template.Out) == (self.In, self.Out):
            return self
        weight = unflatten_axis(self.weight, "__OUT__", template.Out)
        weight = unflatten_axis(weight, "__IN__", template.In)
        weight = weight.rearrange([a.name for a in template.weight.axes])
        bias = None
        if self.bias is not None and template.bias is not None:
            bias = unflatten_axis(self.bias, "__OUT__", template.Out)
            bias = bias.rearrange([a.name for a in template.bias.axes])
        return dataclasses.replace(template, weight=weight, bias=bias)

    @jax.named_scope("linear")
    def __call__(self, inputs: NamedArray, *, key: jax.Array | None = None) -> NamedArray:
        for ax in _as_tuple(self.In):
            if not inputs.has_axis(ax.name):  # type: ignore[union-attr]
                raise AxisError(
                    f"Linear expects input axes {[a.name for a in _as_tuple(self.In)]} "  # type: ignore
                    f"but the input has axes {[a.name for a in inputs.axes]}; rename the input "
                    f"(x.rename({{...}})) or build the layer with the right In"
                )
        dg = None if isinstance(self.dot_general, DefaultDotGeneralOp) else self.dot_general
        active = self.reparam.active_scale
        weight = self.weight if active == 1 else self.weight * active
        out = inputs.dot(weight, axis=self.In, dot_general=dg)
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
        Vocab: Axis,
        Embed: AxisSpec,
        *,
        key: jax.Array,
        init_scale: float = 1.0,
        initializer_range: float | None = None,
        dtype: Any = jnp.float32,
    ) -> Embedding:
        """Normal weights with std `initializer_range` or else `init_scale / sqrt(size(Embed))`.

        Args:
            Vocab: the vocabulary axis.
            Embed: the embedding axis (or axes).
            key: PRNG key.
            init_scale: std is `init_scale / sqrt(size(Embed))`.
            initializer_range: if given, the std itself (as Hugging Face configs).
            dtype: parameter dtype.
        """
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
