"""Model shapes, FLOP accounting and the runs of a sweep (nothing is trained here).

A run's compute is `C = flops_per_token * tokens`, with `flops_per_token` the trainer's
analytic count (`meltemi.models.flops_per_token`): `6N` for `N` = the (active) non-embedding
parameters plus the output projection, plus causal attention `12 * seq_len * heads *
head_dim * layers` (QK^T and AV over the full key length, forward and backward). That is
also the `N` the fits use (`RunPlan.n_params`); `RunPlan.params` counts everything.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import meltemi.models as mm
from meltemi.levanter.config import ResolvedConfig, resolve
from meltemi.levanter.experiments._spec import SweepConfigError, SweepSpec

_MOE_HINT = "set --config.model.preset to an MoE preset (e.g. tiny-mixtral) for sweep.family=moe"


@dataclasses.dataclass(frozen=True)
class Shape:
    """One rung of the ladder: a width and what the rules derive from it."""

    width: int
    layers: int
    heads: int
    head_dim: int
    intermediate: int

    def overrides(self, sweep: SweepSpec) -> dict[str, Any]:
        """The `model.*` keys of this shape."""
        out = {
            "model.hidden_dim": self.width,
            "model.num_layers": self.layers,
            "model.num_heads": self.heads,
            "model.num_kv_heads": self.heads,
            "model.head_dim": self.head_dim,
            "model.intermediate_dim": self.intermediate,
        }
        if sweep.family == "moe":
            out["model.num_experts"] = sweep.num_experts
            out["model.num_experts_per_token"] = sweep.experts_per_token
        return out


def shape_of(width: int, sweep: SweepSpec) -> Shape:
    """The ladder rule: depth from the width, heads of `head_dim`, a `mlp_ratio` MLP.

    Example:
        >>> from meltemi.levanter.experiments import sweep_section, sweep_spec
        >>> shape_of(96, sweep_spec(sweep_section()))
        Shape(width=96, layers=3, heads=6, head_dim=16, intermediate=256)
    """
    layers = max(sweep.min_layers, round(width / sweep.width_per_layer))
    intermediate = 8 * math.ceil(sweep.mlp_ratio * width / 8)
    return Shape(width, layers, width // sweep.head_dim, sweep.head_dim, intermediate)


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """One training run of a sweep.

    Attributes:
        name: its directory under `<run_dir>/runs/`.
        kind: "isoflop", "batch" or "verify".
        budget: the compute budget it was sized for (FLOPs).
        shape: the model shape.
        batch_size: rows per step.
        steps: optimizer steps.
        seq_len: tokens per row.
        n_params: N of 6N (active non-embedding parameters plus the output head).
        params: every parameter.
        flops_per_token: 6N plus attention (training).
    """

    name: str
    kind: str
    budget: float
    shape: Shape
    batch_size: int
    steps: int
    seq_len: int
    n_params: int
    params: int
    flops_per_token: float

    @property
    def tokens(self) -> int:
        """Tokens trained."""
        return self.batch_size * self.steps * self.seq_len

    @property
    def flops(self) -> float:
        """The compute actually spent (the budget up to rounding the steps)."""
        return self.flops_per_token * self.tokens

    def to_json(self) -> dict[str, Any]:
        """A plain dict for `isoflop.json`."""
        out = dataclasses.asdict(self)
        out.update(tokens=self.tokens, flops=self.flops)
        return out


def _strip_sweep(base: ResolvedConfig) -> ResolvedConfig:
    resolved = ResolvedConfig.from_json(base.to_json())
    config = resolved.config
    if "sweep" in config:
        with config.unlocked():
            del config["sweep"]
    provenance = {k: v for k, v in resolved.provenance.items() if not k.startswith("sweep.")}
    return ResolvedConfig(config, provenance, resolved.spec, resolved.overrides)


def with_values(base: ResolvedConfig, values: Mapping[str, Any]) -> ResolvedConfig:
    """`base` without its `sweep` section and with these dotted keys set (provenance "flag")."""
    resolved = _strip_sweep(base)
    config = resolved.config
    for key, value in values.items():
        node = config
        *parents, last = key.split(".")
        for part in parents:
            node = node[part]
        if last not in node:
            raise SweepConfigError(f"{key}: the trainer config has no such key.")
        with node.unlocked():
            node[last] = value
    provenance = dict(resolved.provenance)
    provenance.update({k: "flag" for k in values})
    return ResolvedConfig(config, provenance, resolved.spec, resolved.overrides)


def config_digest(resolved: ResolvedConfig) -> str:
    """SHA-256 of a run's config (minus its run_dir): what a finished run is checked against."""
    values = resolved.config.to_dict()
    values.pop("run_dir", None)
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()


