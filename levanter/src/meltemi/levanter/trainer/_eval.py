"""Evaluation: loss (nats per loss token) and bits per byte on every validation set."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from meltemi.levanter import optim
from meltemi.levanter.mesh import data_parallel_size
from meltemi.levanter.trainer._parts import EvalSet
from meltemi.levanter.trainer._plan import Plan, compute_context
from meltemi.levanter.trainer._sharding import global_batch
from meltemi.levanter.trainer._step import TrainState, cast_floating


class Evaluator:
    """Evaluates parameters on fixed validation batches (placed on the mesh once).

    With an EMA of the parameters in the optimizer state (`optimizer.ema_beta`), the EMA
    parameters are evaluated too, as `<set>-ema`.
    """

    def __init__(self, plan: Plan, eval_loss_fn, eval_sets: list[EvalSet]):
        self.plan = plan
        self.eval_loss_fn = eval_loss_fn
        self.eval_sets = eval_sets
        self._fn = None
        self._cache: dict[str, list] = {}

    def __call__(self, state: TrainState) -> dict[str, dict[str, float]]:
        results = self.evaluate_params(state.params)
        ema = ema_params(state.opt_state)
        if ema is not None:
            for name, values in self.evaluate_params(ema).items():
                results[f"{name}-ema"] = values
        return results

    def evaluate_params(self, params: Any) -> dict[str, dict[str, float]]:
        if not self.eval_sets:
            return {}
        if self._fn is None:
            static, loss, dtype = self.plan.static, self.eval_loss_fn, self.plan.compute_dtype

            def eval_step(p, batch):
                model = eqx.combine(cast_floating(p, dtype), static)
                nll, count = loss(model, batch)
                return jnp.asarray(nll, jnp.float32), jnp.asarray(count, jnp.float32)

            with compute_context(self.plan.mesh):
                self._fn = jax.jit(eval_step)
        return {s.name: self._evaluate_set(params, s) for s in self.eval_sets}

    def _evaluate_set(self, params: Any, eval_set: EvalSet) -> dict[str, float]:
        mesh = self.plan.mesh
        if eval_set.name not in self._cache:
            per, index = jax.process_count(), jax.process_index()
            batches = []
            for b in eval_set.batches:
                b = pad_rows(b, math.lcm(data_parallel_size(mesh), per))
                rows = len(next(iter(b.values()))) // per
                local = {k: v[index * rows : (index + 1) * rows] for k, v in b.items()}
                batches.append(global_batch(local, mesh))
            self._cache[eval_set.name] = batches
        total, count = 0.0, 0.0
        with compute_context(mesh):
            for batch in self._cache[eval_set.name]:
                nll, n = self._fn(params, batch)
                total += float(nll)
                count += float(n)
        loss = total / max(count, 1.0)
        bpb = total / math.log(2) / max(eval_set.num_bytes, 1)
        return {"loss": loss, "bpb": bpb}


def ema_params(opt_state: Any) -> Any:
    """The EMA parameters in an optimizer state, or None when it keeps no EMA."""
    try:
        return optim.ema_of(opt_state)
    except ValueError:
        return None


def pad_rows(batch: Mapping[str, np.ndarray], multiple: int) -> dict[str, np.ndarray]:
    """Pads a host batch with masked-out rows to a multiple of `multiple` rows."""
    batch = {k: np.asarray(v) for k, v in batch.items()}
    rows = len(next(iter(batch.values())))
    extra = -rows % multiple
    if not extra:
        return batch
    out = {}
    for key, value in batch.items():
        fill = np.zeros((extra,) + value.shape[1:], value.dtype)
        if key != "loss_mask":
            fill[...] = value[:1]  # valid tokens; their loss is masked out
        out[key] = np.concatenate([value, fill])
    return out


def eval_record(evals: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """`eval/<set>/loss` and `eval/<set>/bpb` for metrics.jsonl."""
    out = {}
    for name, ev in evals.items():
        out[f"eval/{name}/loss"] = ev["loss"]
        out[f"eval/{name}/bpb"] = ev["bpb"]
    return out


def eval_line(step: int, evals: Mapping[str, Mapping[str, float]]) -> str:
    """One line for the progress bar's log."""
    parts = [f"eval/{n}: loss {e['loss']:.4f}, bits/byte {e['bpb']:.4f}" for n, e in evals.items()]
    return f"step {step}: " + "; ".join(parts)
