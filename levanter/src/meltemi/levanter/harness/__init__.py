"""lm-evaluation-harness on Meltemi checkpoints: the `meltemi` model of lm-eval.

Needs the `harness` extra (`pip install meltemi-levanter[harness]`). Importing this package
registers `MeltemiLM` as lm-eval's model `meltemi` and keeps `datasets` and the Hub offline;
`HarnessHook` runs tasks during training (a trainer hook that `meltemi.levanter.main` adds
when `eval.harness_tasks` is set). `python -m meltemi.levanter.harness` is lm-eval's own
command line with the model registered:

    python -m meltemi.levanter.harness --model meltemi --model_args checkpoint=DIR \
        --tasks meltemi_tiny_mc --include_path levanter/harness_tasks

Example:
    >>> from meltemi.levanter.harness import harness_metrics
    >>> harness_metrics({"results": {"mc": {"acc,none": 0.5, "acc_stderr,none": 0.1}}})
    {'harness/mc/acc': 0.5}
"""

from meltemi.levanter.harness._run import (
    OFFLINE_ENV,
    TASKS_DIR,
    check_tasks,
    go_offline,
    harness_metrics,
    include_paths,
    run_tasks,
    task_manager,
)

go_offline()  # before lm_eval (and datasets) are imported below

from meltemi.levanter.harness._hook import HarnessHook, harness_line  # noqa: E402
from meltemi.levanter.harness._model import MeltemiLM  # noqa: E402

__all__ = [
    "OFFLINE_ENV",
    "TASKS_DIR",
    "HarnessHook",
    "MeltemiLM",
    "check_tasks",
    "go_offline",
    "harness_line",
    "harness_metrics",
    "include_paths",
    "run_tasks",
    "task_manager",
]
