"""Per-parameter learning-rate multipliers, chosen by path pattern.

`multiply_by_path(((r"lm_head", 0.5), (r"norm", 2.0)))` goes right after the optimizer's lr
scaling: it multiplies the update of every parameter whose `/`-joined, lower-cased path
matches a pattern (`re.search`; the first matching pattern wins) by that pattern's factor.
Since the update already includes the decoupled weight decay, the factor scales the whole
step, decay included, exactly as a per-parameter learning rate would.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

from meltemi.levanter.optim._errors import OptimizerConfigError
from meltemi.levanter.optim._named import map_params_with_path


def check_multipliers(
    multipliers: Sequence[tuple[str, float]], field: str = "lr_multipliers"
) -> tuple[tuple[str, float], ...]:
    """Validates `(path regex, factor)` pairs; returns them as a tuple of tuples."""
    example = f'{field}=((r"lm_head", 0.5),)'
    if isinstance(multipliers, str) or not isinstance(multipliers, (list, tuple)):
        raise OptimizerConfigError(
            f"{field}={multipliers!r} must be (pattern, factor) pairs, e.g. {example}"
        )
    out = []
    for pair in multipliers:
        if (
            not isinstance(pair, (list, tuple))
            or len(pair) != 2
            or not isinstance(pair[0], str)
            or isinstance(pair[1], bool)
            or not isinstance(pair[1], (int, float))
        ):
            raise OptimizerConfigError(
                f"{field}: {pair!r} is not a (pattern, factor) pair, e.g. {example}"
            )
        pattern, factor = pair
        try:
            re.compile(pattern)
        except re.error as e:
            raise OptimizerConfigError(
                f"{field}: pattern {pattern!r} is not a regular expression ({e})"
            ) from None
        if not factor >= 0:
            raise OptimizerConfigError(f"{field}: factor {factor!r} for {pattern!r} must be >= 0")
        out.append((pattern, float(factor)))
    return tuple(out)


def path_multipliers(params: Any, multipliers: Sequence[tuple[str, float]]) -> Any:
    """The factor of every parameter (1.0 where no pattern matches), as a prefix tree.

    Example:
        >>> import jax.numpy as jnp
        >>> path_multipliers({"lm_head": jnp.ones(2), "w": jnp.ones(2)}, [("lm_head", 0.5)])
        {'lm_head': 0.5, 'w': 1.0}
    """
    compiled = [(re.compile(p), f) for p, f in multipliers]

    def factor(path: str, _: Any) -> float:
        for c, f in compiled:
            if c.search(path.lower()):
                return f
        return 1.0

    return map_params_with_path(factor, params)


def multiply_by_path(multipliers: Sequence[tuple[str, float]]) -> optax.GradientTransformation:
    """Multiplies each parameter's update by the factor of the first pattern its path matches.

    Example:
        >>> import jax.numpy as jnp
        >>> tx = multiply_by_path([("head", 0.5)])
        >>> u, _ = tx.update({"head": jnp.ones(2), "w": jnp.ones(2)}, tx.init(None))
        >>> u["head"].tolist(), u["w"].tolist()
        ([0.5, 0.5], [1.0, 1.0])
    """
    multipliers = check_multipliers(multipliers)

    def update_fn(updates: Any, state: Any, params: Any = None):
        del params
        factors = path_multipliers(updates, multipliers)

        def scale(f: float, u: Any) -> Any:
            if f == 1.0:
                return u
            return jax.tree.map(lambda x: x * jnp.asarray(f, x.dtype), u)

        return jax.tree.map(scale, factors, updates), state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)
