"""Data provenance: which documents fill row R of step S of a run, and the row's text.

The rows of a step are a pure function of (config, seed, step) (`meltemi.data`), so the run's
saved `config.json` rebuilds its training rows: the same token stores (reopened from the data
cache the run built them in) and the same packing or mixture; `locate_sequence` then names the
pieces without reading any other row.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import ml_collections

from meltemi.levanter.config import ConfigError, ResolvedConfig, RunSpec, base_config, resolve
from meltemi.levanter.dashboard._root import DashboardError, NotFoundError
from meltemi.levanter.dashboard._runs import CONFIG_FILE, Runs
from meltemi.levanter.trainer import build_parts


def _with_defaults(saved: ResolvedConfig) -> ResolvedConfig:
    """A saved config with keys added to `base_config()` since it was written, at their
    defaults (so a run of an older version still resolves)."""
    config = base_config()

    def merge(dst: ml_collections.ConfigDict, src: Mapping[str, Any]) -> None:
        for key, value in src.items():
            if isinstance(value, Mapping) and isinstance(dst.get(key), ml_collections.ConfigDict):
                merge(dst[key], value)
            else:
                dst[key] = value

    merge(config, saved.config.to_dict())
    config.lock()
    return ResolvedConfig(config, saved.provenance, saved.spec, saved.overrides)


class Provenance:
    """Rebuilds each run's training rows once (on first use) and locates rows in them."""

    def __init__(self, runs: Runs):
        self.runs = runs
        self._lock = threading.Lock()
        self._built: dict[str, tuple[RunSpec, Any, dict[str, str]]] = {}

    def _rows_of(self, run_id: str) -> tuple[RunSpec, Any, dict[str, str]]:
        with self._lock:
            if run_id not in self._built:
                self.runs.run_path(run_id)
                text = self.runs.root.read_text(self.runs.root.path(run_id, CONFIG_FILE))
                if text is None:
                    raise NotFoundError(f"run {run_id!r}: no config.json, so its rows are unknown.")
                try:
                    resolved = _with_defaults(ResolvedConfig.from_json(text))
                    spec = resolve(resolved)
                    data = build_parts(spec).train_data
                except (ConfigError, ValueError, KeyError) as e:
                    raise DashboardError(
                        f"run {run_id!r}: its config.json does not rebuild its data ({e})."
                    ) from None
                data_config = resolved.config.data
                sources = {"": str(data_config.source)}
                for name, component in data_config.components.items():
                    sources[name] = str(component.source)
                self._built[run_id] = (spec, data, sources)
            return self._built[run_id]

    def locate(self, run_id: str, step: int, row: int) -> dict[str, Any]:
        """The documents of row `row` of step `step` (1-based, as in metrics.jsonl)."""
        spec, data, sources = self._rows_of(run_id)
        total = spec.trainer.num_train_steps
        if not 1 <= step <= total:
            raise DashboardError(
                f"step={step}: outside the run's steps 1..{total}; pick a step in that range."
            )
        sizes = spec.trainer.batch_sizes
        size = sizes.size_at(step - 1)  # metrics step s trains the rows of data step s - 1
        if not 0 <= row < size:
            raise DashboardError(
                f"row={row}: step {step} has {size} rows; pick a row in 0..{size - 1}."
            )
        global_row = sizes.rows_before(step - 1) + row
        documents = []
        for piece in sorted(data.locate_sequence(global_row), key=lambda p: p.row_offset):
            source = data.components[piece.component] if piece.component else data
            store = source.store
            tokens = store.tokens(
                piece.document, piece.token_offset, piece.token_offset + piece.length
            )
            documents.append(
                {
                    "component": piece.component,
                    "source": sources.get(piece.component or "", sources[""]),
                    "document": piece.document,
                    "path": store.location(piece.document),
                    "offset": piece.token_offset,
                    "tokens": piece.length,
                    "row_offset": piece.row_offset,
                    "token_ids": [int(t) for t in tokens],
                    "text": spec.tokenizer.decode(tokens),
                }
            )
        return {
            "step": step,
            "row": row,
            "batch_size": size,
            "global_row": global_row,
            "documents": documents,
            "text": "".join(d["text"] for d in documents),
        }
