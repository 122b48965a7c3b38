"""Rematerialisation (gradient checkpointing) policies for `scan`/`fold` and `nn.Stacked`.

>>> from meltemi.haliax import ScanCheckpointPolicy
>>> ScanCheckpointPolicy.from_bool_or_str("offload").save_carries
'offload'
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any, Literal

import jax
import numpy as np
from jax.ad_checkpoint import checkpoint_name

__all__ = [
    "ScanCheckpointPolicy",
    "RematSpec",
    "CARRY_NAME",
    "multilevel_scan",
    "offload_supported",
    "tree_checkpoint_name",
]

CARRY_NAME = "hax_scan_carry"
_KINDS = ("none", "save_carries", "full", "offload", "recompute", "save_all", "nested")
_Save = bool | Literal["offload"]


@dataclasses.dataclass(frozen=True)
class ScanCheckpointPolicy:
    """What a scanned stack of layers keeps for the backward pass (Haliax's fields).

    Each step's carry and scanned inputs are tagged with names, and the step is wrapped in
    `jax.checkpoint` with a policy built from these fields:

    * `save_carries` / `save_inputs`: keep (True), recompute (False) or move to host memory
      (`"offload"`) each step's input carry / scanned inputs.
    * `save_block_internals`: keep everything inside a step (True), nothing (False), or only the
      values tagged with these `checkpoint_name`s (a list).
    * `offload_block_internals`: names of tagged internals to move to host memory.
    * `disable`: no checkpointing at all; `simple`: a plain `jax.checkpoint` of each step.
    * `nested`: a two-level scan over `[outer, len // outer]` blocks that keeps only the outer
      carries (`True`: the divisor of the length closest to its square root).

    `from_bool_or_str` reads the short forms: `False`/`"none"` (keep everything), `True` (simple),
    `"save_carries"`, `"full"`/`"recompute"` (carries and inputs recomputed), `"offload"`,
    `"save_all"`, `"nested"`. Where the backend has no `pinned_host` memory, `resolved()` turns
    offloading into saving, with a warning.
    """

    save_carries: _Save = True
    save_inputs: _Save = False
    save_block_internals: bool | tuple[str, ...] = False
    offload_block_internals: tuple[str, ...] = ()
    prevent_cse: bool = False
    disable: bool = False
    simple: bool = False
    nested: bool | int = False

    def __post_init__(self):
        for f in ("save_carries", "save_inputs"):
            v = getattr(self, f)
            if v not in (True, False, "offload"):
                raise ValueError(
                    f"ScanCheckpointPolicy: {f}={v!r} must be True, False or 'offload'"
                )
        # lists (Haliax's spelling) become tuples so the policy can be a static jit field
        if isinstance(self.save_block_internals, list | tuple):
            object.__setattr__(self, "save_block_internals", tuple(self.save_block_internals))
        object.__setattr__(self, "offload_block_internals", tuple(self.offload_block_internals))

    @property
    def kind(self) -> str:
        """A one-word summary: `"none"`, `"offload"`, `"full"` or `"save_carries"`."""
        if self.disable:
            return "none"
        if "offload" in (self.save_carries, self.save_inputs) or self.offload_block_internals:
            return "offload"
        if self.save_carries is False and not self.save_block_internals:
            return "full"
        return "save_carries"

    @staticmethod
    def from_bool_or_str(value: RematSpec) -> ScanCheckpointPolicy:
        """The policy for `True`/`False`/`None`, a short name, or a policy (returned as is)."""
        if isinstance(value, ScanCheckpointPolicy):
            return value
        if value is False or value is None or value == "none":
            return ScanCheckpointPolicy(True, True, True, disable=True)
        if value is True:
            return ScanCheckpointPolicy(simple=True)
        if value in ("save_carries", "carries"):
            return ScanCheckpointPolicy(save_carries=True)
        if value in ("full", "recompute", "nothing"):
            return ScanCheckpointPolicy(save_carries=False, save_inputs=False)
        if value == "offload":
            return ScanCheckpointPolicy(save_carries="offload", save_inputs="offload")
        if value == "save_all":
            return ScanCheckpointPolicy(True, True, True)
        if value == "nested":
            return ScanCheckpointPolicy(nested=True)
        if isinstance(value, str):
            raise ValueError(
                f"ScanCheckpointPolicy: kind={value!r} is not one of {_KINDS} (or a bool); "
                f"e.g. gradient_checkpointing='save_carries'"
            )
        raise TypeError(
            f"gradient_checkpointing must be a bool, one of {_KINDS} or a ScanCheckpointPolicy, "
            f"got {value!r}"
        )

    _mk = from_bool_or_str  # Haliax's private spelling

    def resolved(self) -> ScanCheckpointPolicy:
        """The policy this backend will actually run (offloading may fall back to saving)."""
        if self.kind == "offload" and not offload_supported():
            warnings.warn(
                f"remat 'offload' needs a 'pinned_host' memory space, which backend "
                f"{jax.default_backend()!r} lacks; using 'save_carries' instead",
                stacklevel=3,
            )
            return dataclasses.replace(
                self,
                save_carries=bool(self.save_carries),
                save_inputs=bool(self.save_inputs),
                save_block_internals=self.save_block_internals or self.offload_block_internals,
                offload_block_internals=(),
            )
        return self

    def checkpoint(self, carry_name: str, input_name: str, fn: Callable) -> Callable:
        """`fn` wrapped as the policy says; the carry and inputs must be tagged with the names."""
        if self.disable:
            return fn
        if self.simple:
            return jax.checkpoint(fn, prevent_cse=self.prevent_cse)
        policy = self._to_jax_policy(carry_name, input_name)
        return jax.checkpoint(fn, policy=policy, prevent_cse=self.prevent_cse)

    def _to_jax_policy(self, carry_name: str, input_name: str) -> Any:
        save: list[str] = []
        offload: list[str] = []
        remat: list[str] = []
        for value, name in ((self.save_inputs, input_name), (self.save_carries, carry_name)):
            {True: save, "offload": offload, False: remat}[value].append(name)
        internals = self.save_block_internals
        if isinstance(internals, tuple):
            save.extend(internals)
        offload.extend(self.offload_block_internals)
        cp = jax.checkpoint_policies
        if offload:
            if internals is True:
                raise ValueError(
                    "ScanCheckpointPolicy: save_block_internals=True cannot be combined with "
                    "offloading; list the internals to save by name instead"
                )
            return cp.save_and_offload_only_these_names(
                names_which_can_be_saved=save,
                names_which_can_be_offloaded=offload,
                offload_src="device",
                offload_dst="pinned_host",
            )
        if internals is True:
            everything_but = cp.save_anything_except_these_names(*remat)
            if save:
                return cp.save_from_both_policies(everything_but, cp.save_only_these_names(*save))
            return everything_but
        if save:
            return cp.save_only_these_names(*save)
        return None

    def outer_block_size(self, length: int) -> int | None:
        """The outer scan length of a nested scan over `length` steps (None: not nested)."""
        if self.nested is False:
            return None
        if self.nested is True:
            return _closest_divisor_to_sqrt(length)
        if length % int(self.nested):
            raise ValueError(
                f"ScanCheckpointPolicy: nested={self.nested} does not divide the scan length "
                f"{length}; use a divisor of {length} or nested=True"
            )
        return int(self.nested)


def _closest_divisor_to_sqrt(n: int) -> int:
    best = 1
    for d in range(1, n + 1):
        if n % d == 0 and abs(d - n**0.5) < abs(best - n**0.5):
            best = d
    return best


def multilevel_scan(f: Callable, carry: Any, xs: Any, outer_size: int, length: int, **kw) -> Any:
    """`lax.scan` as an outer scan over `outer_size` blocks of an inner, rematerialised scan:
    only the outer carries are kept (O(sqrt(n)) memory for the sqrt(n) split)."""
    inner = length // outer_size

    def reshape(x):
        return x.reshape((outer_size, inner, *x.shape[1:]))

    xs = jax.tree.map(reshape, xs)
    reverse = kw.get("reverse", False)
    unroll = kw.get("unroll", 1)
    inner_scan = jax.remat(lambda c, x: jax.lax.scan(f, c, x, reverse=reverse, unroll=unroll))
    carry, ys = jax.lax.scan(inner_scan, carry, xs, reverse=reverse)
    return carry, jax.tree.map(lambda y: y.reshape((length, *y.shape[2:])), ys)


RematSpec = bool | str | ScanCheckpointPolicy | None


def offload_supported() -> bool:
    """Whether the default device has a `pinned_host` memory space."""
    try:
        dev = jax.devices()[0]
        return "pinned_host" in [m.kind for m in dev.addressable_memories()]
    except Exception:  # backends without memory introspection
        return False


def tree_checkpoint_name(x: Any, name: str) -> Any:
    """`jax.ad_checkpoint.checkpoint_name(leaf, name)` on every array leaf of a pytree, so a
    policy with `save_names=(name,)` keeps (or offloads) all of them.

    >>> import jax.numpy as jnp
    >>> tree_checkpoint_name({"a": jnp.ones(3), "n": 1}, "h")["n"]
    1
    """

    def tag(leaf):
        return checkpoint_name(leaf, name) if isinstance(leaf, jax.Array | np.ndarray) else leaf

    return jax.tree.map(tag, x)
