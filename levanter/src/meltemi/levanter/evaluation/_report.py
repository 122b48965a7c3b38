"""The results of `//levanter:eval`: a table, and `eval.json` beside the checkpoint."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping
from typing import Any

MACRO = "macro_avg"


def macro_average(evals: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """The unweighted mean over sets of loss and bits per byte (Paloma's macro average: every
    domain counts the same, however many tokens it has).

    Example:
        >>> macro_average({"a": {"loss": 1.0, "bpb": 2.0}, "b": {"loss": 3.0, "bpb": 4.0}})
        {'loss': 2.0, 'bpb': 3.0}
    """
    if not evals:
        return {}
    n = len(evals)
    return {
        "loss": sum(e["loss"] for e in evals.values()) / n,
        "bpb": sum(e["bpb"] for e in evals.values()) / n,
    }


def format_table(evals: Mapping[str, Mapping[str, float]]) -> str:
    """One row per set (loss in nats per token, bits per byte, tokens, bytes) and the macro
    average."""
    header = f"{'set':<20} {'loss':>9} {'bits/byte':>10} {'tokens':>10} {'bytes':>11}"
    lines = [header, "-" * len(header)]
    for name, e in evals.items():
        lines.append(
            f"{name:<20} {e['loss']:>9.4f} {e['bpb']:>10.4f} "
            f"{int(e.get('tokens', 0)):>10,} {int(e.get('bytes', 0)):>11,}"
        )
    avg = macro_average(evals)
    if avg:
        lines.append("-" * len(header))
        lines.append(f"{'macro average':<20} {avg['loss']:>9.4f} {avg['bpb']:>10.4f}")
    return "\n".join(lines)


def report(
    evals: Mapping[str, Mapping[str, float]], *, checkpoint: pathlib.Path, **meta: Any
) -> dict[str, Any]:
    """What `eval.json` holds: the checkpoint, `meta` (kind, step, shape), every set and the
    macro average."""
    return {
        "checkpoint": str(checkpoint),
        **meta,
        "sets": {name: dict(values) for name, values in evals.items()},
        MACRO: macro_average(evals),
    }


def write_report(data: Mapping[str, Any], path: pathlib.Path) -> pathlib.Path:
    """Writes `data` as JSON at `path` (atomically: a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return path
