"""The trainer: the jitted step, the loop, checkpoint/resume, evaluation and the dry run.

Example:
    >>> import jax.numpy as jnp, optax
    >>> from meltemi.levanter.trainer import init_state
    >>> int(init_state({"w": jnp.zeros(2)}, optax.sgd(0.1)).step)
    0
"""

from meltemi.levanter.trainer._build import BuildError, build_parts, model_config
from meltemi.levanter.trainer._dry_run import DryRunReport, dry_run
from meltemi.levanter.trainer._loop import (
    PREEMPTED_EXIT_CODE,
    RunResult,
    Trainer,
    TrainerError,
    compute_context,
    measure_peak_flops,
    resolve_run_dir,
    train,
)
from meltemi.levanter.trainer._mixture import (
    MixtureConfigError,
    MixturePlan,
    fraction_metrics,
    mixture_plan,
)
from meltemi.levanter.trainer._multislice import SliceWorker, launch_multislice
from meltemi.levanter.trainer._parts import BatchSource, EvalSet, RunParts
from meltemi.levanter.trainer._schedule import BatchScheduleError, BatchSizes
from meltemi.levanter.trainer._sharding import (
    batch_sharding,
    global_batch,
    tree_shardings,
    with_shardings,
)
from meltemi.levanter.trainer._step import (
    DTYPES,
    TrainState,
    cast_floating,
    init_state,
    loss_and_grads,
    make_train_step,
    split_microbatches,
    token_weight,
)

__all__ = [
    "DTYPES",
    "PREEMPTED_EXIT_CODE",
    "BatchScheduleError",
    "BatchSizes",
    "BatchSource",
    "BuildError",
    "DryRunReport",
    "EvalSet",
    "MixtureConfigError",
    "MixturePlan",
    "RunParts",
    "RunResult",
    "SliceWorker",
    "TrainState",
    "Trainer",
    "TrainerError",
    "batch_sharding",
    "build_parts",
    "dry_run",
    "fraction_metrics",
    "cast_floating",
    "compute_context",
    "global_batch",
    "init_state",
    "launch_multislice",
    "loss_and_grads",
    "make_train_step",
    "measure_peak_flops",
    "mixture_plan",
    "model_config",
    "resolve_run_dir",
    "split_microbatches",
    "token_weight",
    "train",
    "tree_shardings",
    "with_shardings",
]
