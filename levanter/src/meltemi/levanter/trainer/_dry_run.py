"""`--dry_run`: compile the train step of a config on a virtual mesh, without running it.

The model, optimizer state and batch exist only as `jax.ShapeDtypeStruct`s with shardings, so
a 32B model "fits" on a laptop: XLA compiles the per-device SPMD program for N virtual CPU
devices and reports what each device would hold (arguments, temporaries, outputs) and the
FLOPs it would execute. Memory figures are XLA's buffer assignment for that program; a TPU or
GPU compiler lays buffers out differently, so treat them as an estimate of the same order.
"""

from __future__ import annotations

import dataclasses
import math
import time

import equinox as eqx
import jax
import jax.numpy as jnp

import meltemi.models as mm
from meltemi.levanter import optim
from meltemi.levanter.config import ResolvedConfig
from meltemi.levanter.mesh import PARAMETER_RULES, MeshShape, make_mesh
from meltemi.levanter.trainer._build import abstract_parts, make_loss_fns
from meltemi.levanter.trainer._loop import TrainerError, compute_context
from meltemi.levanter.trainer._sharding import batch_sharding, tree_shardings, with_shardings
from meltemi.levanter.trainer._step import DTYPES, init_state, make_train_step


@dataclasses.dataclass
class DryRunReport:
    """What one train step of a config costs, per device, on a virtual mesh."""

    preset: str
    num_devices: int
    mesh: dict[str, int]
    num_params: int
    tokens_per_step: int
    model_flops_per_step: float
    compiled_flops_per_device: float | None
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    code_bytes: int
    compile_s: float

    @property
    def peak_bytes(self) -> int:
        """Arguments + temporaries + outputs not aliased to (donated) arguments."""
        return self.argument_bytes + self.temp_bytes + self.output_bytes - self.alias_bytes

    def format(self) -> str:
        gib = 1024**3
        mesh = " x ".join(f"{k}={v}" for k, v in self.mesh.items() if v > 1) or "1 device"
        lines = [
            f"dry run: {self.preset}, {self.num_params / 1e9:.2f}B parameters",
            f"  mesh: {self.num_devices} devices ({mesh})",
            f"  tokens per step: {self.tokens_per_step:,}",
            f"  model FLOPs per step: {self.model_flops_per_step:.3e} "
            f"({self.model_flops_per_step / self.num_devices:.3e} per device)",
        ]
        if self.compiled_flops_per_device:
            lines.append(
                f"  XLA cost analysis per device: {self.compiled_flops_per_device:.3e} FLOPs "
                "(counts a scanned layer stack once)"
            )
        lines += [
            "  memory per device:",
            f"    arguments (params, optimizer state, batch): {self.argument_bytes / gib:.2f} GiB",
            f"    temporaries (activations, gradients):       {self.temp_bytes / gib:.2f} GiB",
            f"    outputs not aliased to donated inputs:      "
            f"{(self.output_bytes - self.alias_bytes) / gib:.2f} GiB",
            f"    peak estimate:                              {self.peak_bytes / gib:.2f} GiB",
            f"  compile time: {self.compile_s:.1f} s",
        ]
        return "\n".join(lines)


def _devices(config, num_devices: int | None) -> int:
    if num_devices:
        return num_devices
    if any(s == -1 for s in config.mesh.ici.values()):
        raise TrainerError(
            "--dry_run: mesh.ici has a -1 (fill) axis, so the device count is unknown; pass "
            "--dry_run_devices=N (e.g. 256)."
        )
    return math.prod(config.mesh.ici.values()) * config.mesh.num_slices


def dry_run(resolved: ResolvedConfig, num_devices: int | None = None) -> DryRunReport:
    """Lowers and compiles the train step of `resolved` for `num_devices` virtual devices.

    Must run before anything else touches the JAX backend in this process (it sets the
    number of CPU devices), unless enough devices already exist.
    """
    config = resolved.config
    n = _devices(config, num_devices)
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except Exception:  # the backend is up already: use what exists
        pass
    if jax.device_count() < n:
        raise TrainerError(
            f"--dry_run needs {n} devices but this process has {jax.device_count()}; run the "
            f"dry run in a fresh process (or set XLA_FLAGS="
            f"--xla_force_host_platform_device_count={n})."
        )
    devices = jax.devices()[:n]
    shape = MeshShape.resolve(
        config.mesh.ici.to_dict(), config.mesh.dcn.to_dict(), n, config.mesh.num_slices
    )
    mesh = make_mesh(shape.ici, shape.dcn, num_slices=config.mesh.num_slices, devices=devices)
    mcfg, abstract_model = abstract_parts(config)
    is_abstract = lambda x: isinstance(x, jax.ShapeDtypeStruct)  # noqa: E731
    params, static = eqx.partition(abstract_model, is_abstract)
    tx, _ = optim.build_optimizer(config.optimizer, total_steps=config.trainer.num_train_steps)
    abstract_state = jax.eval_shape(lambda p: init_state(p, tx), params)
    state_sharding = tree_shardings(abstract_state, mesh, PARAMETER_RULES)
    template = with_shardings(state_sharding, abstract_state)
    rows, seq = config.trainer.train_batch_size, config.data.seq_len
    bsh = batch_sharding(mesh)
    batch = {
        k: jax.ShapeDtypeStruct((rows, seq), dtype, sharding=bsh)
        for k, dtype in (
            ("tokens", jnp.int32),
            ("targets", jnp.int32),
            ("loss_mask", jnp.float32),
            ("segment_ids", jnp.int32),
            ("positions", jnp.int32),
        )
    }
    loss_fn, _ = make_loss_fns(config.trainer.z_loss)
    start = time.perf_counter()
    with compute_context(mesh):
        step = make_train_step(
            loss_fn,
            tx,
            static,
            microbatches=config.trainer.microbatches,
            compute_dtype=DTYPES[config.trainer.compute_dtype],
            metrics_fn=optim.metrics,
            state_sharding=state_sharding,
            batch_sharding=bsh,
            mesh=mesh,
        )
        compiled = step.lower(template, batch).compile()
    compile_s = time.perf_counter() - start
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    tokens = rows * seq
    return DryRunReport(
        preset=config.model.preset,
        num_devices=n,
        mesh={k: int(v) for k, v in mesh.shape.items()},
        num_params=mm.param_count(mcfg),
        tokens_per_step=tokens,
        model_flops_per_step=mm.flops_per_token(mcfg, seq) * tokens,
        compiled_flops_per_device=(cost or {}).get("flops"),
        argument_bytes=int(memory.argument_size_in_bytes),
        output_bytes=int(memory.output_size_in_bytes),
        temp_bytes=int(memory.temp_size_in_bytes),
        alias_bytes=int(memory.alias_size_in_bytes),
        code_bytes=int(memory.generated_code_size_in_bytes),
        compile_s=compile_s,
    )
