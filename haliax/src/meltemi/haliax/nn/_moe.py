"""Mixture-of-experts matmuls: `ragged_dot` (grouped matmul on raw arrays) and `MoELinear`.

Tokens are sorted by expert; `group_sizes[e]` consecutive rows go to expert `e`.

>>> import jax
>>> import jax.numpy as jnp
>>> import meltemi.haliax as hax
>>> Tok, E, In, Out = hax.make_axes(tok=5, experts=2, embed=3, mlp=4)
>>> layer = hax.nn.MoELinear.init(E, In, Out, key=jax.random.key(0))
>>> y = layer(hax.ones((Tok, In)), hax.named(jnp.array([2, 3]), E))
>>> y.axes
(Axis(name='tok', size=5), Axis(name='mlp', size=4))
"""

from __future__ import annotations

import math
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp

from meltemi.haliax import random as hrandom
from meltemi.haliax._core import Axis, AxisError, NamedArray, concat_axes
from meltemi.haliax._ops import zeros

__all__ = ["ragged_dot", "MoELinear", "Implementation"]

Implementation = Literal["auto", "xla", "triton", "megablox"]

_KERNELS = {
    "triton": "a GPU (Pallas Triton kernel)",
    "megablox": "a TPU (Megablox Pallas kernel)",
}


def ragged_dot(
    lhs_: jax.Array,
    rhs_: jax.Array,
    group_sizes_: jax.Array,
    ar: bool = False,
    implementation: Implementation = "auto",
) -> jax.Array:
    """Grouped matmul: rows `lhs_[start_e : start_e + group_sizes_[e]] @ rhs_[e]`.

    Args:
        lhs_: `[tokens, in]`, sorted by expert.
        rhs_: `[experts, in, out]`.
        group_sizes_: `[experts]` row counts (summing to at most `tokens`; rows past the sum
            give zeros).
        ar: all-reduce (`psum`) the result over the mesh axis `"model"` (inside `shard_map`,
            when `in` is sharded over it).
        implementation: `"auto"` and `"xla"` run `jax.lax.ragged_dot` (every backend); the
            Pallas kernels `"triton"` and `"megablox"` are not provided (see the README).

    Returns:
        `[tokens, out]`.
    """
    if implementation in _KERNELS:
        raise NotImplementedError(
            f"ragged_dot(implementation={implementation!r}) needs {_KERNELS[implementation]}, "
            f"which meltemi.haliax does not ship; use implementation='xla' (or 'auto'), the "
            f"pure-JAX path, which runs on every backend"
        )
    if implementation not in ("auto", "xla"):
        raise ValueError(f"implementation must be one of {list(Implementation.__args__)}")
    out = jax.lax.ragged_dot(lhs_, rhs_, group_sizes_.astype(jnp.int32))
    if ar:
        out = jax.lax.psum(out, "model")
    return out


class MoELinear(eqx.Module):
    """One `In -> Out` linear map per expert, applied to tokens grouped by expert.

    Weight axes `(Experts, In, Out)` (or `(Experts, Out, In)` with `out_first`); bias `(Out,)`.
    """

    weight: NamedArray
    bias: NamedArray | None
    Experts: Axis = eqx.field(static=True)
    In: Axis = eqx.field(static=True)
    Out: Axis = eqx.field(static=True)
    use_gmm: bool = eqx.field(static=True, default=False)

    @staticmethod
    def init(
        Experts: Axis,
        In: Axis,
        Out: Axis,
        *,
        key: jax.Array,
        use_bias: bool = True,
        out_first: bool = False,
        init_scale: float = 1.0,
        use_gmm: bool = False,
    ) -> MoELinear:
        """Truncated-normal weights with std `init_scale / sqrt(In.size)`; zero bias.

        Args:
            Experts: the expert axis.
            In: the input axis.
            Out: the output axis.
            key: PRNG key.
            use_bias: add a bias over `Out` (shared by the experts).
            out_first: weight axes `(Experts, Out, In)` instead of `(Experts, In, Out)`.
            init_scale: scales the init std.
            use_gmm: Haliax's switch to its TPU grouped-matmul kernel; here both settings run
                `jax.lax.ragged_dot`.

        Returns:
            The layer.
        """
        inner = concat_axes(Out, In) if out_first else concat_axes(In, Out)
        w = hrandom.truncated_normal(key, concat_axes(Experts, inner), -3, 3)
        w = w * (init_scale / math.sqrt(In.size))
        return MoELinear(w, zeros(Out) if use_bias else None, Experts, In, Out, use_gmm)

    @property
    def out_first(self) -> bool:
        """Whether the weight is stored `(Experts, Out, In)` (else `(Experts, In, Out)`)."""
        names = [a.name for a in self.weight.axes]
        return names.index(self.Out.name) < names.index(self.In.name)

    @jax.named_scope("moe_linear")
    def __call__(
        self, inputs: NamedArray, group_sizes: NamedArray, *, key: jax.Array | None = None
    ) -> NamedArray:
        """`inputs` `(..., In)` with tokens sorted by expert, `group_sizes` `(Experts,)`."""
        if not inputs.has_axis(self.In.name):
            raise AxisError(
                f"MoELinear expects input axis {self.In.name!r}; the input has axes "
                f"{[a.name for a in inputs.axes]}"
            )
        x = inputs.rearrange((..., self.In.name))
        rest = x.axes[:-1]
        lhs = x.array.reshape((-1, self.In.size))
        rhs = self.weight.rearrange((self.Experts.name, self.In.name, self.Out.name)).array
        out = ragged_dot(lhs, rhs, group_sizes.array)
        y = NamedArray(out.reshape((*(a.size for a in rest), self.Out.size)), (*rest, self.Out))
        if self.bias is not None:
            y = y + self.bias
        return y.rearrange([self.Out.name if a == self.In else a.name for a in inputs.axes])
