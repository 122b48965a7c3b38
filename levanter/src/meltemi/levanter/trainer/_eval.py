"""Evaluation: loss (nats per loss token) and bits per byte on every validation set.

One code path for the trainer's in-run evaluation and `//levanter:eval`
(`meltemi.levanter.evaluation`): `SetEvaluator` evaluates parameters on fixed batches, and
`span_bytes` counts the UTF-8 bytes the evaluated tokens encode.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from meltemi import data as md
from meltemi.levanter import optim
from meltemi.levanter.mesh import data_parallel_size
from meltemi.levanter.trainer._parts import EvalSet
from meltemi.levanter.trainer._plan import Plan, compute_context
from meltemi.levanter.trainer._sharding import global_batch
from meltemi.levanter.trainer._step import TrainState, cast_floating

_REPLACEMENT = "\ufffd"


def _prefix_bytes(tokenizer: Any, ids: np.ndarray) -> int:
    """UTF-8 bytes of the text `ids` decode to, without incomplete characters at either end
    (a row may start or end inside a multi-byte character: those pieces decode to U+FFFD)."""
    text = tokenizer.decode(ids).strip(_REPLACEMENT)
    return len(text.encode("utf-8", errors="surrogatepass"))


def span_bytes(tokens: np.ndarray, targets: np.ndarray, loss_mask: np.ndarray, tokenizer) -> int:
    """UTF-8 bytes of the text the loss tokens of one row encode, span by span.

    Each maximal run of loss-masked targets is one span. With the byte tokenizer every byte
    token is one byte (exact, also for characters split across rows). Otherwise a span's bytes
    are the growth of the decoded row prefix over the span, `bytes(decode(row[:end])) -
    bytes(decode(row[:start]))` with the row `tokens[0], targets...`: a character split
    between two spans of a row counts once (where it completes), a SentencePiece word's
    leading space counts with its token, special tokens (eos) count zero, and only the pieces
    of a character cut by the row's own start or end (at most 3 bytes each) are not counted.

    Args:
        tokens: the row's inputs (`targets` shifted right by one).
        targets: the row's next-token targets.
        loss_mask: 1 where the target counts.
        tokenizer: a `meltemi.data.Tokenizer` (anything with `decode(ids) -> str`).
    """
    tokens, targets = np.asarray(tokens), np.asarray(targets)
    mask = np.asarray(loss_mask) > 0
    if not mask.any():
        return 0
    if isinstance(tokenizer, md.ByteTokenizer):
        return int(np.count_nonzero(mask & (targets < 256)))
    row = np.concatenate([tokens[:1], targets])
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    total = 0
    for s, e in zip(starts, ends, strict=True):  # targets[s:e] are row[s + 1 : e + 1]
        total += _prefix_bytes(tokenizer, row[: e + 1]) - _prefix_bytes(tokenizer, row[: s + 1])
    return max(total, 0)


def batch_bytes(batch: Mapping[str, np.ndarray], tokenizer) -> int:
    """UTF-8 bytes the loss tokens of a host batch encode (`span_bytes` of every row)."""
    return sum(
        span_bytes(t, g, m, tokenizer)
        for t, g, m in zip(batch["tokens"], batch["targets"], batch["loss_mask"], strict=True)
    )


def fixed_eval_set(
    name: str, store: Any, tokenizer: Any, seq_len: int, batch_size: int, num_batches: int
) -> EvalSet:
    """The first `num_batches` batches of `batch_size` rows of a token store, unshuffled
    (fewer when the set is shorter; at least one), with their byte count.

    Args:
        name: the set's name in metric names.
        store: a `meltemi.data.TokenStore`.
        tokenizer: the store's tokenizer (decodes the loss tokens for the byte count).
        seq_len: tokens per row.
        batch_size: rows per batch.
        num_batches: the most batches to take.
    """
    ds = md.PackedDataset(store, seq_len=seq_len, batch_size=batch_size, seed=0)
    count = min(num_batches, max(1, ds.num_sequences // batch_size))
    batches = [ds.sequences(np.arange(i * batch_size, (i + 1) * batch_size)) for i in range(count)]
    return EvalSet(name, batches, sum(batch_bytes(b, tokenizer) for b in batches))


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


class Evaluator(SetEvaluator):
    """The trainer's evaluation of a run's plan (a `SetEvaluator` on its mesh and model).

    With an EMA of the parameters in the optimizer state (`optimizer.ema_beta`), the EMA
    parameters are evaluated too, as `<set>-ema`.
    """

    def __init__(self, plan: Plan, eval_loss_fn, eval_sets: list[EvalSet]):
        super().__init__(plan.mesh, plan.static, plan.compute_dtype, eval_loss_fn, eval_sets)
        self.plan = plan

    def __call__(self, state: TrainState) -> dict[str, dict[str, float]]:
        results = self.evaluate_params(state.params)
        ema = ema_params(state.opt_state)
        if ema is not None:
            for name, values in self.evaluate_params(ema).items():
                results[f"{name}-ema"] = values
        return results


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


class HarnessHook:
    """lm-evaluation-harness tasks during training (`eval.harness_tasks` every
    `eval.harness_every_steps` steps), logged as `harness/<task>/<metric>`.

    lm-eval (the `harness` extra) is imported only when tasks are configured; the task names
    are checked when the hook is built, before the first step.
    """

    def __init__(self, spec: Any, plan: Plan):
        self.spec, self.plan = spec, plan
        self.every = spec.eval.harness_every_steps if spec.eval.harness_tasks else 0
        self._lm = None
        if self.every:
            try:
                from meltemi.levanter import harness
            except ImportError as e:
                from meltemi.levanter.config import ConfigError

                raise ConfigError(
                    f"eval.harness_tasks={spec.eval.harness_tasks!r} needs lm-eval ({e}); "
                    f"install the harness extra: pip install 'meltemi-levanter[harness]'."
                ) from None
            manager = harness.task_manager(spec.eval.harness_include_path, spec.eval.harness_tasks)
            harness.check_tasks(spec.eval.harness_tasks, manager)

    def due(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    def __call__(self, params: Any, step: int) -> dict[str, float]:
        """Runs the tasks on `params`; returns `{"harness/<task>/<metric>": value}`."""
        from meltemi.levanter import harness
        from meltemi.levanter.evaluation import LoadedModel

        spec, plan = self.spec, self.plan
        loaded = LoadedModel(spec.run_dir, "run", params, plan.static, spec.tokenizer,
                             plan.mesh, plan.compute_dtype, spec, step)  # fmt: skip
        if self._lm is None:
            self._lm = harness.MeltemiLM(loaded=loaded, batch_size=spec.eval.batch_size)
        else:  # same model and tokenizer, new parameters: keep the compiled functions
            self._lm.set_params(loaded)
        results = harness.run_tasks(
            self._lm,
            spec.eval.harness_tasks,
            include_path=spec.eval.harness_include_path,
            limit=spec.eval.harness_limit or None,
            seed=spec.trainer.seed,
        )
        return harness.harness_metrics(results)


def harness_line(step: int, metrics: Mapping[str, float]) -> str:
    """One line for the progress bar's log."""
    return f"step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
