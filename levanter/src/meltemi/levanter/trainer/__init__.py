"""The trainer: the plan (mesh, shardings, step), the loop, evaluation and the dry run.

`plan(spec, devices)` lays a checked config (`meltemi.levanter.config.resolve`) out on
devices; `Trainer` runs it with data and checkpoints, `dry_run` compiles it and reports the
memory it needs. The loop is components: a `StepTimer`, a `MetricsSink` and step-boundary
`Hook`s (`EvalHook`, the hooks given to `Trainer(hooks=...)`, then `CheckpointHook`), each
deciding with `due(step, stopping)` when it runs.

The floors below it (`meltemi.levanter.runtime`, `meltemi.levanter.evaluation`) hold what
it shares with `//levanter:eval` and the harness; the floors above it
(`meltemi.levanter.harness`, `multislice`, `experiments`, `main`) use it, never the reverse.

Example:
    >>> import jax.numpy as jnp, optax
    >>> from meltemi.levanter.trainer import init_state
    >>> int(init_state({"w": jnp.zeros(2)}, optax.sgd(0.1)).step)
    0
"""

from meltemi.levanter.config import (
    BatchScheduleError,
    BatchSizes,
    BuildError,
    MixtureConfigError,
    MixturePlan,
    mixture_plan,
    resolve_run_dir,
)
from meltemi.levanter.evaluation import EvalSet
from meltemi.levanter.runtime import (
    DTYPES,
    batch_sharding,
    cast_floating,
    compute_context,
    display_path,
    global_batch,
    make_loss_fns,
    mesh_of,
    tree_shardings,
    with_shardings,
)
from meltemi.levanter.trainer._build import build_parts
from meltemi.levanter.trainer._data import fraction_metrics, make_mixture
from meltemi.levanter.trainer._dry_run import DryRunReport, dry_run, dry_run_plan
from meltemi.levanter.trainer._eval import Evaluator
from meltemi.levanter.trainer._hooks import CheckpointHook, EvalHook, Hook, StepEnd
from meltemi.levanter.trainer._loop import MetricsSink, StepTimer
from meltemi.levanter.trainer._parts import BatchSource, RunParts
from meltemi.levanter.trainer._plan import (
    Plan,
    StepParts,
    batch_fields,
    fields_of,
    model_parts,
    plan,
    shard_bytes,
)
from meltemi.levanter.trainer._preemption import (
    PREEMPTED_EXIT_CODE,
    Preemption,
    install_sigterm_handler,
)
from meltemi.levanter.trainer._step import (
    TrainState,
    init_state,
    loss_and_grads,
    make_train_step,
    split_microbatches,
    token_weight,
)
from meltemi.levanter.trainer._summary import RunResult
from meltemi.levanter.trainer._trainer import (
    Trainer,
    check_resumed_rows,
    measure_peak_flops,
    train,
)
from meltemi.levanter.trainer._warm_start import make_warm_start

__all__ = [
    "DTYPES",
    "PREEMPTED_EXIT_CODE",
    "BatchScheduleError",
    "BatchSizes",
    "BatchSource",
    "BuildError",
    "CheckpointHook",
    "DryRunReport",
    "EvalHook",
    "EvalSet",
    "Evaluator",
    "Hook",
    "MetricsSink",
    "MixtureConfigError",
    "MixturePlan",
    "Plan",
    "Preemption",
    "RunParts",
    "RunResult",
    "StepEnd",
    "StepParts",
    "StepTimer",
    "TrainState",
    "Trainer",
    "batch_fields",
    "batch_sharding",
    "build_parts",
    "cast_floating",
    "check_resumed_rows",
    "compute_context",
    "display_path",
    "dry_run",
    "dry_run_plan",
    "fields_of",
    "fraction_metrics",
    "global_batch",
    "init_state",
    "install_sigterm_handler",
    "loss_and_grads",
    "make_loss_fns",
    "make_mixture",
    "make_train_step",
    "make_warm_start",
    "measure_peak_flops",
    "mesh_of",
    "mixture_plan",
    "model_parts",
    "plan",
    "resolve_run_dir",
    "shard_bytes",
    "split_microbatches",
    "token_weight",
    "train",
    "tree_shardings",
    "with_shardings",
]
