"""abc-parameterisations (Yang & Hu 2021, arXiv:2011.14522): muP for `Linear` and `Embedding`.

A reparameterisation fixes three multipliers of a layer: the init scale (b), the learning-rate
scale (c) and a constant the activations are multiplied by (a). `Linear.init(...,
reparam_cls=HiddenLinearMup)` uses one; `layer.reparam.lr_scale` tells an optimizer the
per-layer learning-rate multiplier.

>>> import meltemi.haliax as hax
>>> from meltemi.haliax.nn import mup
>>> In, Out = hax.Axis("embed", 64), hax.Axis("mlp", 256)
>>> mup.HiddenLinearMup(In, Out).lr_scale, mup.OutputLinearMup(In, Out).active_scale
(0.015625, 0.015625)
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any

from meltemi.haliax._core import AxisSpec, axis_size

__all__ = [
    "AbstractReparam",
    "AbstractLinearReparam",
    "LinearStandardParam",
    "InputLinearMup",
    "HiddenLinearMup",
    "OutputLinearMup",
    "AbstractEmbeddingReparam",
    "EmbeddingStandardParam",
    "EmbeddingMup",
    "ReparamEnabled",
]


class AbstractReparam(abc.ABC):
    """Init scale, learning-rate scale and activation scale of a layer."""

    @staticmethod
    @abc.abstractmethod
    def init_scale(In: AxisSpec, Out: AxisSpec) -> float:
        """Multiplier of the unit-variance initialisation."""

    @property
    @abc.abstractmethod
    def lr_scale(self) -> float:
        """Multiplier of the learning rate."""

    @property
    @abc.abstractmethod
    def active_scale(self) -> float:
        """Constant the layer's weight is multiplied by in the forward pass."""


@dataclasses.dataclass
class AbstractLinearReparam(AbstractReparam):
    """A reparameterisation of a linear layer `In -> Out`."""

    In: AxisSpec
    Out: AxisSpec


class LinearStandardParam(AbstractLinearReparam):
    """Standard parameterisation: init `1/sqrt(fan_in)`, no other scaling."""

    @staticmethod
    def init_scale(In: AxisSpec, Out: AxisSpec) -> float:
        return 1 / math.sqrt(axis_size(In))

    @property
    def active_scale(self) -> float:
        return 1

    @property
    def lr_scale(self) -> float:
        return 1


class InputLinearMup(AbstractLinearReparam):
    """muP input layer: unit init, no scaling."""

    @staticmethod
    def init_scale(In: AxisSpec, Out: AxisSpec) -> float:
        return 1

    @property
    def active_scale(self) -> float:
        return 1

    @property
    def lr_scale(self) -> float:
        return 1


class HiddenLinearMup(AbstractLinearReparam):
    """muP hidden layer: init `1/sqrt(fan_in)`, learning rate `1/fan_in` (for Adam)."""

    @staticmethod
    def init_scale(In: AxisSpec, Out: AxisSpec) -> float:
        return 1 / math.sqrt(axis_size(In))

    @property
    def active_scale(self) -> float:
        return 1

    @property
    def lr_scale(self) -> float:
        return 1 / axis_size(self.In)


class OutputLinearMup(AbstractLinearReparam):
    """muP output layer: unit init, output multiplied by `1/fan_in`."""

    @staticmethod
    def init_scale(In: AxisSpec, Out: AxisSpec) -> float:
        return 1

    @property
    def active_scale(self) -> float:
        return 1 / axis_size(self.In)

    @property
    def lr_scale(self) -> float:
        return 1


@dataclasses.dataclass
class AbstractEmbeddingReparam(AbstractReparam):
    """A reparameterisation of an embedding table (and its tied unembedding)."""

    Embed: AxisSpec
    Vocab: AxisSpec

    @property
    @abc.abstractmethod
    def unembed_active_scale(self) -> float:
        """Multiplier of the logits of the tied unembedding."""


class EmbeddingStandardParam(AbstractEmbeddingReparam):
    """Standard embedding: init `1/size(Out)`, no other scaling."""

    @staticmethod
    def init_scale(In: AxisSpec, Out: AxisSpec) -> float:
        return 1 / axis_size(Out)

    @property
    def active_scale(self) -> float:
        return 1

    @property
    def lr_scale(self) -> float:
        return 1

    @property
    def unembed_active_scale(self) -> float:
        return 1


class EmbeddingMup(AbstractEmbeddingReparam):
    """muP embedding: unit init; tied unembedding logits multiplied by `1/size(Embed)`."""

    @staticmethod
    def init_scale(In: AxisSpec, Out: AxisSpec) -> float:
        return 1

    @property
    def active_scale(self) -> float:
        return 1

    @property
    def lr_scale(self) -> float:
        return 1

    @property
    def unembed_active_scale(self) -> float:
        return 1 / axis_size(self.Embed)


class ReparamEnabled(abc.ABC):
    """A module with a `reparam` property (its AbstractReparam)."""

    @property
    @abc.abstractmethod
    def reparam(self) -> Any: ...
