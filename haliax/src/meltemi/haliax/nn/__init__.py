"""meltemi.haliax.nn: equinox layers over named axes.

>>> import jax
>>> import meltemi.haliax as hax
>>> In, Out = hax.Axis("in", 3), hax.Axis("out", 2)
>>> hax.nn.Linear.init(In, Out, key=jax.random.key(0), use_bias=False).weight.axes
(Axis(name='out', size=2), Axis(name='in', size=3))
"""

from meltemi.haliax._remat import ScanCheckpointPolicy
from meltemi.haliax.nn import attention, rotary
from meltemi.haliax.nn._activations import (
    elu,
    gelu,
    leaky_relu,
    log_softmax,
    logsumexp,
    one_hot,
    quick_gelu,
    relu,
    relu6,
    sigmoid,
    silu,
    softmax,
    softplus,
    standardize,
    swish,
    tanh,
)
from meltemi.haliax.nn._dropout import Dropout
from meltemi.haliax.nn._linear import Embedding, Linear
from meltemi.haliax.nn._loss import cross_entropy_loss, cross_entropy_loss_and_log_normalizers
from meltemi.haliax.nn._mlp import MLP
from meltemi.haliax.nn._normalization import LayerNorm, RmsNorm
from meltemi.haliax.nn._scan import BlockSeq, Stacked
from meltemi.haliax.nn.attention import Attention, AttentionMask, dot_product_attention
from meltemi.haliax.nn.rotary import Llama3RopeScaling, RotaryConfig, apply_rotary

__all__ = [
    "MLP",
    "Attention",
    "AttentionMask",
    "BlockSeq",
    "Dropout",
    "Embedding",
    "LayerNorm",
    "Linear",
    "Llama3RopeScaling",
    "RmsNorm",
    "RotaryConfig",
    "ScanCheckpointPolicy",
    "Stacked",
    "apply_rotary",
    "attention",
    "cross_entropy_loss",
    "cross_entropy_loss_and_log_normalizers",
    "dot_product_attention",
    "elu",
    "gelu",
    "leaky_relu",
    "log_softmax",
    "logsumexp",
    "one_hot",
    "quick_gelu",
    "relu",
    "relu6",
    "rotary",
    "sigmoid",
    "silu",
    "softmax",
    "softplus",
    "standardize",
    "swish",
    "tanh",
]
