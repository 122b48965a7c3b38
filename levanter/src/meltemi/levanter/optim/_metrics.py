"""What the trainer logs: every stats-bearing optimizer state registers how to read its metrics.

`metrics(opt_state)` walks any optimizer state (chains, `optax.masked`, `multi_transform`,
`skip_step`, ...) and returns a flat dict of scalars. Names are stable:

| name | from | meaning |
|---|---|---|
| `learning_rate` | `scale_by_learning_rate` | lr applied at the last step |
| `weight_decay` | `add_decayed_weights` | effective decay (AdamC scales it by lr_t / lr_max) |
| `grad_clip_norm`, `grad_clip_threshold`, `grad_clipped` | `clip_by_global_norm` | pre-clip |
| `update_clip_norm`, `update_clip_threshold`, `update_clipped` | `clip_update_norm` | unclipped |
| `skip/skipped`, `skip/reason`, `skip/loss`, `skip/grad_norm`, ... | `skip_step` | see below |

`skip/reason` is a bit set (`SKIP_REASONS`): decode it on the host with `skip_reasons(code)`.
A second transform of the same kind gets a suffix (`grad_norm_1`); the groups of
`optax.multi_transform` (Muon's `muon` and `adam`) prefix their names (`muon/learning_rate`).
The clipping norms are `grad_clip_norm` / `update_clip_norm`, not `grad_norm` / `update_norm`:
those are the trainer step's own measurements (of the gradients and of the applied update),
which differ from the transforms' on a skipped step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import optax

_READERS: dict[type, Callable[[Any], dict[str, jax.Array]]] = {}

#: Bit of `skip/reason` -> why the step was skipped.
SKIP_REASONS: dict[int, str] = {
    1: "loss_not_finite",
    2: "grad_norm_not_finite",
    4: "loss_spike",
    8: "grad_norm_spike",
}


def register_metrics(cls: type) -> type:
    """Class decorator: a NamedTuple state whose `_metrics()` method gives its metrics."""
    _READERS[cls] = cls._metrics
    return cls


def metrics(opt_state: Any) -> dict[str, jax.Array]:
    """Flat dict of the scalars every Meltemi transform records in its state.

    Works on a jitted step's returned state (values are arrays; call `jax.device_get` to log).
    On a step skipped by `skip_step`, metrics of the transforms inside it are those of the last
    applied step; `skip/...` metrics describe the current step.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> from meltemi.levanter.optim import clip_by_global_norm
        >>> tx = clip_by_global_norm(1.0)
        >>> _, state = tx.update({"w": jnp.array([3.0, 4.0])}, tx.init({"w": jnp.zeros(2)}))
        >>> {k: float(v) for k, v in metrics(state).items()}
        {'grad_clip_norm': 5.0, 'grad_clip_threshold': 1.0, 'grad_clipped': 1.0}
    """
    out: dict[str, jax.Array] = {}

    def visit(node: Any, prefix: str) -> None:
        if isinstance(node, optax.transforms.PartitionState):  # multi_transform: name the group
            for group in sorted(node.inner_states):
                visit(node.inner_states[group], f"{prefix}{group}/")
            return
        reader = _READERS.get(type(node))
        if reader is not None:
            for name, value in reader(node).items():
                key, i = prefix + name, 0
                while key in out:
                    i += 1
                    key = f"{prefix}{name}_{i}"
                out[key] = value
        # Stats-bearing states can hold others (skip_step holds the whole inner chain).
        for child in jax.tree_util.tree_leaves(
            node, is_leaf=lambda x: x is not node and _is_stop(x)
        ):
            if child is not node and _is_stop(child):
                visit(child, prefix)

    visit(opt_state, "")
    return out


def _is_stop(x: Any) -> bool:
    return type(x) in _READERS or isinstance(x, optax.transforms.PartitionState)


def skip_reasons(code: int) -> list[str]:
    """Names of the reasons set in a `skip/reason` bit set (host-side).

    Example:
        >>> skip_reasons(5)
        ['loss_not_finite', 'loss_spike']
    """
    code = int(code)
    return [name for bit, name in SKIP_REASONS.items() if code & bit]
