"""Warm start (`checkpoint.init_from`): a fresh run initialised from a checkpoint's arrays."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable
from typing import Any

from meltemi.levanter.checkpoint import (
    array_names,
    as_path,
    flatten_state,
    is_url,
    latest_complete_step,
    read_manifest,
    restore_arrays,
    step_dir,
    unflatten_state,
)


def checkpoint_of(init_from: str) -> str:
    """`checkpoint.init_from` as one checkpoint: a checkpoint directory as given; a run
    directory or its `checkpoints/` directory: its newest complete checkpoint. A relative
    path is taken from the directory the command started from (also under `bazel run`).

    Example: `runs/default` -> `<cwd>/runs/default/checkpoints/step_00000400`.
    """
    root = init_from
    if not is_url(init_from) and not pathlib.Path(init_from).expanduser().is_absolute():
        cwd = os.environ.get("BUILD_WORKING_DIRECTORY") or os.getcwd()
        root = str(pathlib.Path(cwd) / pathlib.Path(init_from).expanduser())
    if read_manifest(root) is not None:
        return root
    for directory in (as_path(root) / "checkpoints", as_path(root)):
        step = latest_complete_step(directory) if directory.exists() else None
        if step is not None:
            return str(step_dir(directory, step))
    return root  # restore_arrays names what is wrong with it


def make_warm_start(
    template_prefix: str = "params",
) -> Callable[[Any, str], tuple[Any, list[str]]]:
    """Loads the arrays a checkpoint has into fresh params; lists what it initialised/ignored.

    Arrays are matched by name and shape, so another architecture (Llama -> Qwen3 adds q/k
    norms) loads what it shares with the checkpoint.
    """

    def warm_start(params, init_from: str):
        init_from = checkpoint_of(init_from)
        flat = flatten_state({template_prefix: params})
        loaded = restore_arrays(init_from, flat)
        missing = sorted(set(flat) - set(loaded))
        saved = set(array_names(init_from))
        ignored = sorted(k for k in saved - set(flat) if k.startswith(template_prefix + "."))
        report = [f"loaded {len(loaded)} arrays from {init_from}"]
        report += [f"initialised (not in the checkpoint): {k}" for k in missing]
        report += [f"ignored (not in this model): {k}" for k in ignored]
        return unflatten_state({template_prefix: params}, loaded)[template_prefix], report

    return warm_start
