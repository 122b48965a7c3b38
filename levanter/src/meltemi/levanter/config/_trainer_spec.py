"""`trainer.*`: steps, seed, batch sizes, precision, loss, profiling."""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

import ml_collections

from meltemi.levanter.config._checks import (
    AnyInt,
    AtLeast,
    Custom,
    Flag,
    InSection,
    Number,
    OneOf,
    Text,
    check_choice,
    check_number,
)
from meltemi.levanter.config._errors import ConfigError
from meltemi.levanter.config._keys import derived, key, read
from meltemi.levanter.config._schedule import BatchSizes

#: `trainer.compute_dtype` values. float16 needs loss scaling, which the trainer does not do.
COMPUTE_DTYPES = ("float32", "bfloat16")
_DTYPE_ALIASES = {"bf16": "bfloat16", "fp32": "float32", "f32": "float32", "float": "float32"}
_FLOAT16 = ("float16", "fp16", "f16", "half")
#: `trainer.objective` values: next-token loss, or a preference objective on chosen/rejected pairs.
OBJECTIVES = ("lm", "dpo", "ipo", "simpo")
#: `trainer.reference` values: how DPO/IPO get the reference model's log-probs.
REFERENCES = ("live", "precomputed")


def _beta(key: str, value: Any) -> float:
    value = check_number(key, value, example=0.1)
    if value <= 0:
        raise ConfigError(f"{key}={value!r}: must be > 0, e.g. --config.{key}=0.1 (DPO).")
    return value


def _label_smoothing(key: str, value: Any) -> float:
    value = check_number(key, value, example=0.0)
    if not value < 0.5:
        raise ConfigError(
            f"{key}={value!r}: the assumed share of flipped labels, in [0, 0.5); e.g. "
            f"--config.{key}=0.1."
        )
    return value


def compute_dtype(value: Any) -> str:
    """Checks `trainer.compute_dtype`: an alias names the spelling, float16 is refused.

    Example:
        >>> compute_dtype("bfloat16")
        'bfloat16'
    """
    key = "trainer.compute_dtype"
    if value in _DTYPE_ALIASES:
        right = _DTYPE_ALIASES[value]
        raise ConfigError(
            f"{key}={value!r}: write the dtype's name, --config.{key}={right} "
            f"(one of {COMPUTE_DTYPES})."
        )
    if value in _FLOAT16:
        raise ConfigError(
            f"{key}={value!r}: float16 needs loss scaling, which this trainer does not do "
            f"(gradients would underflow); use --config.{key}=bfloat16 (same memory, float32's "
            f"exponent range)."
        )
    return check_choice(key, value, COMPUTE_DTYPES)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainerSpec:
    """`trainer.*`: steps, seed, batch sizes, precision and loss.

    Attributes:
        batch_sizes: the batch size of every step (`train_batch_size` or `batch_schedule`).
        train_batch_size: the batch size of step 0 (the schedule's first when one is set).
        compute_dtype: "float32" or "bfloat16" (the forward and backward pass).
        peak_flops_per_device: the MFU denominator; 0 measures a matmul at start-up.
        profile: `(first, last)`: trace steps first..last (counted from 1) with
            `jax.profiler` into `<run_dir>/profile`; None: no trace.
        objective: "lm", or a preference objective "dpo", "ipo", "simpo".
    """

    batch_sizes: BatchSizes = derived()
    num_train_steps: int = key(1000, "Training steps.", AtLeast(1, example=1000))
    seed: int = key(0, "Seed of the model's initialisation and of dropout.", AnyInt())
    train_batch_size: int = key(8, "Global batch size (rows per step).", AtLeast(1, example=8))
    batch_schedule: str = key(
        "",
        'Batch-size schedule "STEP:SIZE,STEP:SIZE" (e.g. "0:8,100:16"); empty: train_batch_size.',
        Text(),
    )
    microbatches: int = key(
        1,
        "Gradient accumulation: each step's batch is split into this many microbatches.",
        AtLeast(1, example=1),
    )
    compute_dtype: str = key(
        "float32",
        "Dtype of the forward and backward pass (float32 or bfloat16); parameters, gradients "
        "and optimizer state stay float32.",
        Custom(lambda _, value: compute_dtype(value), wrong="bf16"),
    )
    z_loss: float = key(1e-4, "Weight of the z-loss (log-partition squared).", Number(1e-4))
    progress_bar: bool = key(True, "Show a progress bar.", Flag())
    peak_flops_per_device: float = key(
        0.0, "Peak FLOP/s per device for MFU; 0 measures a matmul at start-up.", Number(0.0)
    )
    profile: tuple[int, int] | None = key(
        (),
        "(FIRST, LAST): a jax.profiler trace of steps FIRST..LAST into `<run_dir>/profile` "
        "(TensorBoard's profile plugin or Perfetto read it); (): no trace.",
        InSection(wrong=(0, 1)),
    )
    objective: str = key(
        "lm",
        '"lm": next-token loss; "dpo", "ipo", "simpo": a preference objective on chat pairs '
        '(data files of {"prompt", "chosen", "rejected"} rows; DPO and IPO need a reference '
        "model, see trainer.reference).",
        OneOf(OBJECTIVES),
    )
    beta: float = key(
        0.1,
        "Preference objectives: DPO's KL strength, IPO's tau, SimPO's reward scale (2.0 there).",
        Custom(_beta, wrong=0.0),
    )
    label_smoothing: float = key(
        0.0,
        "DPO and SimPO: the assumed share of flipped labels (cDPO), in [0, 0.5).",
        Custom(_label_smoothing, wrong=0.5),
    )
    simpo_gamma: float = key(0.5, "SimPO: the target reward margin gamma.", Number(0.5))
    reference: str = key(
        "live",
        'DPO/IPO: "live" evaluates a frozen reference model in each step (with LoRA: the base '
        'model without adapters, no second copy); "precomputed" computes its log-probs of '
        "every training row once before training, cached in data.cache_dir/reference.",
        OneOf(REFERENCES),
    )
    reference_from: str = key(
        "",
        "DPO/IPO: the reference model, a Meltemi checkpoint or run directory; empty: the "
        "policy's own start (checkpoint.init_from or model.init_from_hf).",
        Text(),
    )


