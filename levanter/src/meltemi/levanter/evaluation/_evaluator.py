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
        eval_loss_fn: `(model, batch) -> (sum of NLL, loss tokens)`, or for a preference
            objective `(model, batch, reference_model) -> (sum of pair losses, pairs,
            {metric: sum over pairs})` (the reference model only when one is passed).
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

    def evaluate_params(self, params: Any, reference: Any = None) -> dict[str, dict[str, float]]:
        """`{set: {"loss": nats per loss token, "bpb": bits per byte, "tokens", "bytes"}}`;
        for preference pairs `{set: {"loss": mean pair loss, "pairs", <metric>: mean}}`.

        Args:
            params: the model's arrays.
            reference: a frozen reference model's arrays (DPO/IPO with a live reference).
        """
        if not self.eval_sets:
            return {}
        if self._fn is None:
            static, loss, dtype = self.static, self.eval_loss_fn, self.compute_dtype

            def eval_step(p, batch, ref):
                model = eqx.combine(cast_floating(p, dtype), static)
                if ref is None:
                    out = loss(model, batch)
                else:
                    out = loss(model, batch, eqx.combine(cast_floating(ref, dtype), static))
                extra = out[2] if len(out) > 2 else {}
                cast = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
                return cast(out[0]), cast(out[1]), {k: cast(v) for k, v in extra.items()}

            with compute_context(self.mesh):
                self._fn = jax.jit(eval_step)
        return {s.name: self._evaluate_set(params, s, reference) for s in self.eval_sets}

    def _evaluate_set(self, params: Any, eval_set: EvalSet, reference: Any) -> dict[str, float]:
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
        total, count, sums = 0.0, 0.0, {}
        with compute_context(mesh):
            for batch in self._cache[eval_set.name]:
                nll, n, extra = self._fn(params, batch, reference)
                total += float(nll)
                count += float(n)
                for k, v in extra.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
        loss = total / max(count, 1.0)
        if sums:  # preference pairs: means over pairs (bits per byte means nothing here)
            return {
                "loss": loss,
                "pairs": count,
                **{k: v / max(count, 1.0) for k, v in sums.items()},
            }
        bpb = total / math.log(2) / max(eval_set.num_bytes, 1)
        return {"loss": loss, "bpb": bpb, "tokens": count, "bytes": float(eval_set.num_bytes)}


def eval_record(evals: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """`eval/<set>/loss` and `eval/<set>/bpb` for metrics.jsonl (for preference pairs
    `eval/<set>/loss` and each preference metric, e.g. `eval/<set>/rewards/accuracies`)."""
    out = {}
    for name, ev in evals.items():
        out[f"eval/{name}/loss"] = ev["loss"]
        if "bpb" in ev:
            out[f"eval/{name}/bpb"] = ev["bpb"]
        else:
            out.update({f"eval/{name}/{k}": v for k, v in ev.items() if "/" in k})
    return out


def eval_line(step: int, evals: Mapping[str, Mapping[str, float]]) -> str:
    """One line for the progress bar's log."""
    parts = [
        f"eval/{n}: loss {e['loss']:.4f}, "
        + (f"bits/byte {e['bpb']:.4f}" if "bpb" in e else
           f"accuracy {e.get('rewards/accuracies', float('nan')):.3f}")
        for n, e in evals.items()
    ]  # fmt: skip
    return f"step {step}: " + "; ".join(parts)
