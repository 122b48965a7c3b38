"""`MLP`: a stack of `Linear` layers, plain or gated (SwiGLU-style).

>>> import jax
>>> import meltemi.haliax as hax
>>> Embed, Mlp = hax.Axis("embed", 4), hax.Axis("mlp", 6)
>>> mlp = hax.nn.MLP.init(Embed, Embed, Mlp, depth=1, activation=hax.nn.silu, gated=True,
...                       use_bias=False, key=jax.random.key(0))
>>> mlp(hax.ones(Embed)).axes
(Axis(name='embed', size=4),)
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax

from meltemi.haliax._core import Axis, AxisSpec, NamedArray
from meltemi.haliax.nn._activations import relu
from meltemi.haliax.nn._linear import Linear

__all__ = ["MLP"]


class MLP(eqx.Module):
    """`depth` hidden layers of `width` then an output layer.

    With `gated=True` each hidden layer is `activation(gate(x)) * up(x)` (the `gates` hold the
    gate projections), which with `activation=silu` is Llama's SwiGLU. Hidden widths alternate
    between the axis names `mlp` and `mlp2` so that square hidden weights keep distinct names.
    """

    layers: tuple[Linear, ...]
    gates: tuple[Linear, ...] | None
    activation: Callable = eqx.field(static=True)

    @staticmethod
    def init(
        Input: AxisSpec,
        Output: AxisSpec,
        width: int | Axis,
        depth: int,
        activation: Callable = relu,
        *,
        key: jax.Array,
        use_bias: bool = True,
        use_final_bias: bool = True,
        out_first: bool = True,
        gated: bool = False,
        init_scale: float = 1.0,
    ) -> MLP:
        """

        Args:
            Input: input axis (or axes).
            Output: output axis (or axes).
            width: hidden width (an int, or an Axis to name it).
            depth: number of hidden layers.
            activation: elementwise activation.
            key: PRNG key.
            use_bias: biases on the hidden layers.
            use_final_bias: bias on the output layer.
            out_first: weight layout, as `Linear.init`.
            gated: SwiGLU-style blocks: `act(gate(x)) * up(x)`.
            init_scale: scales the init std.
        """
        Width = width if isinstance(width, Axis) else Axis("mlp", width)
        Width2 = Width.alias(Width.name + "2")
        keys = jax.random.split(key, 2 * depth + 1)
        kw = dict(out_first=out_first, init_scale=init_scale)
        if depth == 0:
            return MLP(
                (Linear.init(Input, Output, key=keys[0], use_bias=use_final_bias, **kw),),
                None,
                activation,
            )
        ins = [Input] + [Width if i % 2 == 1 else Width2 for i in range(1, depth)]
        outs = [Width if i % 2 == 0 else Width2 for i in range(depth)]
        layers = [
            Linear.init(i, o, key=keys[n], use_bias=use_bias, **kw)
            for n, (i, o) in enumerate(zip(ins, outs))
        ]
        layers.append(Linear.init(outs[-1], Output, key=keys[depth], use_bias=use_final_bias, **kw))
        gates = None
        if gated:
            gates = tuple(
                Linear.init(i, o, key=keys[depth + 1 + n], use_bias=use_bias, **kw)
                for n, (i, o) in enumerate(zip(ins, outs))
            )
        return MLP(tuple(layers), gates, activation)

    @jax.named_scope("mlp")
    def __call__(self, x: NamedArray, *, key: jax.Array | None = None) -> NamedArray:
        for n, layer in enumerate(self.layers[:-1]):
            if self.gates is not None:
                x = self.activation(self.gates[n](x)) * layer(x)
            else:
                x = self.activation(layer(x))
        return self.layers[-1](x)
