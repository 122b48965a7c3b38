"""Rematerialisation (gradient checkpointing) policies for `scan`/`fold` and `nn.Stacked`.

>>> from meltemi.haliax import ScanCheckpointPolicy
>>> ScanCheckpointPolicy.from_bool_or_str(True).kind
'save_carries'
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
    "offload_supported",
    "tree_checkpoint_name",
]

CARRY_NAME = "hax_scan_carry"
_KINDS = ("none", "save_carries", "full", "offload")


@dataclasses.dataclass(frozen=True)
class ScanCheckpointPolicy:
    """How much of a scanned stack of layers to keep for the backward pass.

    kinds:
      * `"none"` (False): keep every intermediate (fastest, most memory).
      * `"save_carries"` (True): keep each layer's input carry, recompute layer internals.
      * `"full"`: keep only the first carry; recompute the carries and the internals.
      * `"offload"`: like `"save_carries"` but the carries live in host memory, where the backend
        has a `pinned_host` memory space; elsewhere it falls back to `"save_carries"` with a
        warning.
    `save_names`: names (from `jax.ad_checkpoint.checkpoint_name`) of block internals to keep too.
    """

    kind: Literal["none", "save_carries", "full", "offload"] = "save_carries"
    save_names: tuple[str, ...] = ()
    prevent_cse: bool = False

    def __post_init__(self):
        if self.kind not in _KINDS:
            raise ValueError(
                f"ScanCheckpointPolicy: kind={self.kind!r} is not one of {_KINDS}; "
                f"e.g. ScanCheckpointPolicy('save_carries')"
            )

    @staticmethod
    def from_bool_or_str(value: RematSpec) -> ScanCheckpointPolicy:
        if isinstance(value, ScanCheckpointPolicy):
            return value
        if value is False or value is None:
            return ScanCheckpointPolicy("none")
        if value is True:
            return ScanCheckpointPolicy("save_carries")
        if isinstance(value, str):
            aliases = {"recompute": "full", "nothing": "full", "carries": "save_carries"}
            return ScanCheckpointPolicy(aliases.get(value, value))  # type: ignore[arg-type]
        raise TypeError(
            f"gradient_checkpointing must be a bool, one of {_KINDS} or a ScanCheckpointPolicy, "
            f"got {value!r}"
        )

    def resolved(self) -> ScanCheckpointPolicy:
        """The policy this backend will actually run (offload may fall back)."""
        if self.kind == "offload" and not offload_supported():
            warnings.warn(
                f"remat 'offload' needs a 'pinned_host' memory space, which backend "
                f"{jax.default_backend()!r} lacks; using 'save_carries' instead",
                stacklevel=3,
            )
            return dataclasses.replace(self, kind="save_carries")
        return self

    def _block_policy(self):
        if self.save_names:
            return jax.checkpoint_policies.save_only_these_names(*self.save_names)
        return None

    def wrap_body(self, body: Callable) -> Callable:
        """Checkpoints one scan step `(carry, x) -> (carry, y)` as the policy says."""
        if self.kind == "none":
            return body
        if self.kind == "offload":
            # The step's input carry is tagged and offloaded, so it (on the host), not the
            # device copy, is what the backward pass keeps for each step.
            policy = jax.checkpoint_policies.save_and_offload_only_these_names(
                names_which_can_be_saved=list(self.save_names),
                names_which_can_be_offloaded=[CARRY_NAME],
                offload_src="device",
                offload_dst="pinned_host",
            )

            def tagged(carry, x):
                carry = jax.tree.map(lambda c: checkpoint_name(c, CARRY_NAME), carry)
                return body(carry, x)

            return jax.checkpoint(tagged, policy=policy, prevent_cse=self.prevent_cse)
        return jax.checkpoint(body, policy=self._block_policy(), prevent_cse=self.prevent_cse)

    def wrap_scan(self, run: Callable) -> Callable:
        """Checkpoints the whole loop, for the kinds that recompute or move the carries."""
        if self.kind == "full":
            return jax.checkpoint(run, prevent_cse=self.prevent_cse)
        return run


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
