"""meltemi.haliax.nn: equinox layers over named axes.

>>> import jax
>>> import meltemi.haliax as hax
>>> In, Out = hax.Axis("in", 3), hax.Axis("out", 2)
>>> hax.nn.Linear.init(In, Out, key=jax.random.key(0), use_bias=False).weight.axes
(Axis(name='out', size=2), Axis(name='in', size=3))
"""

from meltemi.haliax._remat import ScanCheckpointPolicy
from meltemi.haliax.nn import attention, mup, rotary
from meltemi.haliax.nn._activations import (
    celu,
    elu,
    gelu,
    glu,
    hard_sigmoid,
    hard_silu,
    hard_swish,
    hard_tanh,
    leaky_relu,
    log_sigmoid,
    log_softmax,
    logsumexp,
    one_hot,
    quick_gelu,
    relu,
    relu6,
    relu_squared,
    selu,
    sigmoid,
    silu,
    soft_sign,
    softmax,
    softplus,
    standardize,
    swish,
    tanh,
)
from meltemi.haliax.nn._array_stacked import ArrayStacked
from meltemi.haliax.nn._conv import Conv, ConvTranspose
from meltemi.haliax.nn._dropout import Dropout, dropout
from meltemi.haliax.nn._linear import Embedding, Linear
from meltemi.haliax.nn._loss import (
    binary_cross_entropy_loss,
    cross_entropy_loss,
    cross_entropy_loss_and_log_normalizers,
    reduce_loss,
)
from meltemi.haliax.nn._mlp import MLP
from meltemi.haliax.nn._moe import MoELinear, ragged_dot
from meltemi.haliax.nn._normalization import LayerNorm, RmsNorm
from meltemi.haliax.nn._pool import max_pool, mean_pool, min_pool
from meltemi.haliax.nn._scan import BlockSeq, Stacked
from meltemi.haliax.nn.attention import Attention, AttentionMask, dot_product_attention
from meltemi.haliax.nn.rotary import Llama3RopeScaling, RotaryConfig, apply_rotary

__all__ = [
    "MLP",
    "ArrayStacked",
    "Attention",
    "AttentionMask",
    "BlockSeq",
    "Conv",
    "ConvTranspose",
    "Dropout",
    "Embedding",
    "LayerNorm",
    "Linear",
    "Llama3RopeScaling",
    "MoELinear",
    "RmsNorm",
    "RotaryConfig",
    "ScanCheckpointPolicy",
    "Stacked",
    "apply_rotary",
    "attention",
    "binary_cross_entropy_loss",
    "celu",
    "cross_entropy_loss",
    "cross_entropy_loss_and_log_normalizers",
    "dot_product_attention",
    "dropout",
    "elu",
    "gelu",
    "glu",
    "hard_sigmoid",
    "hard_silu",
    "hard_swish",
    "hard_tanh",
    "leaky_relu",
    "log_sigmoid",
    "log_softmax",
    "logsumexp",
    "max_pool",
    "mean_pool",
    "min_pool",
    "mup",
    "one_hot",
    "quick_gelu",
    "ragged_dot",
    "reduce_loss",
    "relu",
    "relu6",
    "relu_squared",
    "rotary",
    "selu",
    "sigmoid",
    "silu",
    "soft_sign",
    "softmax",
    "softplus",
    "standardize",
    "swish",
    "tanh",
]