def _profile(value: Any, num_steps: int) -> tuple[int, int] | None:
    key = "trainer.profile"
    if value in ((), None):
        return None
    ok = (
        isinstance(value, tuple | list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )
    if not ok or not 1 <= value[0] <= value[1] <= num_steps:
        raise ConfigError(
            f"{key}={value!r}: (FIRST, LAST), the steps to trace, 1 <= FIRST <= LAST <= "
            f'trainer.num_train_steps={num_steps}; e.g. --config.{key}="(5, 7)" (a few '
            f"steps after the compile)."
        )
    return int(value[0]), int(value[1])


def trainer_spec(c: ml_collections.ConfigDict) -> TrainerSpec:
    """The checked `trainer` section."""
    v = read(TrainerSpec, c, "trainer.")
    sizes = BatchSizes.parse(v["batch_schedule"], v["train_batch_size"])
    micro = v["microbatches"]
    for start, size in sizes.segments:
        if size % micro:
            raise ConfigError(
                f"trainer.microbatches={micro} does not divide the batch size {size} (from "
                f"step {start}); pick a divisor, e.g. --config.trainer.microbatches=1."
            )
    v["train_batch_size"] = sizes.size_at(0)
    v["profile"] = _profile(v["profile"], v["num_train_steps"])
    return TrainerSpec(batch_sizes=sizes, **v)


def check_objective(trainer: TrainerSpec, *, init_from: str, lora: bool) -> None:
    """The checks of `trainer.objective` that read other sections (called by `resolve`).

    Raises:
        ConfigError: a reference path that does not exist, or one given with LoRA (whose
            reference is the base model without adapters) or with SimPO (reference-free).
    """
    ref = trainer.reference_from
    if trainer.objective == "lm" or not ref:
        return
    key = "trainer.reference_from"
    if trainer.objective == "simpo":
        raise ConfigError(
            f"{key}={ref!r} has no effect with trainer.objective='simpo' (SimPO uses no "
            f"reference model); drop it, or use --config.trainer.objective=dpo."
        )
    if lora:
        raise ConfigError(
            f"{key}={ref!r}: with LoRA (model.lora.rank > 0) the reference is the base model "
            f"without its adapters, so no second model is loaded; drop {key}."
        )
    if "://" in ref:
        return  # a bucket path: the load names what is missing
    path = pathlib.Path(ref).expanduser()
    if not path.is_absolute():
        path = pathlib.Path(os.environ.get("BUILD_WORKING_DIRECTORY") or os.getcwd()) / path
    if not path.exists():
        start = f"checkpoint.init_from={init_from!r}" if init_from else "its initialisation"
        raise ConfigError(
            f"{key}={ref!r}: no such directory ({path}); the policy starts from {start}, and "
            f"trainer.objective={trainer.objective!r} compares it with this reference. Give the "
            f"reference's run or checkpoint directory (e.g. --config.{key}=runs/sft), or leave "
            f"it empty to use the policy's own start."
        )
