"""`trainer.*`: steps, seed, batch sizes, precision, loss, profiling."""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from meltemi.levanter.config._checks import (
    AnyInt,
    AtLeast,
    Custom,
    Flag,
    InSection,
    Number,
    Text,
    check_choice,
)
from meltemi.levanter.config._errors import ConfigError
from meltemi.levanter.config._keys import derived, key, read
from meltemi.levanter.config._schedule import BatchSizes

#: `trainer.compute_dtype` values. float16 needs loss scaling, which the trainer does not do.
COMPUTE_DTYPES = ("float32", "bfloat16")
_DTYPE_ALIASES = {"bf16": "bfloat16", "fp32": "float32", "f32": "float32", "float": "float32"}
_FLOAT16 = ("float16", "fp16", "f16", "half")


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
