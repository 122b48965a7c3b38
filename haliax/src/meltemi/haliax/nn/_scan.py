"""`Stacked` (layers stored with a `Layers` axis, run with `scan`) and `BlockSeq` (a list).

>>> import jax
>>> import meltemi.haliax as hax
>>> Layers, Embed = hax.Axis("layers", 3), hax.Axis("embed", 4)
>>> stack = hax.nn.Stacked.init(Layers, hax.nn.Linear)(
...     Embed, Embed.alias("embed_out"), key=jax.random.split(jax.random.key(0), 3))
>>> stack.stacked.weight.axes[0]
Axis(name='layers', size=3)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import equinox as eqx
import jax
import numpy as np

from meltemi.haliax._core import Axis, NamedArray, is_named_array
from meltemi.haliax._hof import _is_array, fold, scan, vmap
from meltemi.haliax._remat import RematSpec, ScanCheckpointPolicy

__all__ = ["Stacked", "BlockSeq", "ScanCheckpointPolicy"]

M = TypeVar("M", bound=eqx.Module)


def _call_block(carry, block, *args, **kwargs):
    return block(carry, *args, **kwargs)


class Stacked(eqx.Module, Generic[M]):
    """`Block.size` copies of one module, stored as one module whose arrays have the `Block`
    axis first, and applied with `hax.fold`/`hax.scan` (one compiled layer body).

    Build it with `Stacked.init(Layers, Module, gradient_checkpointing=...)(*args, key=keys)`:
    `Module.init` is vmapped over `Layers`; unnamed arrays in the arguments (e.g.
    `key=jax.random.split(key, n)`) are split along their leading dimension.

    In `fold`/`scan`, extra arguments follow `hax.scan`: NamedArrays with the `Block` axis and
    unnamed arrays are split per layer, other NamedArrays are passed whole to every layer.
    """

    stacked: M
    Block: Axis = eqx.field(static=True)
    gradient_checkpointing: ScanCheckpointPolicy = eqx.field(static=True)

    @classmethod
    def init(
        cls,
        Block: Axis,
        module: type[M],
        *,
        gradient_checkpointing: RematSpec = False,
        prevent_cse: bool = False,
    ) -> Callable[..., Stacked[M]]:
        """

        Args:
            Block: the layer axis (its size is the number of layers).
            module: the layer class (with an `init`).
            gradient_checkpointing: a ScanCheckpointPolicy, a bool or a kind string.
            prevent_cse: stop XLA from merging recomputation with the forward pass.
        """
        policy = ScanCheckpointPolicy.from_bool_or_str(gradient_checkpointing)
        if prevent_cse:
            policy = ScanCheckpointPolicy(policy.kind, policy.save_names, True)

        def build(*args, **kwargs) -> Stacked[M]:
            stacked = vmap(module.init, Block)(*args, **kwargs)
            return Stacked(stacked, Block, policy)

        return build

    def fold(self, init: Any, *args, **kwargs) -> Any:
        """Runs `carry = layer(carry, *args, **kwargs)` through the layers."""
        return fold(_call_block, self.Block, remat=self.gradient_checkpointing)(
            init, self.stacked, *args, **kwargs
        )

    def scan(self, init: Any, *args, **kwargs) -> tuple[Any, Any]:
        """Runs `carry, y = layer(carry, ...)`; returns the last carry and the stacked ys."""
        return scan(_call_block, self.Block, remat=self.gradient_checkpointing)(
            init, self.stacked, *args, **kwargs
        )

    def __call__(self, init: Any, *args, **kwargs) -> Any:
        return self.fold(init, *args, **kwargs)

    def _state_dict_key_map(self) -> dict[str, str | None]:
        return {"stacked": None}  # arrays live under the stack's own key

    def get_layer(self, i: int) -> M:
        """Layer `i` as a plain module (the `Block` axis removed)."""

        def pick(x):
            if isinstance(x, NamedArray) and x.has_axis(self.Block.name):
                return x[{self.Block.name: i}]
            if _is_array(x):
                return x[i]
            return x

        return jax.tree.map(pick, self.stacked, is_leaf=is_named_array)

    def unstacked(self) -> tuple[M, ...]:
        """All layers as a tuple of plain modules."""
        return tuple(self.get_layer(i) for i in range(self.Block.size))

    @classmethod
    def from_layers(
        cls, Block: Axis, layers: Sequence[M], gradient_checkpointing: RematSpec = False
    ):
        """Stacks per-layer modules (the inverse of `unstacked`)."""
        if len(layers) != Block.size:
            raise ValueError(f"from_layers: {len(layers)} layers for axis {Block}")

        def stack(*xs):
            if isinstance(xs[0], NamedArray):
                return NamedArray(jax.numpy.stack([x.array for x in xs]), (Block,) + xs[0].axes)
            if _is_array(xs[0]):
                return jax.numpy.stack(xs)
            return xs[0]

        stacked = jax.tree.map(stack, *layers, is_leaf=is_named_array)
        return Stacked(
            stacked, Block, ScanCheckpointPolicy.from_bool_or_str(gradient_checkpointing)
        )


class BlockSeq(eqx.Module, Generic[M]):
    """Like `Stacked` but a Python tuple of layers, unrolled at trace time (layers may differ
    after construction, e.g. after loading; compile time grows with depth).

    Any checkpoint policy other than `"none"` wraps each block in `jax.checkpoint`.
    """

    blocks: tuple[M, ...]
    Block: Axis = eqx.field(static=True)
    gradient_checkpointing: ScanCheckpointPolicy = eqx.field(static=True)

    @classmethod
    def init(
        cls,
        Block: Axis,
        module: type[M],
        *,
        gradient_checkpointing: RematSpec = False,
    ) -> Callable[..., BlockSeq[M]]:
        policy = ScanCheckpointPolicy.from_bool_or_str(gradient_checkpointing)

        def build(*args, **kwargs) -> BlockSeq[M]:
            blocks = tuple(
                module.init(*_slice_args(args, Block, i), **_slice_args(kwargs, Block, i))
                for i in range(Block.size)
            )
            return BlockSeq(blocks, Block, policy)

        return build

    def _body(self, block):
        if self.gradient_checkpointing.resolved().kind == "none":
            return block
        return jax.checkpoint(
            lambda c, *a, **k: block(c, *a, **k),
            prevent_cse=self.gradient_checkpointing.prevent_cse,
        )

    def fold(self, init: Any, *args, **kwargs) -> Any:
        carry = init
        for i, block in enumerate(self.blocks):
            a, k = _slice_args(args, self.Block, i), _slice_args(kwargs, self.Block, i)
            carry = self._body(block)(carry, *a, **k)
        return carry

    def scan(self, init: Any, *args, **kwargs) -> tuple[Any, Any]:
        carry, ys = init, []
        for i, block in enumerate(self.blocks):
            a, k = _slice_args(args, self.Block, i), _slice_args(kwargs, self.Block, i)
            carry, y = self._body(block)(carry, *a, **k)
            ys.append(y)
        return carry, _stack_outputs(self.Block, ys)

    def __call__(self, init: Any, *args, **kwargs) -> Any:
        return self.fold(init, *args, **kwargs)

    def get_layer(self, i: int) -> M:
        return self.blocks[i]

    def _state_dict_key_map(self) -> dict[str, str | None]:
        return {"blocks": None}  # layers are `<key>.0.`, `<key>.1.`, ...


def _slice_args(tree: Any, Block: Axis, i: int) -> Any:
    def pick(x):
        if isinstance(x, NamedArray):
            return x[{Block.name: i}] if x.has_axis(Block.name) else x
        if isinstance(x, jax.Array | np.ndarray):
            return x[i]
        return x

    return jax.tree.map(pick, tree, is_leaf=is_named_array)


def _stack_outputs(Block: Axis, ys: list[Any]) -> Any:
    def stack(*xs):
        if isinstance(xs[0], NamedArray):
            return NamedArray(jax.numpy.stack([x.array for x in xs]), (Block,) + xs[0].axes)
        if _is_array(xs[0]):
            return jax.numpy.stack(xs)
        return xs[0]

    return jax.tree.map(stack, *ys, is_leaf=is_named_array)
