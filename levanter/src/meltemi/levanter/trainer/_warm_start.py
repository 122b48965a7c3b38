"""Warm start (`checkpoint.init_from`): a fresh run initialised from a checkpoint's arrays."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meltemi.levanter.checkpoint import array_names, flatten_state, restore_arrays, unflatten_state


def make_warm_start(
    template_prefix: str = "params",
) -> Callable[[Any, str], tuple[Any, list[str]]]:
    """Loads the arrays a checkpoint has into fresh params; lists what it initialised/ignored.

    Arrays are matched by name and shape, so another architecture (Llama -> Qwen3 adds q/k
    norms) loads what it shares with the checkpoint.
    """

    def warm_start(params, init_from: str):
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
