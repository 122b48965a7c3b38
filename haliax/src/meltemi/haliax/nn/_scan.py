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

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import equinox as eqx
import jax
import numpy as np

import meltemi.haliax as _hax  # state_dict imports this module: look it up at call time
from meltemi.haliax._core import Axis, NamedArray, is_named_array
from meltemi.haliax._hof import _is_array, fold, scan, vmap
from meltemi.haliax._remat import RematSpec, ScanCheckpointPolicy, tree_checkpoint_name

__all__ = ["Stacked", "BlockSeq", "ScanCheckpointPolicy"]

M = TypeVar("M", bound=eqx.Module)


def _call_module(block, carry, *args, **kwargs):
    return block(carry, *args, **kwargs)


def _bind(run: Callable, stacked: Any) -> Callable:
    """`run(init, stacked, *args, **kw)` as `g(init, *args, **kw)`."""
    return lambda init, *args, **kwargs: run(init, stacked, *args, **kwargs)


def _unroll(unroll: int | bool | None) -> int | bool:
    """Haliax's `unroll`: None is 1, a bool goes to `lax.scan` as is, else an int >= 1."""
    if unroll is None:
        return 1
    if isinstance(unroll, bool):
        return unroll
    if int(unroll) < 1:
        raise ValueError(f"unroll must be >= 1 (or a bool), got {unroll!r}")
    return int(unroll)


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
            policy = dataclasses.replace(policy, prevent_cse=True)

        def build(*args, **kwargs) -> Stacked[M]:
            stacked = vmap(module.init, Block)(*args, **kwargs)
            return Stacked(stacked, Block, policy)

        return build

    def fold(self, init: Any, *args, unroll: int | bool | None = None, **kwargs) -> Any:
        """Runs `carry = layer(carry, *args, **kwargs)` through the layers."""
        return self.fold_via(_call_module, unroll=unroll)(init, *args, **kwargs)

    def scan(self, init: Any, *args, unroll: int | bool | None = None, **kwargs) -> tuple[Any, Any]:
        """Runs `carry, y = layer(carry, ...)`; returns the last carry and the stacked ys."""
        return self.scan_via(_call_module, unroll=unroll)(init, *args, **kwargs)

    def fold_via(self, fn: Callable, *, unroll: int | bool | None = None) -> Callable:
        """`g(init, *args, **kw) -> carry` running `carry = fn(layer, carry, *args, **kw)`."""

        def step(carry, block, *args, **kwargs):
            return fn(block, carry, *args, **kwargs)

        return _bind(
            fold(step, self.Block, remat=self.gradient_checkpointing, unroll=_unroll(unroll)),
            self.stacked,
        )

    def scan_via(self, fn: Callable, *, unroll: int | bool | None = None) -> Callable:
        """`g(init, *args, **kw) -> (carry, ys)` running `carry, y = fn(layer, carry, ...)`."""

        def step(carry, block, *args, **kwargs):
            return fn(block, carry, *args, **kwargs)

        return _bind(
            scan(step, self.Block, remat=self.gradient_checkpointing, unroll=_unroll(unroll)),
            self.stacked,
        )

    def vmap_via(self, fn: Callable) -> Callable:
        """`g(*args, **kw)` applying `fn(layer, *args, **kw)` to every layer at once (vmap);
        outputs get the `Block` axis first."""

        def per_layer(block, *args, **kwargs):
            return fn(block, *args, **kwargs)

        return lambda *args, **kwargs: vmap(per_layer, self.Block)(self.stacked, *args, **kwargs)

    def vmap(self, *args, **kwargs) -> Any:
        """Every layer applied to the same inputs (`layer(*args, **kwargs)`), stacked."""
        return vmap(type(self.stacked).__call__, self.Block)(self.stacked, *args, **kwargs)

    def to_state_dict(self, prefix: str | None = None) -> dict[str, Any]:
        """`hax.state_dict.to_state_dict(self, prefix)` (layers as `prefix.0.`, `prefix.1.`)."""
        return _hax.state_dict.to_state_dict(self, prefix)

    def flatten_for_export(self) -> Stacked[M]:
        """Every layer's `flatten_for_export()` (vmapped over `Block`); layers without one stay."""
        if not hasattr(self.stacked, "flatten_for_export"):
            return self
        flat = vmap(lambda m: m.flatten_for_export(), self.Block)(self.stacked)
        return dataclasses.replace(self, stacked=flat)

    def unflatten_from_export(self, template: Stacked[M]) -> Stacked[M]:
        """The inverse of `flatten_for_export`, guided by `template`'s layers."""
        if not hasattr(self.stacked, "unflatten_from_export"):
            return self
        out = vmap(lambda m, t: m.unflatten_from_export(t), self.Block)(
            self.stacked, template.stacked
        )
        return dataclasses.replace(template, stacked=out)

    def from_state_dict(self, state_dict: Any, prefix: str | None = None) -> Stacked[M]:
        """`hax.state_dict.from_state_dict(self, state_dict, prefix)`."""
        return _hax.state_dict.from_state_dict(self, state_dict, prefix)

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

    Any checkpoint policy but a disabled one wraps each block in `jax.checkpoint`.
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
        policy = self.gradient_checkpointing.resolved()
        if policy.disable:
            return block
        carry_name = f"BlockSeq[{self.Block.name}]__carry"
        input_name = f"BlockSeq[{self.Block.name}]__input"

        def step(c, *a, **k):
            return block(tree_checkpoint_name(c, carry_name), *a, **k)

        return policy.checkpoint(carry_name, input_name, step)

    def fold(self, init: Any, *args, unroll: int | bool | None = None, **kwargs) -> Any:
        """Runs `carry = block(carry, *args_i, **kwargs_i)` through the blocks (arguments with
        the `Block` axis or a leading dimension are sliced per block). `unroll` is ignored."""
        carry = init
        for i, block in enumerate(self.blocks):
            a, k = _slice_args(args, self.Block, i), _slice_args(kwargs, self.Block, i)
            carry = self._body(block)(carry, *a, **k)
        return carry

    def scan(self, init: Any, *args, unroll: int | bool | None = None, **kwargs) -> tuple[Any, Any]:
        """Like `fold` for blocks returning `(carry, y)`; the ys are stacked on `Block`."""
        carry, ys = init, []
        for i, block in enumerate(self.blocks):
            a, k = _slice_args(args, self.Block, i), _slice_args(kwargs, self.Block, i)
            carry, y = _pair(self._body(block)(carry, *a, **k), "BlockSeq.scan")
            ys.append(y)
        return carry, _stack_outputs(self.Block, ys)

    def fold_via(self, fn: Callable, *, unroll: int | bool | None = None) -> Callable:
        """`g(init, *args, **kw)` running `carry = fn(block, carry, *args, **kw)` (arguments are
        passed whole to every block, as in Haliax)."""

        def run(init, *args, **kwargs):
            carry = init
            for block in self.blocks:
                carry = fn(block, carry, *args, **kwargs)
            return carry

        return run

    def scan_via(self, fn: Callable, *, unroll: int | bool | None = None) -> Callable:
        """`g(init, *args, **kw) -> (carry, ys)` running `carry, y = fn(block, carry, ...)`."""

        def run(init, *args, **kwargs):
            carry, ys = init, []
            for block in self.blocks:
                carry, y = _pair(fn(block, carry, *args, **kwargs), "BlockSeq.scan_via")
                ys.append(y)
            return carry, _stack_outputs(self.Block, ys)

        return run

    def vmap_via(self, fn: Callable) -> Callable:
        """`g(*args, **kw)` applying `fn(block, *args, **kw)` to every block; outputs stacked."""
        return lambda *args, **kwargs: _stack_outputs(
            self.Block, [fn(block, *args, **kwargs) for block in self.blocks]
        )

    def __call__(self, init: Any, *args, **kwargs) -> Any:
        return self.fold(init, *args, **kwargs)

    def unstacked(self) -> tuple[M, ...]:
        """The blocks."""
        return self.blocks

    def to_state_dict(self, prefix: str | None = None) -> dict[str, Any]:
        """`hax.state_dict.to_state_dict(self, prefix)` (blocks as `prefix.0.`, `prefix.1.`)."""
        return _hax.state_dict.to_state_dict(self, prefix)

    def from_state_dict(self, state_dict: Any, prefix: str | None = None) -> BlockSeq[M]:
        """`hax.state_dict.from_state_dict(self, state_dict, prefix)`."""
        return _hax.state_dict.from_state_dict(self, state_dict, prefix)

    def get_layer(self, i: int) -> M:
        return self.blocks[i]

    def _state_dict_key_map(self) -> dict[str, str | None]:
        return {"blocks": None}  # layers are `<key>.0.`, `<key>.1.`, ...


def _pair(result: Any, where: str) -> tuple[Any, Any]:
    if not isinstance(result, tuple | list) or len(result) != 2:
        raise ValueError(
            f"{where}: the block must return a pair (carry, y), got {type(result).__name__}; "
            f"use fold for blocks that return only the carry"
        )
    return result[0], result[1]


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
