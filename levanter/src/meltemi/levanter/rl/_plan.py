"""`--dry_run` of an RL config: the trainer's step planned as the trainer plans it, plus the
rollout side (workers, devices, KV pool, the bytes of a weight sync)."""

from __future__ import annotations

import math

import jax

import meltemi.models as mm
from meltemi.levanter.config import RLSpec, RunSpec
from meltemi.levanter.rl._rollout import model_template
from meltemi.levanter.trainer import dry_run


def rl_dry_run(
    spec: RunSpec, rl: RLSpec, *, num_devices: int | None = None, hbm_gib: float | None = None
) -> str:
    """The report of `//levanter:rl --dry_run`: nothing is trained or sampled.

    The train step is the trainer's dry run (one code path: `meltemi.levanter.trainer.
    dry_run`) on rows of `data.seq_len` tokens; the rollout side is computed from shapes.

    Args:
        spec: the checked config.
        rl: the checked `rl` section.
        num_devices: virtual devices of the trainer's mesh (None: `mesh.*` decides).
        hbm_gib: device memory to check the trainer's peak against.
    """
    report = dry_run(spec, num_devices=num_devices, hbm_gib=hbm_gib).format()
    shapes = model_template(spec.model, spec.lora if spec.lora.enabled else None)
    leaves = jax.tree.leaves(shapes)
    weight_bytes = sum(math.prod(x.shape) * x.dtype.itemsize for x in leaves)
    sync = mm.lora.adapter_bytes(shapes) if spec.lora.enabled else weight_bytes
    mc = spec.model
    kv_per_token = 2 * mc.num_layers * mc.num_kv_heads * mc.head_size * 2  # bf16 cache
    seq = spec.data.seq_len
    rows = rl.prompts_per_step * rl.samples_per_prompt
    lines = [
        report.rstrip(),
        f"rollouts: {rl.num_workers} workers x {rl.worker_devices} devices "
        f"({rl.num_workers * rl.worker_devices} devices beside the trainer's)",
        f"  per step: {rl.prompts_per_step} prompts x {rl.samples_per_prompt} samples = {rows} "
        f"sequences of <= {seq} tokens ({rl.max_tokens} sampled)",
        f"  weights per worker (as initialised): {weight_bytes / 2**30:.2f} GiB "
        f"({weight_bytes / rl.worker_devices / 2**30:.2f} GiB per device)",
        f"  KV pool per worker: {rl.kv_bytes / 2**30:.2f} GiB = "
        f"{rl.kv_bytes // max(kv_per_token * seq, 1)} sequences of {seq} tokens "
        f"(bf16, {kv_per_token / 1024:.0f} KiB a token)",
        f"  weight sync: {sync / 2**30:.3f} GiB to each worker "
        f"({'LoRA adapters only' if spec.lora.enabled else 'every parameter'}), "
        f"{sync * rl.num_workers / 2**30:.2f} GiB a step",
        f"  staleness: <= {rl.max_staleness} versions (generating {rl.steps_ahead} steps ahead)",
    ]
    return "\n".join(lines)
