"""`eval.*`: evaluation of the loss on the eval sets, and lm-evaluation-harness tasks."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import ml_collections

from meltemi.levanter.config._checks import AtLeast, Custom, Flag, Paths
from meltemi.levanter.config._errors import ConfigError, InertKeyError
from meltemi.levanter.config._keys import key, keys_of, read

#: The key an `eval.harness_*` key has no effect without.
_TASKS = "harness_tasks"


def _harness_tasks(dotted: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        names = tuple(t.strip() for t in value.split(",") if t.strip())
    elif isinstance(value, tuple | list) and all(isinstance(t, str) and t for t in value):
        names = tuple(value)
    else:
        raise ConfigError(
            f"{dotted}={value!r}: a tuple of lm-eval task names, e.g. "
            f'--config.{dotted}="(\'meltemi_tiny_mc\',)" (or "task_a,task_b").'
        )
    if len(set(names)) != len(names):
        raise ConfigError(f"{dotted}={value!r}: a task is named twice; name each once.")
    return names


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalSpec:
    """`eval.*`: every `every_steps` steps (0: at the end; `at_start`: and before the first
    step), `num_batches` of `batch_size`.

    A key whose name starts with `harness_` (other than `harness_tasks`) has no effect without
    `harness_tasks`: set to anything but its default without tasks, it is an `InertKeyError`.
    """

    every_steps: int = key(
        0, "Evaluate every N steps (0: only at the end of training).", AtLeast(0, example=100)
    )
    at_start: bool = key(
        False,
        "Also evaluate the starting model before the first step (a run from step 0, not a "
        "resume), logged as step 0: the baseline a run's evaluations are compared with.",
        Flag(),
    )
    num_batches: int = key(4, "Batches per evaluation set.", AtLeast(0, example=4))
    batch_size: int = key(8, "Rows per evaluation batch.", AtLeast(1, example=8))
    harness_tasks: tuple[str, ...] = key(
        (),
        "lm-evaluation-harness tasks (lm-eval names, or YAML tasks in levanter/harness_tasks "
        "and eval.harness_include_path), run every eval.harness_every_steps steps and logged "
        "as `harness/<task>/<metric>`; needs the `harness` extra (lm-eval). (): none.",
        Custom(_harness_tasks, wrong=("a", "a")),
    )
    harness_every_steps: int = key(
        0, "Run the harness tasks every N steps.", AtLeast(0, example=500)
    )
    harness_limit: int = key(
        0, "Documents per harness task (0: all of them).", AtLeast(0, example=100)
    )
    harness_include_path: tuple[str, ...] = key(
        (), "More directories of lm-eval task YAML files.", Paths()
    )


def eval_spec(c: ml_collections.ConfigDict) -> EvalSpec:
    """The checked `eval` section."""
    v = read(EvalSpec, c, "eval.")
    tasks = v[_TASKS]
    if tasks and not v["harness_every_steps"]:
        raise ConfigError(
            f"eval.harness_tasks={tasks!r} needs eval.harness_every_steps (how often to run "
            f"them), e.g. --config.eval.harness_every_steps=500."
        )
    for name, k in keys_of(EvalSpec):
        if name.startswith("harness_") and name != _TASKS and v[name] != k.default and not tasks:
            dotted = f"eval.{name}"
            raise InertKeyError(
                f"{dotted}={v[name]!r} has no effect without eval.harness_tasks; name the tasks, "
                f"e.g. --config.eval.harness_tasks=\"('meltemi_tiny_mc',)\", or drop {dotted}."
            )
    for path in v["harness_include_path"]:
        if not pathlib.Path(path).expanduser().is_dir():
            raise ConfigError(
                f"eval.harness_include_path: {path!r} is not a directory (of lm-eval task YAML "
                f"files); fix the path."
            )
    return EvalSpec(**v)
