"""`plan(spec, devices) -> Plan`: the mesh, shardings, batch schedule and step of a run.

The trainer and `--dry_run` both start here, so what the dry run compiles is what training
runs: `Trainer` adds data, state and the loop; the dry run adds `lower().compile()` and a
memory report.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import meltemi.models as mm
from meltemi.levanter import optim
from meltemi.levanter.config import BatchSizes, ConfigError, RunSpec, optimizer_error
from meltemi.levanter.mesh import (
    PARAMETER_RULES,
    MeshConfigError,
    check_sequence_split,
    data_parallel_size,
)
from meltemi.levanter.runtime import (
    DTYPES,
    batch_sharding,
    compute_context,
    make_loss_fns,
    make_preference_loss_fns,
    mesh_of,
    tree_shardings,
    with_shardings,
)
from meltemi.levanter.trainer._lora import lora_init, lora_loss, lora_optimizer
from meltemi.levanter.trainer._step import TrainState, init_state, make_train_step


@dataclasses.dataclass(frozen=True)
class StepParts:
    """What the step is made of (no data): the model, its loss, the optimizer, a batch's rows.

    Attributes:
        init_model: `init_model(key)` -> the model (an equinox module).
        loss_fn: `loss_fn(model, batch)` -> mean training loss (z-loss included).
        optimizer: the optax transform.
        metrics_fn: optimizer state -> logged scalars.
        batch_fields: the shape (without the batch dimension) and dtype of each batch array
            (`plan` needs them; in `RunParts`, None reads them from the data's row 0).
        has_aux: `loss_fn` returns `(loss, metrics)` (a preference objective).
        reference: the state holds a frozen reference model (`TrainState.reference`).
    """

    init_model: Callable[[Any], Any]
    loss_fn: Callable[[Any, Mapping[str, Any]], Any]
    optimizer: optax.GradientTransformation
    metrics_fn: Callable[[Any], Mapping[str, Any]] | None = None
    batch_fields: Mapping[str, jax.ShapeDtypeStruct] | None = None
    has_aux: bool = False
    reference: bool = False


def batch_fields(spec: RunSpec) -> dict[str, jax.ShapeDtypeStruct]:
    """The arrays of one row of the configured data (`meltemi.data` packed rows).

    Example:
        >>> from meltemi.levanter.config import base_config, resolve, with_variant
        >>> sorted(batch_fields(resolve(with_variant(base_config(), None, {}))))
        ['loss_mask', 'positions', 'segment_ids', 'targets', 'tokens']
    """
    seq = (spec.data.seq_len,)
    fields = {
        "tokens": jax.ShapeDtypeStruct(seq, jnp.int32),
        "targets": jax.ShapeDtypeStruct(seq, jnp.int32),
        "loss_mask": jax.ShapeDtypeStruct(seq, jnp.float32),
        "segment_ids": jax.ShapeDtypeStruct(seq, jnp.int32),
        "positions": jax.ShapeDtypeStruct(seq, jnp.int32),
    }
    if spec.data.mixture is not None:
        fields["component"] = jax.ShapeDtypeStruct((), jnp.int32)
    if spec.trainer.objective != "lm":  # preference pairs (meltemi.data preference stores)
        fields["pair_ids"] = jax.ShapeDtypeStruct(seq, jnp.int32)
        fields["is_chosen"] = jax.ShapeDtypeStruct(seq, jnp.int32)
        if uses_precomputed_reference(spec):
            fields["reference_logps"] = jax.ShapeDtypeStruct(seq, jnp.float32)
    return fields


def uses_precomputed_reference(spec: RunSpec) -> bool:
    """DPO/IPO with `trainer.reference="precomputed"`: batches carry `reference_logps`."""
    t = spec.trainer
    return t.objective in ("dpo", "ipo") and t.reference == "precomputed"


def holds_reference(spec: RunSpec) -> bool:
    """The state holds a frozen reference copy: DPO/IPO, live reference, no LoRA (whose
    reference is its own base model)."""
    t = spec.trainer
    return t.objective in ("dpo", "ipo") and t.reference == "live" and not spec.lora.enabled


def fields_of(rows: Mapping[str, np.ndarray]) -> dict[str, jax.ShapeDtypeStruct]:
    """The per-row fields of a host batch (e.g. one row read from a data source)."""
    return {
        k: jax.ShapeDtypeStruct(np.asarray(v).shape[1:], np.asarray(v).dtype)
        for k, v in rows.items()
    }


def build_optimizer(spec: RunSpec) -> optax.GradientTransformation:
    """The optimizer chain of `spec.optimizer` (checked by `resolve` already)."""
    try:
        tx, _ = optim.build_optimizer(spec.optimizer, total_steps=spec.trainer.num_train_steps)
    except optim.OptimizerConfigError as e:
        raise optimizer_error(e) from None
    return lora_optimizer(spec, tx)


def model_parts(spec: RunSpec) -> StepParts:
    """The step of `spec`'s model (`meltemi.models`), loss, optimizer and packed rows.

    `plan(spec)` (the dry run) and `build_parts(spec)` (the trainer) both build the step here.
    """
    config = spec.model
    optimizer = build_optimizer(spec)  # its errors first
    t = spec.trainer
    if t.objective == "lm":
        loss_fn, _ = make_loss_fns(t.z_loss)
    else:
        loss_fn, _ = make_preference_loss_fns(
            t.objective, beta=t.beta, label_smoothing=t.label_smoothing, gamma=t.simpo_gamma
        )
    return StepParts(
        init_model=lora_init(spec, lambda key: mm.Transformer.init(config, key=key)),
        loss_fn=lora_loss(spec, loss_fn),
        optimizer=optimizer,
        metrics_fn=optim.metrics,
        batch_fields=batch_fields(spec),
        has_aux=t.objective != "lm",
        reference=holds_reference(spec),
    )


def _check_batches(spec: RunSpec, mesh: jax.sharding.Mesh) -> None:
    micro = spec.trainer.microbatches
    dp = data_parallel_size(mesh)
    for start, size in spec.trainer.batch_sizes.segments:
        if (size // micro) % dp:
            raise ConfigError(
                f"trainer.train_batch_size: the microbatch of {size // micro} rows (batch {size}"
                f" from step {start} / trainer.microbatches={micro}) does not split over the "
                f"{dp} data-parallel devices (mesh replica x data x fsdp); use a batch size "
                f"that is a multiple of {dp * micro}."
            )
        if size % jax.process_count():
            raise ConfigError(
                f"trainer.train_batch_size: batch size {size} (from step {start}) does not split"
                f" over {jax.process_count()} processes."
            )


@dataclasses.dataclass
class Plan:
    """A run laid out on devices, before any array exists.

    Attributes:
        spec: the checked config.
        mesh: the device mesh.
        batch_sizes: the batch size of every step.
        static: the model's non-array half (closed over by the step).
        template: the train state as `ShapeDtypeStruct`s carrying their shardings.
        state_sharding: the train state's shardings (a prefix tree of the state).
        batch_sharding: every batch array's sharding (rows over the data-parallel axes).
        parts: the model, loss, optimizer and batch fields the step is made of.
        step_fn: the jitted step `(state, batch) -> (state, metrics)`, state donated.
        compute_dtype: the dtype the forward and backward pass run in.
    """

    spec: RunSpec
    mesh: jax.sharding.Mesh
    batch_sizes: BatchSizes
    static: Any
    template: TrainState
    state_sharding: Any
    batch_sharding: jax.sharding.NamedSharding
    parts: StepParts
    step_fn: Any
    compute_dtype: Any
    _compiled: dict[int, Any] = dataclasses.field(default_factory=dict, repr=False)
    compile_s: dict[int, float] = dataclasses.field(default_factory=dict, repr=False)

    def abstract_batch(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
        """A global batch of `batch_size` rows, as shapes with shardings."""
        return {
            k: jax.ShapeDtypeStruct((batch_size, *f.shape), f.dtype, sharding=self.batch_sharding)
            for k, f in self.parts.batch_fields.items()
        }

    def lower(self, batch_size: int) -> Any:
        """The step lowered for one batch size (nothing compiled yet)."""
        with compute_context(self.mesh):
            return self.step_fn.lower(self.template, self.abstract_batch(batch_size))

    def compile(self, batch_size: int) -> Any:
        """The step compiled ahead of time for one batch size (cached)."""
        if batch_size not in self._compiled:
            start = time.perf_counter()
            lowered = self.lower(batch_size)
            with compute_context(self.mesh):
                self._compiled[batch_size] = lowered.compile()
            self.compile_s[batch_size] = time.perf_counter() - start
        return self._compiled[batch_size]

    def signature(self, batch_size: int | None = None) -> dict[str, Any]:
        """What the step takes: every input's shape, dtype and partition spec, by path.

        Two plans with equal signatures compile the same step (the dry run's test compares
        the dry run's with the trainer's).
        """
        size = self.batch_sizes.size_at(0) if batch_size is None else batch_size
        args = {"state": self.template, "batch": self.abstract_batch(size)}
        out = {}
        for path, leaf in jax.tree_util.tree_flatten_with_path(args)[0]:
            out[jax.tree_util.keystr(path)] = (
                tuple(leaf.shape),
                str(leaf.dtype),
                leaf.sharding.spec if leaf.sharding is not None else None,
            )
        return out

    def init_state(self, key: jax.Array) -> TrainState:
        """The freshly initialised state (params from `key`), sharded on the mesh."""
        parts = self.parts

        def init(k):
            params = eqx.filter(parts.init_model(k), eqx.is_array)
            return init_state(params, parts.optimizer, reference=parts.reference)

        with compute_context(self.mesh):
            return jax.jit(init, out_shardings=self.state_sharding)(key)


def plan(
    spec: RunSpec,
    devices: Sequence[jax.Device] | None = None,
    *,
    mesh: jax.sharding.Mesh | None = None,
    parts: StepParts | None = None,
) -> Plan:
    """Lays `spec` out on `devices` (or `mesh`): shardings, batch schedule and the step.

    Args:
        spec: the checked config (`meltemi.levanter.config.resolve`).
        devices: the devices of the mesh (default: every device); ignored with `mesh`.
        mesh: a mesh to use instead of building `spec.mesh`'s.
        parts: the step's model/loss/optimizer/batch fields (default: `model_parts(spec)`).

    Raises:
        ConfigError: the mesh does not fit the devices, or a batch does not split over them.
    """
    mesh = mesh if mesh is not None else mesh_of(spec, devices)
    _check_batches(spec, mesh)
    try:  # the sequence split's length and strategy, before any work
        split = dict(mesh.shape).get("sequence", 1)
        check_sequence_split(split, spec.data.seq_len, spec.model.sequence_parallel)
    except MeshConfigError as e:
        raise ConfigError(str(e)) from None
    parts = parts if parts is not None else model_parts(spec)
    if parts.batch_fields is None:
        raise ValueError("plan: parts.batch_fields is None; pass RunParts.checked_step()")
    key = jax.random.key(spec.trainer.seed)
    abstract_model = eqx.filter_eval_shape(parts.init_model, key)
    is_abstract = lambda x: isinstance(x, jax.ShapeDtypeStruct)  # noqa: E731
    abstract_params, static = eqx.partition(abstract_model, is_abstract)
    abstract_state = jax.eval_shape(
        lambda p: init_state(p, parts.optimizer, reference=parts.reference), abstract_params
    )
    state_sharding = tree_shardings(abstract_state, mesh, PARAMETER_RULES)
    bsh = batch_sharding(mesh)
    compute_dtype = DTYPES[spec.trainer.compute_dtype]
    with compute_context(mesh):
        step_fn = make_train_step(
            parts.loss_fn,
            parts.optimizer,
            static,
            microbatches=spec.trainer.microbatches,
            compute_dtype=compute_dtype,
            metrics_fn=parts.metrics_fn,
            state_sharding=state_sharding,
            batch_sharding=bsh,
            mesh=mesh,
            has_aux=parts.has_aux,
        )
    return Plan(
        spec=spec,
        mesh=mesh,
        batch_sizes=spec.trainer.batch_sizes,
        static=static,
        template=with_shardings(state_sharding, abstract_state),
        state_sharding=state_sharding,
        batch_sharding=bsh,
        parts=parts,
        step_fn=step_fn,
        compute_dtype=compute_dtype,
    )


def shard_bytes(tree: Any) -> int:
    """Per-device bytes of the ShapeDtypeStructs of `tree` (with their shardings)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
        total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
    return total
