"""`--dry_run`: compile the train step of a config on a virtual mesh, without running it.

The dry run is `plan(spec, devices)` (the trainer's own plan: mesh, shardings, step) plus
`lower().compile()` and a memory report, so it cannot drift from training.

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

import jax
import jax.numpy as jnp

import meltemi.models as mm
from meltemi.levanter.config import ConfigError, ResolvedConfig, RunSpec, as_spec
from meltemi.levanter.mesh import data_parallel_size
from meltemi.levanter.trainer._plan import Plan, plan, shard_bytes

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


def _num_devices(spec: RunSpec, num_devices: int | None) -> int:
    if num_devices:
        return num_devices
    fixed = spec.mesh.fixed_devices
    if fixed is None:
        raise ConfigError(
            "--dry_run: mesh.ici has a -1 (fill) axis, so the device count is unknown; pass "
            "--dry_run_devices=N (e.g. 256)."
        )
    return fixed


def _with_preset_vocab(spec: RunSpec) -> tuple[RunSpec, str | None]:
    """The spec to plan, and a note when its vocabulary differs from what training this
    config would use (see the module docstring)."""
    if spec.init_from_hf:  # the checkpoint's own vocabulary
        return spec, None
    preset_vocab = mm.get_preset(spec.preset).vocab_size
    trained = spec.model.vocab_size
    if spec.data.tokenizer != "byte" or preset_vocab <= trained:
        return spec, None
    note = (
        f"planned with the preset's vocabulary ({preset_vocab:,}); data.tokenizer='byte' "
        f"would train a {trained}-token head (set data.tokenizer to the preset's tokenizer.json)"
    )
    return dataclasses.replace(spec, model=spec.model.replace(vocab_size=preset_vocab)), note


def _saved_carry_bytes(mcfg: mm.ModelConfig, rows_per_device: int, seq: int, dtype) -> int | None:
    """Device bytes the remat policy keeps for the backward pass of the layer stack."""
    if mcfg.remat == "none":
        return None
    if mcfg.remat == "offload":  # the residuals live in host memory
        return 0
    per_layer = rows_per_device * seq * mcfg.hidden_dim * jnp.dtype(dtype).itemsize
    return mcfg.num_layers * per_layer


def dry_run_plan(
    spec: RunSpec | ResolvedConfig, num_devices: int | None = None
) -> tuple[Plan, tuple[str, ...]]:
    """The plan `dry_run` compiles (on `num_devices` virtual CPU devices), and its notes.

    Must run before anything else touches the JAX backend in this process (it sets the
    number of CPU devices), unless enough devices already exist.
    """
    spec = as_spec(spec)
    n = _num_devices(spec, num_devices)
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except Exception:  # the backend is up already: use what exists
        pass
    if jax.device_count() < n:
        raise ConfigError(
            f"--dry_run needs {n} devices but this process has {jax.device_count()}; run the "
            f"dry run in a fresh process (or set XLA_FLAGS="
            f"--xla_force_host_platform_device_count={n})."
        )
    planned, note = _with_preset_vocab(spec)
    return plan(planned, jax.devices()[:n]), (note,) if note else ()


def dry_run(
    spec: RunSpec | ResolvedConfig, num_devices: int | None = None, *, hbm_gib: float | None = None
) -> DryRunReport:
    """Compiles the train step of `spec` for `num_devices` virtual devices; reports its cost.

    Args:
        spec: the checked config (a `ResolvedConfig` is resolved first).
        num_devices: virtual devices (default: the mesh's fixed size).
        hbm_gib: device memory (GiB per device) to check the total against.

    Raises:
        ConfigError: a bad `hbm_gib`, an unknown device count, a mesh or batch that does not
            fit the devices.
    """
    if hbm_gib is not None and not hbm_gib > 0:
        raise ConfigError(
            f"--dry_run: hbm_gib={hbm_gib!r} must be a positive number of GiB per device "
            "(e.g. 95 for a TPU v5p)."
        )
    p, notes = dry_run_plan(spec, num_devices)
    spec, mcfg = p.spec, p.spec.model
    rows, seq = spec.trainer.train_batch_size, spec.data.seq_len
    compiled = p.compile(rows)
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    tokens = rows * seq
    rows_per_device = max(rows // data_parallel_size(p.mesh), 1)
    # A `sequence` split holds 1/split of each row's positions (and activations) per device.
    seq_per_device = seq // dict(p.mesh.shape).get("sequence", 1)
    batch = p.abstract_batch(rows)
    param_bytes = shard_bytes(p.template.params)
    arguments = int(memory.argument_size_in_bytes)
    notes = list(notes)
    inputs = shard_bytes(p.template) + shard_bytes(batch)
    if abs(inputs - arguments) > max(2**20, inputs // 100):  # jit drops unused scalars
        notes.append(
            f"XLA's argument size ({arguments / GIB:.3f} GiB) differs from the input shards "
            f"({inputs / GIB:.3f} GiB)"
        )
    backend = jax.default_backend()
    if backend == "cpu" and p.compute_dtype == jnp.bfloat16:
        notes.append(
            "XLA:CPU computes bfloat16 in float32 (and keeps float32 copies of bf16 "
            "intermediates), so the temporaries are an upper bound for a bf16-native device"
        )
    return DryRunReport(
        preset=spec.preset,
        num_devices=p.mesh.size,
        mesh={k: int(v) for k, v in p.mesh.shape.items()},
        num_params=mm.param_count(mcfg),
        vocab_size=mcfg.vocab_size,
        tokens_per_step=tokens,
        tokens_per_device=rows_per_device * seq_per_device,
        model_flops_per_step=mm.flops_per_token(mcfg, seq) * tokens,
        compiled_flops_per_device=(cost or {}).get("flops"),
        argument_bytes=arguments,
        output_bytes=int(memory.output_size_in_bytes),
        temp_bytes=int(memory.temp_size_in_bytes),
        alias_bytes=int(memory.alias_size_in_bytes),
        code_bytes=int(memory.generated_code_size_in_bytes),
        compile_s=p.compile_s[rows],
        param_bytes=param_bytes,
        opt_state_bytes=shard_bytes(p.template) - param_bytes,
        batch_bytes=shard_bytes(batch),
        remat=mcfg.remat,
        saved_carry_bytes=_saved_carry_bytes(
            mcfg,
            max(rows_per_device // spec.trainer.microbatches, 1),
            seq_per_device,
            p.compute_dtype,
        ),
        compute_dtype=spec.trainer.compute_dtype,
        backend=backend,
        hbm_gib=hbm_gib,
        notes=tuple(notes),
    )
