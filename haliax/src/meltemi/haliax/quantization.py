"""Quantized matmuls for `Linear` layers: FP8 (delayed scaling) and INT8, pure JAX.

`quantize_linear_layers(model, QuantizationConfig(fp8=True))` gives every (matching) `Linear` a
quantized `dot_general`. FP8 keeps scales and amax histories as arrays in the model; their
"gradients" are their new values, so a training step splits them off and writes them back:

    grads = jax.grad(loss_fn)(model)
    overwrites, grads = partition_for_grad_overwrite(grads)
    updates, opt_state = optimizer.update(grads, opt_state, model)
    model = apply_updates(model, updates, overwrites)

>>> import jax
>>> import meltemi.haliax as hax
>>> from meltemi.haliax import quantization as hq
>>> lin = hax.nn.Linear.init(hax.Axis("in", 3), hax.Axis("out", 5), key=jax.random.key(0))
>>> type(hq.quantize_linear_layers(lin, hq.QuantizationConfig(fp8=True)).dot_general).__name__
'Fp8DotGeneralOp'
"""

from __future__ import annotations

import dataclasses
import functools
import re
import warnings
from typing import Any, TypeVar

import equinox as eqx
import jax
from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey

from meltemi.haliax._core import Axis, NamedArray
from meltemi.haliax._hof import vmap
from meltemi.haliax._quant_ops import (
    DefaultDotGeneralOp,
    DotGeneralOp,
    Fp8DotGeneralOp,
    Int8DotGeneralOp,
    OverwriteWithGradient,
)
from meltemi.haliax.nn._linear import Linear
from meltemi.haliax.nn._scan import Stacked

__all__ = [
    "OverwriteWithGradient",
    "DotGeneralOp",
    "DefaultDotGeneralOp",
    "Fp8DotGeneralOp",
    "Int8DotGeneralOp",
    "QuantizationConfig",
    "quantize_linear_layers",
    "partition_for_grad_overwrite",
    "apply_updates",
]

T = TypeVar("T")


def partition_for_grad_overwrite(grad: T) -> tuple[T, T]:
    """`(overwrites, grads)`: the OverwriteWithGradient parts of `grad` and the rest."""
    return eqx.partition(
        grad,
        lambda v: isinstance(v, OverwriteWithGradient),
        is_leaf=lambda v: isinstance(v, OverwriteWithGradient | NamedArray),
    )


def apply_updates(tree: T, updates: Any, overwrites: Any) -> T:
    """`overwrite` where given, else `tree + update` (`eqx.apply_updates`), leaf by leaf."""

    def one(x, update, overwrite):
        if overwrite is not None:
            return overwrite
        return x if update is None else eqx.apply_updates(x, update)

    def is_leaf(x):
        return x is None or isinstance(x, OverwriteWithGradient | NamedArray)

    return jax.tree.map(one, tree, updates, overwrites, is_leaf=is_leaf)


@dataclasses.dataclass(frozen=True)
class QuantizationConfig:
    """Which Linear layers to quantize, and how.

    `targets`: None (all), a list of attribute names (`["q_proj", "up"]`, matched against the
    layer's last path element), or a regex matched against the dotted path (`"layers.*mlp"`).
    """

    targets: list[str] | str | None = None
    amax_history_length: int = 1024
    compute_dtype: Any = None
    fp8: bool = False
    int8: bool = False

    def __post_init__(self):
        if self.fp8 and self.int8:
            raise ValueError("QuantizationConfig: choose fp8=True or int8=True, not both")


def _key_str(path: tuple) -> str:
    parts = []
    for k in path:
        if isinstance(k, GetAttrKey):
            parts.append(k.name)
        elif isinstance(k, DictKey):
            parts.append(str(k.key))
        elif isinstance(k, SequenceKey | FlattenedIndexKey):
            parts.append(str(k.idx if isinstance(k, SequenceKey) else k.key))
        else:
            parts.append(str(k))
    return ".".join(parts)


def _matches(path: tuple, config: QuantizationConfig) -> bool:
    if config.targets is None:
        return True
    if isinstance(config.targets, list):
        return bool(path) and _key_str(path[-1:]) in config.targets
    return re.match(config.targets, _key_str(path)) is not None


def quantize_linear_layers(tree: T, config: QuantizationConfig) -> T:
    """`tree` with each matching `Linear` given an FP8 or INT8 `dot_general`.

    Inside `Stacked`, the op's state gets the layer axis (one scale per layer).
    """
    if config.fp8:
        make = functools.partial(
            Fp8DotGeneralOp.init, config.amax_history_length, config.compute_dtype
        )
    elif config.int8:
        make = Int8DotGeneralOp.init
    else:
        warnings.warn(
            "quantize_linear_layers: fp8 and int8 are both False; nothing to do", stacklevel=2
        )
        return tree

    def special(m):
        return isinstance(m, Linear | Stacked)

    def visit(prefix: tuple, layers: tuple[Axis, ...], path: tuple, m: Any) -> Any:
        path = prefix + path
        if isinstance(m, Stacked):
            inner = jax.tree_util.tree_map_with_path(
                functools.partial(visit, path + (GetAttrKey("stacked"),), layers + (m.Block,)),
                m.stacked,
                is_leaf=special,
            )
            return dataclasses.replace(m, stacked=inner)
        if isinstance(m, Linear) and _matches(path, config):
            ctor = make
            for ax in reversed(layers):
                ctor = vmap(ctor, ax)
            return dataclasses.replace(m, dot_general=ctor())
        return m

    return jax.tree_util.tree_map_with_path(lambda p, m: visit((), (), p, m), tree, is_leaf=special)
