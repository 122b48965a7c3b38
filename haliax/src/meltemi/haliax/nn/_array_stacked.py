"""`ArrayStacked`: layers stored with an unnamed leading layer dimension, run with `lax.scan`.

For modules whose parameters are plain arrays (no NamedArrays; use `Stacked` for those).

>>> import equinox as eqx
>>> import jax
>>> import jax.numpy as jnp
>>> import meltemi.haliax as hax
>>> class Scale(eqx.Module):
...     w: jax.Array
...     @staticmethod
...     def init(w):
...         return Scale(w)
...     def __call__(self, x):
...         return x * self.w
>>> stack = hax.nn.ArrayStacked.init(3, Scale)(jnp.array([1.0, 2.0, 3.0]))
>>> float(stack.fold(1.0))
6.0
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp

from meltemi.haliax._core import NamedArray, is_named_array
from meltemi.haliax._remat import (
    RematSpec,
    ScanCheckpointPolicy,
    multilevel_scan,
    tree_checkpoint_name,
)

__all__ = ["ArrayStacked"]

M = TypeVar("M", bound=eqx.Module)
InAxes = Any
"""None (pass whole), an int (slice along that dim), a tuple per positional argument, or
`(positional, {keyword: axis})`."""


def _is_layered(x: Any, n: int) -> bool:
    return isinstance(x, jax.Array) and x.ndim > 0 and x.shape[0] == n


def _stack(layers: Sequence[Any], n: int) -> Any:
    first, treedef = jax.tree_util.tree_flatten(layers[0], is_leaf=is_named_array)
    per_layer = [jax.tree_util.tree_leaves(layer, is_leaf=is_named_array) for layer in layers]
    out = []
    for i, leaf in enumerate(first):
        if isinstance(leaf, NamedArray):
            raise TypeError(
                "ArrayStacked holds plain-array parameters; this module has NamedArrays. "
                "Use hax.nn.Stacked.init(Layers, Module) for it."
            )
        if isinstance(leaf, jax.Array):
            out.append(jnp.stack([p[i] for p in per_layer]))
        else:
            out.append(leaf)
    return jax.tree_util.tree_unflatten(treedef, out)


def _resolve_in_axes(in_axes: InAxes, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    if isinstance(in_axes, tuple) and len(in_axes) == 2 and isinstance(in_axes[1], dict):
        pos, kw = in_axes
    else:
        pos, kw = in_axes, None
    pos_axes = tuple(pos for _ in args) if pos is None or isinstance(pos, int) else tuple(pos)
    if len(pos_axes) != len(args):
        raise ValueError(f"in_axes has {len(pos_axes)} positional entries for {len(args)} args")
    kw_axes = {k: kw for k in kwargs} if kw is None or isinstance(kw, int) else dict(kw)
    if set(kw_axes) != set(kwargs):
        raise ValueError(f"in_axes keywords {sorted(kw_axes)} must match {sorted(kwargs)}")
    return pos_axes, kw_axes


def _take(x: Any, axis: int | None, i: Any, n: int, what: str) -> Any:
    if axis is None:
        return x
    if not isinstance(x, jax.Array):
        raise TypeError(f"{what}: in_axes={axis} needs an array, got {type(x).__name__}")
    if x.shape[axis] != n:
        raise ValueError(f"{what}: in_axes={axis} needs size {n} there, got shape {x.shape}")
    return jnp.take(x, i, axis=axis)


class ArrayStacked(eqx.Module, Generic[M]):
    """`num_layers` copies of a module whose array leaves have a leading layer dimension.

    `ArrayStacked.init(n, Module, gradient_checkpointing=...)(*args, **kwargs)` calls
    `Module.init` once per layer; unnamed arrays in the arguments whose leading dimension is `n`
    are split per layer (e.g. `key=jax.random.split(key, n)`).
    """

    stacked: M
    num_layers: int = eqx.field(static=True)
    gradient_checkpointing: ScanCheckpointPolicy = eqx.field(static=True)

    @classmethod
    def init(
        cls, num_layers: int, module: type[M], *, gradient_checkpointing: RematSpec = False
    ) -> Callable[..., ArrayStacked[M]]:
        if num_layers < 1:
            raise ValueError(f"ArrayStacked: num_layers must be >= 1, got {num_layers}")
        policy = ScanCheckpointPolicy.from_bool_or_str(gradient_checkpointing)

        def build(*args: Any, **kwargs: Any) -> ArrayStacked[M]:
            layers = []
            for i in range(num_layers):
                a, k = jax.tree.map(
                    lambda x, i=i: x[i] if _is_layered(x, num_layers) else x,
                    (args, kwargs),
                    is_leaf=is_named_array,
                )
                layers.append(module.init(*a, **k))
            return cls(_stack(layers, num_layers), num_layers, policy)

        return build

    def get_layer(self, index: Any) -> M:
        """Layer `index` (may be traced)."""
        n = self.num_layers
        return jax.tree.map(lambda x: x[index] if _is_layered(x, n) else x, self.stacked)

    def unstacked(self) -> Sequence[M]:
        """The layers as a tuple of modules."""
        return tuple(self.get_layer(i) for i in range(self.num_layers))

    def _run(self, fn: Callable, init: Any, args: tuple, kwargs: dict, in_axes: InAxes, unroll):
        pos_axes, kw_axes = _resolve_in_axes(in_axes, args, kwargs)
        n = self.num_layers

        def body(carry, i):
            carry = tree_checkpoint_name(carry, "ArrayStacked__carry")
            a = tuple(_take(x, ax, i, n, "ArrayStacked") for x, ax in zip(args, pos_axes))
            kw = {k: _take(v, kw_axes[k], i, n, f"ArrayStacked[{k}]") for k, v in kwargs.items()}
            return fn(self.get_layer(i), carry, *a, **kw)

        policy = self.gradient_checkpointing.resolved()
        body = policy.checkpoint("ArrayStacked__carry", "ArrayStacked__input", body)
        unroll = 1 if unroll is None else unroll
        outer = policy.outer_block_size(n)
        if outer is not None:
            return multilevel_scan(body, init, jnp.arange(n), outer, n, unroll=unroll)
        return jax.lax.scan(body, init, jnp.arange(n), unroll=unroll)

    def scan_via(self, fn: Callable, *, unroll: Any = None, in_axes: InAxes = None) -> Callable:
        """`g(init, *args, **kw) -> (carry, ys)` running `fn(layer, carry, *a, **kw) ->
        (carry, y)` over the layers (arguments sliced per `in_axes`)."""
        return lambda init, *a, **kw: self._run(fn, init, a, kw, in_axes, unroll)

    def fold_via(self, fn: Callable, *, unroll: Any = None, in_axes: InAxes = None) -> Callable:
        """Like `scan_via` for `fn(layer, carry, ...) -> carry`; returns the final carry."""

        def step(layer, carry, *a, **kw):
            return fn(layer, carry, *a, **kw), None

        return lambda init, *a, **kw: self._run(step, init, a, kw, in_axes, unroll)[0]

    def scan(self, init: Any, *args: Any, unroll: Any = None, in_axes: InAxes = None, **kw: Any):
        """Runs `layer(carry, *args, **kw) -> (carry, y)` over the layers: `(carry, ys)`."""
        return self.scan_via(lambda m, c, *a, **k: m(c, *a, **k), unroll=unroll, in_axes=in_axes)(
            init, *args, **kw
        )

    def fold(self, init: Any, *args: Any, unroll: Any = None, in_axes: InAxes = None, **kw: Any):
        """Runs `layer(carry, *args, **kw) -> carry` over the layers."""
        return self.fold_via(lambda m, c, *a, **k: m(c, *a, **k), unroll=unroll, in_axes=in_axes)(
            init, *args, **kw
        )

    def __call__(self, init: Any, *args: Any, **kwargs: Any) -> Any:
        return self.fold(init, *args, **kwargs)

    def vmap_via(self, fn: Callable, *, in_axes: InAxes = None, out_axes: int | None = 0):
        """`g(*args, **kw)` mapping `fn(layer, *a, **kw)` over all layers at once."""

        def run(*args: Any, **kwargs: Any) -> Any:
            pos_axes, kw_axes = _resolve_in_axes(in_axes, args, kwargs)
            n = self.num_layers
            layer_axes = jax.tree.map(lambda x: 0 if _is_layered(x, n) else None, self.stacked)
            return jax.vmap(
                lambda m, a, kw: fn(m, *a, **kw),
                in_axes=(layer_axes, pos_axes, kw_axes),
                out_axes=out_axes,
            )(self.stacked, args, kwargs)

        return run
