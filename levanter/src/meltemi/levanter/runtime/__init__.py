"""The runtime floor: what the trainer, evaluation and the harness share below all of them.

The compute context (mesh and logical-axis rules) model code is traced in, the mesh of a
config, dtypes and casting, shardings of trees and batches, global batches from process-local
rows, padding of eval batches, the language-model and preference loss functions and display
paths. It imports no trainer, evaluation, harness or multislice module.

Example:
    >>> import jax.numpy as jnp
    >>> from meltemi.levanter.runtime import cast_floating
    >>> cast_floating({"w": jnp.ones(2), "i": jnp.arange(2)}, jnp.bfloat16)["w"].dtype
    dtype(bfloat16)
"""

from meltemi.levanter.runtime._arrays import DTYPES, cast_floating, pad_rows
from meltemi.levanter.runtime._context import compute_context, mesh_of
from meltemi.levanter.runtime._files import display_path
from meltemi.levanter.runtime._loss import make_loss_fns
from meltemi.levanter.runtime._preference import (
    make_preference_loss_fns,
    token_logps,
    without_adapters,
)
from meltemi.levanter.runtime._sharding import (
    batch_sharding,
    global_batch,
    tree_shardings,
    with_shardings,
)

__all__ = [
    "DTYPES",
    "batch_sharding",
    "cast_floating",
    "compute_context",
    "display_path",
    "global_batch",
    "make_loss_fns",
    "make_preference_loss_fns",
    "mesh_of",
    "pad_rows",
    "token_logps",
    "tree_shardings",
    "with_shardings",
    "without_adapters",
]
