"""Test tools: run the ragged expert-parallel exchange on CPU.

XLA:CPU cannot compile `jax.lax.ragged_all_to_all`, so tests (and `//models:bench`, which
measures the ragged exchange's traffic on 8 fake CPU devices) run it inside
`ragged_all_to_all_on_cpu()`, where the primitive's CPU lowering is `emulate_ragged_all_to_all`:
the op's documented semantics built from dense collectives, moving n times the data of the real
op. Never a substitute on real hardware; no product module imports this one.

The lowering is registered with the public `jax.interpreters.mlir.register_lowering`. Putting
back what was there before on exit needs JAX's private table of per-platform lowerings
(`mlir._platform_specific_lowerings`), checked once at import against the tested JAX (0.10;
`meltemi-models` requires `jax<0.11`). If that check fails, one warning says so and the
emulating lowering stays registered after the first block: outside a block, lowering
`ragged_all_to_all` on CPU then raises `NotImplementedError` (it could not be compiled there
anyway).

>>> import jax, jax.numpy as jnp, numpy as np
>>> from meltemi.models import testing
>>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
>>> ones = jnp.ones(1, jnp.int32)
>>> def send(x):
...     return jax.lax.ragged_all_to_all(
...         x, jnp.zeros(3), ones, ones, 0 * ones, ones, axis_name="x")
>>> f = jax.jit(jax.shard_map(send, mesh=mesh, in_specs=jax.P(), out_specs=jax.P()))
>>> with testing.ragged_all_to_all_on_cpu():
...     f(jnp.array([1.0, 2.0, 3.0])).tolist()  # row 1, to row 0
[2.0, 0.0, 0.0]
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import warnings
from collections.abc import Iterator, MutableMapping
from typing import Any

import jax
import jax.numpy as jnp
from jax.interpreters import mlir

from meltemi.models.moe import _ragged

__all__ = ["emulate_ragged_all_to_all", "ragged_all_to_all_on_cpu"]


def emulate_ragged_all_to_all(
    operand: jax.Array,
    output: jax.Array,
    input_offsets: jax.Array,
    send_sizes: jax.Array,
    output_offsets: jax.Array,
    recv_sizes: jax.Array,
    *,
    axis_name: str | tuple[str, ...],
    axis_index_groups: object = None,
) -> jax.Array:
    """`jax.lax.ragged_all_to_all` from dense ops (its docstring's pseudocode), differentiable.

    Each sender packs its N chunks into `[N, rows, ...]` (rows = its operand's length, zeros
    past each chunk's size), one dense `all_to_all` delivers chunk i to device
    `i // (N / n)`, and each receiver writes `recv_sizes[i]` rows of the i-th chunk it got at
    the offset its sender gave (`all_to_all(output_offsets)`). It moves n times the data of
    the real op: a test tool, never a substitute on real hardware.

    Args:
        operand: `[rows, ...]` the sender's data.
        output: `[M, ...]` the receiver's buffer, returned with the received chunks written.
        input_offsets: `[N]` where each sent chunk starts in `operand`.
        send_sizes: `[N]` the size of each sent chunk.
        output_offsets: `[N]` where each sent chunk starts on its receiver.
        recv_sizes: `[N]` the size of each received chunk.
        axis_name: the mapped axis.
        axis_index_groups: unsupported (must be None).
    """
    if axis_index_groups is not None:
        raise NotImplementedError(
            f"emulate_ragged_all_to_all: axis_index_groups={axis_index_groups!r} is not "
            "supported; pass axis_index_groups=None"
        )
    n = jax.lax.psum(1, axis_name)
    chunks, rows = send_sizes.shape[0], operand.shape[0]
    r = jnp.arange(rows)
    trailing = (1,) * (operand.ndim - 1)
    taken = jnp.take(operand, jnp.clip(input_offsets[:, None] + r, 0, rows - 1), axis=0)
    valid = (r < send_sizes[:, None]).reshape(chunks, rows, *trailing)
    packed = jnp.where(valid, taken, jnp.zeros((), operand.dtype))
    packed = packed.reshape(n, chunks // n, rows, *operand.shape[1:])
    got = jax.lax.all_to_all(packed, axis_name, 0, 0).reshape(chunks * rows, *operand.shape[1:])
    offsets = jax.lax.all_to_all(output_offsets, axis_name, 0, 0, tiled=True)
    where = jnp.where(r < recv_sizes[:, None], offsets[:, None] + r, output.shape[0])
    return output.at[where.reshape(-1)].set(got.astype(output.dtype), mode="drop")


def _cpu_lowerings(module: Any = mlir) -> MutableMapping | None:
    """JAX's CPU lowering table (`module._platform_specific_lowerings["cpu"]`, private) if
    it and the public `register_lowering` / `lower_fun` have the shapes this module was tested
    with (jax 0.10); else None, after one warning."""
    try:
        table = module._platform_specific_lowerings["cpu"]
        register = inspect.signature(module.register_lowering).parameters
        lower = inspect.signature(module.lower_fun).parameters
        ok = (
            isinstance(table, MutableMapping)
            and list(register)[:3] == ["prim", "rule", "platform"]
            and list(lower)[:2] == ["fun", "multiple_results"]
        )
    except (AttributeError, KeyError, TypeError, ValueError):
        ok = False
    if ok:
        return table
    warnings.warn(
        f"meltemi.models.testing: jax {jax.__version__} lacks "
        "jax.interpreters.mlir._platform_specific_lowerings['cpu'] (or register_lowering / "
        "lower_fun changed), tested with jax 0.10. The CPU emulation of ragged_all_to_all "
        "then stays registered after its first block, and lowering the op on CPU outside a "
        "block raises NotImplementedError. Fix: install jax>=0.10,<0.11 (meltemi-models' "
        "bound)",
        RuntimeWarning,
        stacklevel=2,
    )
    return None


_CPU_LOWERINGS = _cpu_lowerings()
_ACTIVE = False
"""True inside `ragged_all_to_all_on_cpu`."""


@functools.cache
def _primitive() -> Any:
    """The primitive `jax.lax.ragged_all_to_all` binds (read from a jaxpr: public API)."""
    z = jnp.zeros(1, jnp.int32)
    call = lambda x: jax.lax.ragged_all_to_all(x, x, z, z, z, z, axis_name="x")  # noqa: E731
    jaxpr = jax.make_jaxpr(call, axis_env=[("x", 1)])(jnp.zeros(1))
    (eqn,) = [e for e in jaxpr.eqns if e.primitive.name == "ragged_all_to_all"]
    return eqn.primitive


_EMULATED = mlir.lower_fun(emulate_ragged_all_to_all, multiple_results=False)


def _lowering(ctx: Any, *args: Any, **params: Any) -> Any:
    if not _ACTIVE:  # only reachable when the table could not be restored (see the docstring)
        raise NotImplementedError(
            "ragged_all_to_all has no CPU lowering outside "
            "meltemi.models.testing.ragged_all_to_all_on_cpu(); lower and compile the call "
            "inside `with ragged_all_to_all_on_cpu():`"
        )
    return _EMULATED(ctx, *args, **params)


@contextlib.contextmanager
def ragged_all_to_all_on_cpu() -> Iterator[None]:
    """Within: `ragged_all_to_all` compiles on CPU, lowered as `emulate_ragged_all_to_all`,
    and `MoeConfig.ep_exchange="ragged"` is accepted on CPU.

    The primitive stays the real one, so its JVP and transpose rules run (the backward pass
    is made of `ragged_all_to_all`s too); only the CPU lowering of each one is swapped. Calls
    must trace and compile inside the block.
    """
    global _ACTIVE
    prim = _primitive()
    before = None if _CPU_LOWERINGS is None else _CPU_LOWERINGS.get(prim)
    mlir.register_lowering(prim, _lowering, "cpu")
    _ACTIVE = True
    try:
        with _ragged.allowed_on_cpu():
            yield
    finally:
        _ACTIVE = False
        if _CPU_LOWERINGS is not None:
            if before is None:
                _CPU_LOWERINGS.pop(prim, None)
            else:
                _CPU_LOWERINGS[prim] = before