class Ladder:
    """The shapes of `sweep.widths` with their model configs and FLOP counts.

    Args:
        base: the loaded experiment config (the trainer config plus `sweep`).
        sweep: the checked `sweep` section.
    """

    def __init__(self, base: ResolvedConfig, sweep: SweepSpec):
        self.base = base
        self.sweep = sweep
        self.seq_len = int(base.config.data.seq_len)
        self.shapes = [shape_of(w, sweep) for w in sweep.widths]
        self._models = {s.width: self._model(s) for s in self.shapes}
        self.shapes.sort(key=self.n_params)

    def _model(self, shape: Shape) -> mm.ModelConfig:
        spec = resolve(with_values(self.base, shape.overrides(self.sweep)))
        if self.sweep.family == "moe" and spec.model.moe is None:
            raise SweepConfigError(f"model.preset={spec.preset!r} has no experts: {_MOE_HINT}.")
        if self.sweep.family == "dense" and spec.model.moe is not None:
            raise SweepConfigError(
                f"model.preset={spec.preset!r} is an MoE preset but sweep.family='dense'; set "
                "--config.sweep.family=moe or a dense preset (e.g. tiny-llama)."
            )
        return spec.model

    def model(self, shape: Shape) -> mm.ModelConfig:
        """The resolved `ModelConfig` of a shape."""
        return self._models[shape.width]

    def n_params(self, shape: Shape) -> int:
        """N of 6N for a shape."""
        cfg = self.model(shape)
        return mm.param_count(cfg, active=True, embeddings=False) + cfg.vocab_size * cfg.hidden_dim

    def flops_per_token(self, shape: Shape) -> float:
        """Training FLOPs per token (6N + attention)."""
        return mm.flops_per_token(self.model(shape), self.seq_len)

    def shape(self, width: int) -> Shape:
        """The ladder shape of this width (any width, not only the listed ones)."""
        for s in self.shapes:
            if s.width == width:
                return s
        shape = shape_of(width, self.sweep)
        self._models[width] = self._model(shape)
        return shape

    def nearest(self, n: float) -> Shape:
        """The ladder shape whose N is closest to `n` in log space."""
        return min(self.shapes, key=lambda s: abs(math.log(self.n_params(s) / n)))

    def batch_size(self, tokens: float) -> int:
        """The batch rule: a power of two near `tokens / (seq_len * target_steps)`, clipped."""
        rows = tokens / (self.seq_len * self.sweep.target_steps)
        size = 2 ** round(math.log2(max(rows, 1.0)))
        return int(min(max(size, self.sweep.min_batch), self.sweep.max_batch))

    def plan(
        self, kind: str, budget: float, shape: Shape, batch_size: int | None = None
    ) -> RunPlan:
        """The run that spends `budget` FLOPs on `shape` (steps rounded to the nearest)."""
        fpt = self.flops_per_token(shape)
        tokens = budget / fpt
        batch = batch_size or self.batch_size(tokens)
        steps = round(tokens / (batch * self.seq_len))
        if steps < 1:
            raise SweepConfigError(
                f"budget {budget:.3g} FLOPs is less than one step of width {shape.width} at batch "
                f"{batch} ({fpt * batch * self.seq_len:.3g} FLOPs); raise the budget or lower "
                "sweep.min_batch."
            )
        prefix = {"isoflop": "", "batch": "batch_", "verify": "verify_"}[kind]
        name = f"{prefix}c{budget:.3g}_d{shape.width}".replace("+", "")
        if kind == "batch":
            name += f"_b{batch}"
        cfg = self.model(shape)
        return RunPlan(
            name=name,
            kind=kind,
            budget=float(budget),
            shape=shape,
            batch_size=batch,
            steps=steps,
            seq_len=self.seq_len,
            n_params=self.n_params(shape),
            params=mm.param_count(cfg),
            flops_per_token=fpt,
        )

    def isoflop_runs(self) -> list[RunPlan]:
        """Per budget, `sizes_per_budget` consecutive shapes centred on N = sqrt(C / 6r).

        The batch size is the batch rule's for the budget's largest shape, the same for every
        size of the budget; steps = tokens / (batch * seq_len), rounded.
        """
        runs = []
        k = self.sweep.sizes_per_budget
        for budget in self.sweep.budgets:
            guess = math.sqrt(budget / (6 * self.sweep.tokens_per_param))
            centre = self.shapes.index(self.nearest(guess))
            start = min(max(centre - (k - 1) // 2, 0), len(self.shapes) - k)
            # One batch size per budget, so sizes differ only in steps: the batch rule's for
            # the largest shape (the fewest tokens), so that every size gets >= ~target_steps.
            shapes = self.shapes[start : start + k]
            batch = self.batch_size(budget / self.flops_per_token(shapes[-1]))
            runs += [self.plan("isoflop", budget, s, batch) for s in shapes]
        return runs

    def batch_runs(self) -> list[RunPlan]:
        """`--sweep=batch`: every batch size of `sweep.batch_sizes` at each batch budget."""
        budgets = self.sweep.batch_budgets or (self.sweep.budgets[-1],)
        runs = []
        for budget in budgets:
            if self.sweep.batch_width:
                shape = self.shape(self.sweep.batch_width)
            else:
                shape = self.nearest(math.sqrt(budget / (6 * self.sweep.tokens_per_param)))
            runs += [self.plan("batch", budget, shape, b) for b in self.sweep.batch_sizes]
        return runs

    def run_config(self, run: RunPlan, run_dir: str, overrides: Sequence[tuple[str, Any]] = ()):
        """The trainer config of one run (a `ResolvedConfig` without the `sweep` section)."""
        values: dict[str, Any] = dict(run.shape.overrides(self.sweep))
        values.update(
            {
                "name": run.name,
                "run_dir": run_dir,
                "trainer.num_train_steps": run.steps,
                "trainer.train_batch_size": run.batch_size,
                "trainer.batch_schedule": "",
                "trainer.progress_bar": False,
                # Only the final eval counts for the fit; the final checkpoint is always saved,
                # and a coarse rolling one lets a killed run resume.
                "eval.every_steps": 0,
                "checkpoint.save_every_steps": 0,
                "checkpoint.save_every_minutes": 3.0,
            }
        )
        values.update(dict(overrides))
        return with_values(self.base, values)
