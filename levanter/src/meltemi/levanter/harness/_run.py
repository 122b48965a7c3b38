"""Running lm-eval tasks offline on a `MeltemiLM`: task lookup, evaluation, flat metrics."""

from __future__ import annotations

import difflib
import functools
import math
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from meltemi.levanter.evaluation import EvalError

#: The tasks shipped with the source tree (`levanter/harness_tasks`; absent from a wheel).
TASKS_DIR = pathlib.Path(__file__).absolute().parents[4] / "harness_tasks"

#: Environment that keeps `datasets`, `huggingface_hub` and `transformers` off the network.
OFFLINE_ENV = {
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_EVALUATE_OFFLINE": "1",
}


def go_offline() -> None:
    """Sets `OFFLINE_ENV` (before `datasets` or `lm_eval` are imported, which read it then)."""
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)


def include_paths(extra: Sequence[str | os.PathLike] = ()) -> list[str]:
    """The shipped task directory (when present) and `extra` directories."""
    paths = [str(TASKS_DIR)] if TASKS_DIR.is_dir() else []
    return paths + [str(p) for p in extra]


def task_manager(extra: Sequence[str | os.PathLike] = (), tasks: Sequence[str] = ()) -> Any:
    """An lm-eval `TaskManager` that also knows our task directories.

    When every one of `tasks` is defined in our directories, lm-eval's thousands of built-in
    task files are not indexed (that takes minutes on a busy machine).
    """
    paths = tuple(include_paths(extra))
    if tasks and paths:
        local = _indexed(paths, defaults=False)
        if all(t in local.all_tasks for t in tasks):
            return local
    return _indexed(paths, defaults=True)


@functools.cache
def _indexed(paths: tuple[str, ...], *, defaults: bool) -> Any:
    """One `TaskManager` per (directories, built-ins) in a process: indexing lm-eval's own
    task files takes tens of seconds, and a training run asks at every harness step."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=list(paths) or None, include_defaults=defaults)


def check_tasks(tasks: Sequence[str], manager: Any) -> None:
    """Raises `EvalError` for a task name lm-eval does not know, with the closest names."""
    known = set(manager.all_tasks)
    for name in tasks:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise EvalError(
                f"harness task {name!r} is unknown to lm-eval (with --include_path "
                f"{include_paths()}).{hint}"
            )


def run_tasks(
    lm: Any,
    tasks: Sequence[str],
    *,
    include_path: Sequence[str | os.PathLike] = (),
    limit: int | float | None = None,
    num_fewshot: int | None = None,
    log_samples: bool = False,
    seed: int = 0,
) -> dict[str, Any]:
    """`lm_eval.simple_evaluate` on `lm` (a `MeltemiLM`, or any lm-eval model), offline.

    Args:
        lm: the model.
        tasks: task (or group) names.
        include_path: more task directories besides `TASKS_DIR`.
        limit: at most this many documents per task (a fraction: that share).
        num_fewshot: few-shot examples (default: each task's).
        log_samples: keep every request's inputs and scores (`results["samples"]`).
        seed: the seed of lm-eval's few-shot sampling and of numpy/python randomness.

    Returns:
        lm-eval's results dict (`results`, `configs`, ... and `samples` if asked).
    """
    go_offline()
    from lm_eval import simple_evaluate

    manager = task_manager(include_path, tasks)
    check_tasks(tasks, manager)
    return simple_evaluate(
        model=lm,
        tasks=list(tasks),
        task_manager=manager,
        limit=limit,
        num_fewshot=num_fewshot,
        log_samples=log_samples,
        bootstrap_iters=0,
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        fewshot_random_seed=seed,
    )


def harness_metrics(results: Mapping[str, Any]) -> dict[str, float]:
    """`{"harness/<task>/<metric>": value}` from lm-eval's results (filters such as `,none`
    dropped from the name; standard errors, sample counts and non-numbers left out)."""
    out = {}
    for task, metrics in results.get("results", {}).items():
        for key, value in metrics.items():
            name, _, flt = key.partition(",")
            if "_stderr" in name or name in ("alias", "sample_len") or isinstance(value, bool):
                continue
            if not isinstance(value, int | float) or not math.isfinite(value):
                continue
            suffix = "" if flt in ("", "none") else f"/{flt}"
            out[f"harness/{task}/{name}{suffix}"] = float(value)
    return out
