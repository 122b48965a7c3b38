"""Dtypes by config name, casting a pytree's floating arrays, padding a host batch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

#: `trainer.compute_dtype` names and their dtypes.
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def cast_floating(tree: Any, dtype: Any) -> Any:
    """Casts the floating arrays of a pytree to `dtype` (integers are left alone)."""

    def cast(x):
        if eqx.is_array(x) and jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype:
            return x.astype(dtype)
        return x

    return jax.tree.map(cast, tree)


def pad_rows(batch: Mapping[str, np.ndarray], multiple: int) -> dict[str, np.ndarray]:
    """Pads a host batch with masked-out rows to a multiple of `multiple` rows.

    Example:
        >>> import numpy as np
        >>> b = pad_rows({"tokens": np.ones((3, 2)), "loss_mask": np.ones((3, 2))}, 4)
        >>> b["tokens"].shape, b["loss_mask"][3].tolist()
        ((4, 2), [0.0, 0.0])
    """
    batch = {k: np.asarray(v) for k, v in batch.items()}
    rows = len(next(iter(batch.values())))
    extra = -rows % multiple
    if not extra:
        return batch
    out = {}
    for key, value in batch.items():
        fill = np.zeros((extra,) + value.shape[1:], value.dtype)
        if key != "loss_mask":
            fill[...] = value[:1]  # valid tokens; their loss is masked out
        out[key] = np.concatenate([value, fill])
    return out
