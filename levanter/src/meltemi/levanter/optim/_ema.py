"""An exponential moving average of the parameters, kept in the optimizer state.

`ema_params(beta)` is an identity transform to put LAST in a chain: it sees the final update
and the current params, so it can average the params the update produces,
`ema <- beta * ema + (1 - beta) * (params + updates)`. Keeping it in the optimizer state means
it is checkpointed with it and is left alone on a step `skip_step` skips. Read it with
`ema_of(opt_state)`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from meltemi.levanter.optim._errors import OptimizerConfigError


class EmaState(NamedTuple):
    """State of `ema_params`: the averaged parameters (same structure as the params)."""

    ema: Any


def ema_params(beta: float = 0.995, *, dtype: Any = None) -> optax.GradientTransformation:
    """Tracks `beta`-EMA of the parameters after each update; passes updates through unchanged.

    Args:
        beta: the decay (0.995 averages over roughly the last 200 steps).
        dtype: dtype of the average (default: each parameter's dtype).

    Example:
        >>> import jax.numpy as jnp, optax
        >>> tx = optax.chain(optax.sgd(1.0), ema_params(0.5))
        >>> params = {"w": jnp.zeros(2)}
        >>> state = tx.init(params)
        >>> updates, state = tx.update({"w": jnp.array([-2.0, -4.0])}, state, params)
        >>> ema_of(state)["w"].tolist()  # 0.5 * 0 + 0.5 * (0 + [2, 4])
        [1.0, 2.0]
    """
    if not 0.0 <= beta < 1.0:
        raise OptimizerConfigError(f"ema beta={beta!r} must be in [0, 1), e.g. 0.995")

    def init_fn(params: Any) -> EmaState:
        # A copy, never an alias: the params may be donated to the train step.
        return EmaState(jax.tree.map(lambda p: jnp.array(p, dtype or p.dtype, copy=True), params))

    def update_fn(updates: Any, state: EmaState, params: Any = None):
        if params is None:
            raise ValueError("ema_params needs the params: call tx.update(updates, state, params)")

        def step(e: jax.Array, p: jax.Array, u: jax.Array) -> jax.Array:
            new_p = (p + u).astype(p.dtype)  # exactly what optax.apply_updates produces
            return (beta * e + (1 - beta) * new_p.astype(e.dtype)).astype(e.dtype)

        return updates, EmaState(jax.tree.map(step, state.ema, params, updates))

    return optax.GradientTransformation(init_fn, update_fn)


def ema_of(opt_state: Any) -> Any:
    """The EMA parameters held in an optimizer state (searched through chains and wrappers).

    Raises:
        ValueError: if the state holds no `ema_params` state, or more than one.
    """
    found = [
        s
        for s in jax.tree_util.tree_leaves(opt_state, is_leaf=lambda x: isinstance(x, EmaState))
        if isinstance(s, EmaState)
    ]
    if len(found) != 1:
        raise ValueError(
            f"expected exactly one ema_params state in the optimizer state, found {len(found)}; "
            f"add ema_params(beta) as the last transform of the chain"
        )
    return found[0].ema
