"""`--dry_run`: compile the train step of a config on a virtual mesh, without running it.

The model, optimizer state and batch exist only as `jax.ShapeDtypeStruct`s with shardings, so
a 32B model "fits" on a laptop: XLA compiles the per-device SPMD program for N virtual CPU
devices and reports what each device would hold (arguments, temporaries, outputs) and the
FLOPs it would execute.

How far to trust the figures:

* Arguments (parameters, optimizer state, batch) are exact: they are the shards of the
  sharded state, and the report checks XLA's figure against the sum of the shard sizes.
* Temporaries are XLA:CPU's buffer assignment of the same SPMD program. The models pin their
  activations to the compute mapping (batch split, `embed` whole), so they hold the
  per-device batch. XLA:CPU has no bfloat16 arithmetic: with `compute_dtype=bfloat16` it
  computes in float32 and keeps float32 copies of bf16 intermediates, so for bf16 compute
  the temporaries are an upper bound. Measured on marin-32b (256 devices): 43.9 GiB with
  bf16 compute, of which 10 GiB are the saved bf16 layer residuals and 20 GiB one f32 copy
  of them that XLA:CPU makes for the backward loop; 42.4 GiB with f32 compute.
* The plan uses the preset's vocabulary: with the built-in byte tokenizer (`data.tokenizer=
  "byte"`, a stand-in where no tokenizer file ships) a run would train a 259-token head,
  but a plan of `marin-32b` is about its real 128,256-token head.
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
from meltemi.levanter.mesh import PARAMETER_RULES, MeshShape, data_parallel_size, make_mesh
from meltemi.levanter.trainer._build import abstract_parts, make_loss_fns
from meltemi.levanter.trainer._loop import TrainerError, compute_context
from meltemi.levanter.trainer._sharding import batch_sharding, tree_shardings, with_shardings
from meltemi.levanter.trainer._step import DTYPES, init_state, make_train_step

GIB = 1024**3

# HBM per device (GiB) of common accelerators, for the "fits on" line.
KNOWN_HBM_GIB = {
    "TPU v5e": 16,
    "TPU v4": 32,
    "TPU v6e": 32,
    "A100 40GB": 40,
    "A100/H100 80GB": 80,
    "TPU v5p": 95,
    "H200": 141,
}


@dataclasses.dataclass
class DryRunReport:
    """What one train step of a config costs, per device, on a virtual mesh.

    Byte counts are per device. `param_bytes`, `opt_state_bytes` and `batch_bytes` are the
    shard sizes of the inputs (their sum is XLA's `argument_bytes`); `saved_carry_bytes` is
    what the remat policy keeps between the forward and backward pass of the layer stack
    (one residual per layer for `save_carries`/`full`, 0 for `offload`, everything for
    `none`: then it is None).
    """

    preset: str
    num_devices: int
    mesh: dict[str, int]
    num_params: int
    vocab_size: int
    tokens_per_step: int
    tokens_per_device: int
    model_flops_per_step: float
    compiled_flops_per_device: float | None
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    code_bytes: int
    compile_s: float
    param_bytes: int = 0
    opt_state_bytes: int = 0
    batch_bytes: int = 0
    remat: str = ""
    saved_carry_bytes: int | None = None
    compute_dtype: str = "float32"
    backend: str = "cpu"
    hbm_gib: float | None = None
    notes: tuple[str, ...] = ()

    @property
    def peak_bytes(self) -> int:
        """Arguments + temporaries + outputs not aliased to (donated) arguments."""
        return self.argument_bytes + self.temp_bytes + self.output_bytes - self.alias_bytes

    def fits(self, hbm_gib: float) -> bool:
        """Whether the per-device peak fits in `hbm_gib` GiB of device memory."""
        return self.peak_bytes <= hbm_gib * GIB

    def format(self) -> str:
        mesh = " x ".join(f"{k}={v}" for k, v in self.mesh.items() if v > 1) or "1 device"
        lines = [
            f"dry run: {self.preset}, {self.num_params / 1e9:.2f}B parameters "
            f"(vocab {self.vocab_size:,})",
            f"  mesh: {self.num_devices} devices ({mesh})",
            f"  tokens per step: {self.tokens_per_step:,} ({self.tokens_per_device:,} per device)",
            f"  model FLOPs per step: {self.model_flops_per_step:.3e} "
            f"({self.model_flops_per_step / self.num_devices:.3e} per device)",
        ]
        if self.compiled_flops_per_device:
            lines.append(
                f"  XLA cost analysis per device: {self.compiled_flops_per_device:.3e} FLOPs "
                "(counts a scanned layer stack once)"
            )
        unaliased = self.output_bytes - self.alias_bytes
        lines += [
            "  memory per device:",
            f"    arguments (params, optimizer state, batch): {self.argument_bytes / GIB:.2f} GiB"
            f" = {self.param_bytes / GIB:.2f} + {self.opt_state_bytes / GIB:.2f}"
            f" + {self.batch_bytes / GIB:.2f}",
            f"    temporaries (activations, gradients):       {self.temp_bytes / GIB:.2f} GiB",
        ]
        if self.saved_carry_bytes is not None:
            lines.append(
                f"      of which the remat policy ({self.remat}) keeps one residual per layer: "
                f"{self.saved_carry_bytes / GIB:.2f} GiB"
            )
        lines += [
            f"    outputs not aliased to donated inputs:      {unaliased / GIB:.2f} GiB",
            f"    total (peak estimate):                      {self.peak_bytes / GIB:.2f} GiB",
        ]
        if self.hbm_gib:
            verdict = "fits" if self.fits(self.hbm_gib) else "does NOT fit"
            lines.append(
                f"    vs {self.hbm_gib:g} GiB of HBM per device: {verdict} "
                f"({self.peak_bytes / (self.hbm_gib * GIB):.0%})"
            )
        fitting = [name for name, size in KNOWN_HBM_GIB.items() if self.fits(size)]
        lines.append(
            "    fits on: "
            + (
                ", ".join(fitting)
                if fitting
                else "none of " + ", ".join(f"{k} ({v} GiB)" for k, v in KNOWN_HBM_GIB.items())
            )
        )
        for note in self.notes:
            lines.append(f"  note: {note}")
        lines.append(f"  compile time: {self.compile_s:.1f} s")
        return "\n".join(lines)


def _shard_bytes(tree) -> int:
    """Per-device bytes of the ShapeDtypeStructs of `tree` (with their shardings)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
        total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
    return total


def _devices(config, num_devices: int | None) -> int:
    if num_devices:
        return num_devices
    if any(s == -1 for s in config.mesh.ici.values()):
        raise TrainerError(
            "--dry_run: mesh.ici has a -1 (fill) axis, so the device count is unknown; pass "
            "--dry_run_devices=N (e.g. 256)."
        )
    return math.prod(config.mesh.ici.values()) * config.mesh.num_slices


def _plan_model(config) -> tuple[mm.ModelConfig, object, str | None]:
    """The model config and abstract model to plan, and a note when the vocabulary differs
    from what training this config would use (see the module docstring)."""
    mcfg, model = abstract_parts(config)
    preset_vocab = mm.get_preset(config.model.preset).vocab_size
    if config.data.tokenizer != "byte" or preset_vocab <= mcfg.vocab_size:
        return mcfg, model, None
    trained = mcfg.vocab_size
    mcfg = mcfg.replace(vocab_size=preset_vocab)
    model = eqx.filter_eval_shape(lambda k: mm.Transformer.init(mcfg, key=k), jax.random.key(0))
    note = (
        f"planned with the preset's vocabulary ({preset_vocab:,}); data.tokenizer='byte' "
        f"would train a {trained}-token head (set data.tokenizer to the preset's tokenizer.json)"
    )
    return mcfg, model, note


def _saved_carry_bytes(mcfg: mm.ModelConfig, rows_per_device: int, seq: int, dtype) -> int | None:
    """Device bytes the remat policy keeps for the backward pass of the layer stack."""
    if mcfg.remat == "none":
        return None
    if mcfg.remat == "offload":  # the residuals live in host memory
        return 0
    per_layer = rows_per_device * seq * mcfg.hidden_dim * jnp.dtype(dtype).itemsize
    return mcfg.num_layers * per_layer


def dry_run(
    resolved: ResolvedConfig, num_devices: int | None = None, *, hbm_gib: float | None = None
) -> DryRunReport:
    """Lowers and compiles the train step of `resolved` for `num_devices` virtual devices.

    Must run before anything else touches the JAX backend in this process (it sets the
    number of CPU devices), unless enough devices already exist. `hbm_gib` (per device)
    adds a fits / does not fit line.
    """
    if hbm_gib is not None and not hbm_gib > 0:
        raise TrainerError(
            f"--dry_run: hbm_gib={hbm_gib!r} must be a positive number of GiB per device "
            "(e.g. 95 for a TPU v5p)."
        )
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
    mcfg, abstract_model, vocab_note = _plan_model(config)
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
    compute_dtype = DTYPES[config.trainer.compute_dtype]
    start = time.perf_counter()
    with compute_context(mesh):
        step = make_train_step(
            loss_fn,
            tx,
            static,
            microbatches=config.trainer.microbatches,
            compute_dtype=compute_dtype,
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
    dp = data_parallel_size(mesh)
    rows_per_device = max(rows // dp, 1)
    param_bytes = _shard_bytes(template.params)
    arguments = int(memory.argument_size_in_bytes)
    notes = [vocab_note] if vocab_note else []
    inputs = _shard_bytes(template) + _shard_bytes(batch)
    if abs(inputs - arguments) > max(2**20, inputs // 100):  # jit drops unused scalars
        notes.append(
            f"XLA's argument size ({arguments / GIB:.3f} GiB) differs from the input shards "
            f"({inputs / GIB:.3f} GiB)"
        )
    backend = jax.default_backend()
    if backend == "cpu" and compute_dtype == jnp.bfloat16:
        notes.append(
            "XLA:CPU computes bfloat16 in float32 (and keeps float32 copies of bf16 "
            "intermediates), so the temporaries are an upper bound for a bf16-native device"
        )
    return DryRunReport(
        preset=config.model.preset,
        num_devices=n,
        mesh={k: int(v) for k, v in mesh.shape.items()},
        num_params=mm.param_count(mcfg),
        vocab_size=mcfg.vocab_size,
        tokens_per_step=tokens,
        tokens_per_device=rows_per_device * seq,
        model_flops_per_step=mm.flops_per_token(mcfg, seq) * tokens,
        compiled_flops_per_device=(cost or {}).get("flops"),
        argument_bytes=arguments,
        output_bytes=int(memory.output_size_in_bytes),
        temp_bytes=int(memory.temp_size_in_bytes),
        alias_bytes=int(memory.alias_size_in_bytes),
        code_bytes=int(memory.generated_code_size_in_bytes),
        compile_s=compile_s,
        param_bytes=param_bytes,
        opt_state_bytes=_shard_bytes(template) - param_bytes,
        batch_bytes=_shard_bytes(batch),
        remat=mcfg.remat,
        saved_carry_bytes=_saved_carry_bytes(
            mcfg, max(rows_per_device // config.trainer.microbatches, 1), seq, compute_dtype
        ),
        compute_dtype=config.trainer.compute_dtype,
        backend=backend,
        hbm_gib=hbm_gib,
        notes=tuple(notes),
    )
