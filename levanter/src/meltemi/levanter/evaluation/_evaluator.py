"""Loss (nats per loss token) and bits per byte of parameters on fixed validation batches.

One code path for the trainer's in-run evaluation and `//levanter:eval`: `SetEvaluator`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from meltemi.levanter.evaluation._sets import EvalSet
from meltemi.levanter.mesh import data_parallel_size
from meltemi.levanter.runtime import cast_floating, compute_context, global_batch, pad_rows


class SetEvaluator:
    """Evaluates parameters on fixed validation batches (placed on the mesh once).

    Args:
        mesh: the device mesh (batch rows over its data-parallel axes).
        static: the model's non-array half (`eqx.partition`).
        compute_dtype: the dtype floating parameters are cast to for the forward pass.
        eval_loss_fn: `(model, batch) -> (sum of NLL, loss tokens)`.
        eval_sets: the sets to evaluate.
    """

    def __init__(
        self,
        mesh: jax.sharding.Mesh,
        static: Any,
        compute_dtype: Any,
        eval_loss_fn: Callable,
        eval_sets: list[EvalSet],
    ):
        self.mesh = mesh
        self.static = static
        self.compute_dtype = compute_dtype
        self.eval_loss_fn = eval_loss_fn
        self.eval_sets = eval_sets
        self._fn = None
        self._cache: dict[str, list] = {}

    def evaluate_params(self, params: Any) -> dict[str, dict[str, float]]:
        """`{set: {"loss": nats per loss token, "bpb": bits per byte, "tokens", "bytes"}}`."""
        if not self.eval_sets:
            return {}
        if self._fn is None:
            static, loss, dtype = self.static, self.eval_loss_fn, self.compute_dtype

            def eval_step(p, batch):
                model = eqx.combine(cast_floating(p, dtype), static)
                nll, count = loss(model, batch)
                return jnp.asarray(nll, jnp.float32), jnp.asarray(count, jnp.float32)

            with compute_context(self.mesh):
                self._fn = jax.jit(eval_step)
        return {s.name: self._evaluate_set(params, s) for s in self.eval_sets}

    def _evaluate_set(self, params: Any, eval_set: EvalSet) -> dict[str, float]:
        mesh = self.mesh
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
        return {"loss": loss, "bpb": bpb, "tokens": count, "bytes": float(eval_set.num_bytes)}


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
