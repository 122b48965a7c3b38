"""The RL trainer: rollouts from fray workers, GRPO/RLOO or on-policy distillation updates.

One step (version `v` = steps done):

1. the prompts of the step are `[cursor, cursor + P)` of the environment's training order
   (`envs.PromptSource`, seeded by `trainer.seed`); the workers are asked for them, and for
   `rl.steps_ahead` steps more, as they become idle;
2. the trainer waits until every group of the step has arrived, and takes them from the
   buffer: fresh ones are used, stale ones (sampled at `v - 1 .. v - max_staleness`) get a
   truncated importance weight, older ones are dropped (`rl/staleness/*` counts);
3. one optimizer update on the policy loss (or the distillation loss), then the cursor moves
   by `P` and the new weights go to the workers (`rl/sync/*`: seconds and bytes);
4. the metrics go to `metrics.jsonl` (and TensorBoard / W&B) with the trained prompt indices,
   and a checkpoint (train state + cursor) is saved when due.

A resumed run restores the state and the cursor, so it trains the same prompts in the same
order; the rollouts in flight when the trainer died are simply sampled again. SIGTERM (a
preemption notice) stops the run after the step in progress with a checkpoint of it
(`RunResult.preempted`; the binary exits 75), as the trainer does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import meltemi.models as mm
from meltemi import fray
from meltemi.levanter.checkpoint import Checkpointer, RetentionPolicy
from meltemi.levanter.config import RLSpec, RunSpec
from meltemi.levanter.envs import (
    ArithmeticEnv,
    Environment,
    MathEnv,
    PromptSource,
    failure_counts,
)
from meltemi.levanter.envs import Score as _Score
from meltemi.levanter.rl._advantages import advantages
from meltemi.levanter.rl._batch import StepBatch, sampled_logps, step_batch
from meltemi.levanter.rl._buffer import STALENESS_KINDS, RolloutBuffer
from meltemi.levanter.rl._distill import load_teacher, reverse_kl
from meltemi.levanter.rl._objectives import distill_loss, policy_loss, truncated_is_weights
from meltemi.levanter.rl._pool import RolloutPool
from meltemi.levanter.rl._rollout import Group, WorkerSpec, weight_payload
from meltemi.levanter.trainer import (
    MetricsSink,
    Preemption,
    RunResult,
    init_state,
    make_warm_start,
    model_parts,
)
from meltemi.models.engine import EngineConfig


@dataclasses.dataclass
class RLResult:
    """What an RL run did.

    Attributes:
        run: the trainer's `RunResult` (run dir, steps, losses).
        evals: `{step: {"reward": ..., ...}}` of the held-out evaluations.
        trained: `{step: [prompt index, ...]}` of the steps this process ran.
        staleness: run totals of used / corrected / dropped groups.
        workers_lost: worker deaths survived.
    """

    run: RunResult
    evals: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)
    trained: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    staleness: dict[str, int] = dataclasses.field(default_factory=dict)
    workers_lost: int = 0

    def summary(self) -> str:
        """The end-of-run text: steps, held-out evaluations, staleness, where things are."""
        run = self.run
        state = "stopped by SIGTERM (run it again to resume)" if run.preempted else "finished"
        lines = [f"run {state}: step {run.step} ({run.step - run.start_step} steps this run)"]
        for step, ev in sorted(self.evals.items()):
            values = ", ".join(f"{k} {v:.4f}" for k, v in ev.items())
            lines.append(f"  eval at step {step}: {values}")
        counts = ", ".join(f"{k} {v}" for k, v in self.staleness.items())
        lines.append(f"  rollout groups: {counts}; workers lost and replaced: {self.workers_lost}")
        lines.append(f"  run dir: {run.run_dir}")
        return "\n".join(lines)


def make_env(rl: RLSpec) -> Environment:
    """The environment `rl.env` names."""
    if rl.env == "math":
        return MathEnv.from_jsonl(rl.problems)
    return ArithmeticEnv(
        max_operand=rl.max_operand, ops=rl.ops, carries=rl.carries, retries=rl.max_turns - 1
    )


def make_cluster(rl: RLSpec) -> Any:
    """The fray cluster of `rl.backend`."""
    if rl.backend == "inprocess":
        return fray.InProcessCluster()
    if rl.backend == "ray":
        from meltemi.fray.ray import RayCluster  # the `ray` extra, only when asked for

        return RayCluster()
    return fray.LocalCluster(call_timeout=None)


def _train_step(
    spec: RunSpec, rl: RLSpec, static: Any, optimizer: Any, teacher_static: Any = None
) -> Callable:
    """The jitted update: (state, batch, ref, teacher) -> (state, metrics); the teacher's
    arrays combine with `teacher_static` (default: the student's `static`)."""
    lora = spec.lora.enabled

    def logps_of(params, tokens, structure=static):
        model = eqx.combine(params, structure)
        if lora and structure is static:
            model = mm.lora.freeze(model)
        return sampled_logps(model(tokens).array, tokens)

    def loss_fn(params, batch, ref_params, teacher_params):
        tokens, mask = batch["tokens"], batch["mask"]
        logps = logps_of(params, tokens)
        prox = jax.lax.stop_gradient(logps)  # the proximal policy: these weights
        stale = batch["stale"][:, None] > 0
        weights = jnp.where(
            stale, truncated_is_weights(prox, batch["behaviour"], mask, cap=rl.is_cap), 1.0
        )
        if rl.objective == "distill":
            structure = static if teacher_static is None else teacher_static
            teacher = jax.lax.stop_gradient(logps_of(teacher_params, tokens, structure))
            return distill_loss(
                logps, teacher, mask, aggregation=rl.aggregation, is_weights=weights
            )
        old = jnp.where(stale, prox, batch["behaviour"])
        adv = advantages(rl.objective, batch["rewards"], scale_by_std=rl.scale_by_std)
        ref = None
        if rl.kl_beta > 0:
            ref = jax.lax.stop_gradient(logps_of(ref_params, tokens))
        return policy_loss(
            logps, old, adv.reshape(-1), mask,
            clip_low=rl.clip_low, clip_high=rl.clip_high, ref_logps=ref, beta=rl.kl_beta,
            aggregation=rl.aggregation, is_weights=weights,
        )  # fmt: skip

    @jax.jit
    def step(state, batch, ref_params, teacher_params):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params, batch, ref_params, teacher_params
        )
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {f"rl/{k}": v for k, v in metrics.items()}
        metrics["train/loss"] = loss
        metrics["optim/grad_norm"] = optax.tree.norm(grads)
        metrics["optim/update_norm"] = optax.tree.norm(updates)
        return dataclasses.replace(state, step=state.step + 1, params=params,
                                   opt_state=opt_state), metrics  # fmt: skip

    return step


def _reward_metrics(env: str, groups: list[Group]) -> dict[str, Any]:
    rewards = np.array([r for g in groups for r in g.rewards], np.float64)
    lengths = np.array([len(r) for g in groups for r in g.responses], np.float64)
    scores = [_Score(0.0, f) for g in groups for f in g.failures]
    out: dict[str, Any] = {}
    if rewards.size:
        out[f"rl/{env}/reward_mean"] = float(rewards.mean())
        out[f"rl/{env}/reward_std"] = float(rewards.std())
        for q in (0, 25, 50, 75, 100):
            out[f"rl/{env}/reward_p{q}"] = float(np.percentile(rewards, q))
        out["rl/response_length_mean"] = float(lengths.mean())
        out["rl/response_length_max"] = float(lengths.max())
    for reason, count in failure_counts(scores).items():
        out[f"rl/{env}/verifier_failures/{reason}"] = count
    return out


class RLTrainer:
    """An RL run of `spec` (the trainer's sections) and `rl` (the `rl.*` section).

    Args:
        spec: the checked config (`resolve(...)`).
        rl: the checked `rl` section (`rl_spec(...)`).
        cluster: a fray cluster for the workers (default: `rl.backend`'s, shut down at the end).
        env: the environment (default: `rl.env`'s).
        on_step: called with `(step, pool)` after each step (tests kill workers from it).
    """

    def __init__(self, spec: RunSpec, rl: RLSpec, *, cluster: Any = None,
                 env: Environment | None = None,
                 on_step: Callable[[int, RolloutPool], None] | None = None):  # fmt: skip
        self.spec, self.rl, self.on_step = spec, rl, on_step
        self._cluster = cluster
        self.env = env if env is not None else make_env(rl)
        self.prompts = PromptSource(self.env, "train", seed=spec.trainer.seed)

    # -- set-up ------------------------------------------------------------------------------
    def _initial_model(self) -> Any:
        parts = model_parts(self.spec)
        model = parts.init_model(jax.random.key(self.spec.trainer.seed))
        params, static = eqx.partition(model, eqx.is_array)
        if self.spec.checkpoint.init_from:
            params, report = make_warm_start()(params, self.spec.checkpoint.init_from)
            print(f"warm start: {report[0]}", flush=True)
        return params, static, parts.optimizer

    def _worker_spec(self) -> WorkerSpec:
        spec, rl = self.spec, self.rl
        engine = EngineConfig(
            kv_bytes=rl.kv_bytes, page_size=16, max_seqs=rl.max_seqs,
            max_seq_len=spec.data.seq_len, seed=spec.trainer.seed, prefix_cache=rl.prefix_cache,
        )  # fmt: skip
        return WorkerSpec(
            model=spec.model, lora=spec.lora if spec.lora.enabled else None, engine=engine,
            tokenizer=spec.data.tokenizer, env=self.env, samples=rl.samples_per_prompt,
            max_tokens=rl.max_tokens, temperature=rl.temperature, seed=spec.trainer.seed,
            verify_timeout_s=rl.verify_timeout_s, max_turns=rl.max_turns,
        )  # fmt: skip

    # -- the run -----------------------------------------------------------------------------
    def run(self) -> RLResult:
        """Trains `trainer.num_train_steps` steps (resuming from the newest checkpoint)."""
        spec, rl = self.spec, self.rl
        with contextlib.ExitStack() as stack:
            params, static, optimizer = self._initial_model()
            self._static = static
            state = {"train": init_state(params, optimizer), "cursor": jnp.zeros((), jnp.int32)}
            ckpt = None
            if spec.checkpoint.enabled:
                c = spec.checkpoint
                ckpt = Checkpointer(
                    spec.run_dir / "checkpoints",
                    RetentionPolicy(c.save_every_steps, c.save_every_minutes, c.keep_every_steps),
                    async_save=c.async_save, verify=c.verify,
                )  # fmt: skip
                stack.callback(ckpt.close)
                if ckpt.all_steps():
                    _, state = ckpt.restore(state)
            # Every leaf committed to the device, as the step's outputs are: otherwise the
            # second step compiles again for the changed input shardings.
            state = jax.device_put(state, jax.devices()[0])
            start = int(state["train"].step)
            spec.run_dir.mkdir(parents=True, exist_ok=True)
            result = RLResult(RunResult(spec.run_dir, start, start))
            sink = MetricsSink(
                spec, spec.run_dir, True, start, result.run, stack,
                seq_len=spec.data.seq_len, model_flops=lambda b, t: None,
                peak_flops=lambda: 1.0,
            )  # fmt: skip
            ref = params if rl.kl_beta > 0 else None
            teacher, self._teacher_static = None, None
            if rl.objective == "distill":
                teacher, self._teacher_static = load_teacher(spec, rl.teacher, params, static)
            step_fn = self.step_fn = _train_step(spec, rl, static, optimizer, self._teacher_static)
            cluster = self._cluster or stack.enter_context(make_cluster(rl))
            payload = weight_payload(state["train"].params, adapters_only=False)
            pool = RolloutPool(
                cluster, self._worker_spec(), payload, num_workers=rl.num_workers,
                restart=fray.RestartPolicy(max_failures=rl.worker_restarts,
                                           backoff_initial_s=0.1),
                version=start,
            )  # fmt: skip
            self._loop(state, start, pool, step_fn, ref, teacher, ckpt, sink, result)
            result.staleness = dict(self._buffer.totals)
            result.workers_lost = pool.lost
        return result

    def _loop(self, state, start, pool, step_fn, ref, teacher, ckpt, sink, result) -> None:
        rl = self.rl
        self._buffer = RolloutBuffer((rl.steps_ahead + 1) * rl.prompts_per_step, rl.max_staleness)
        self._requested = int(state["cursor"])
        self._evals: dict[int, Group] = {}
        self._evaluate(pool, start, state, teacher, sink, result)
        with Preemption() as preemption:  # SIGTERM: a flag read after each step
            for step in range(start, self.spec.trainer.num_train_steps):
                state, stop = self._step(step, state, pool, step_fn, ref, teacher, ckpt, sink,
                                         result, preemption)  # fmt: skip
                if stop:
                    break
        if ckpt is not None:
            ckpt.wait()

    def _step(self, step, state, pool, step_fn, ref, teacher, ckpt, sink, result,
              preemption) -> tuple[dict, bool]:  # fmt: skip
        """One RL step (module docstring): the new state, and whether SIGTERM stops the run."""
        spec, rl = self.spec, self.rl
        p, steps, buffer = rl.prompts_per_step, spec.trainer.num_train_steps, self._buffer
        chunk = math.ceil(p / rl.num_workers)
        cursor = int(state["cursor"])
        t0 = time.perf_counter()
        limit = cursor + (rl.steps_ahead + 1) * p
        while self._requested < limit:
            count = min(chunk, limit - self._requested)
            pool.request(
                [(i, self.prompts[i]) for i in range(self._requested, self._requested + count)]
            )
            self._requested += count
        while any(i not in buffer for i in range(cursor, cursor + p)):
            for group in pool.poll(timeout=1.0):
                buffer.put(group)
        wait_s = time.perf_counter() - t0
        taken = buffer.take(range(cursor, cursor + p), step)
        batch = step_batch(taken.groups, taken.staleness, prompts=p,
                           n=rl.samples_per_prompt, length=spec.data.seq_len)  # fmt: skip
        t1 = time.perf_counter()
        arrays = {k: jnp.asarray(v) for k, v in batch.as_dict().items() if k != "present"}
        train, metrics = step_fn(state["train"], arrays, ref, teacher)
        metrics = jax.device_get(metrics)
        train_s = time.perf_counter() - t1
        cursor += p
        state = {"train": train, "cursor": jnp.asarray(cursor, jnp.int32)}
        payload = weight_payload(train.params, adapters_only=spec.lora.enabled)
        send_s, sent = pool.sync(payload, step + 1)
        record = self._record(step + 1, batch, taken, metrics, wait_s, train_s, send_s, sent,
                              pool)  # fmt: skip
        result.trained[step + 1] = [g.index for g in taken.groups]
        last = step + 1 == steps
        every = rl.eval_every_steps
        if last or (every and (step + 1) % every == 0):
            self._evaluate(pool, step + 1, state, teacher, sink, result)
            for k, v in result.evals.get(step + 1, {}).items():
                record[f"eval/{self.env.name}/{k}"] = v
        sink.write(record)
        result.run.step = step + 1
        if self.on_step is not None:
            self.on_step(step + 1, pool)
        stop = preemption.requested and not last
        kind = "permanent" if last else (ckpt.due(step + 1) if ckpt else None)
        if stop:
            kind = kind or "temporary"
            result.run.preempted = True
            saved = "checkpoint saved" if ckpt is not None else "no checkpoint (disabled)"
            sink.say(f"step {step + 1}: SIGTERM: {saved}, stopping (exit 75)")
        if ckpt is not None and kind is not None:
            ckpt.save(step + 1, state, config_json=spec.to_json(), kind=kind)
            result.run.checkpoint_saved = True
        return state, stop

    def _record(self, step, batch: StepBatch, taken, metrics, wait_s, train_s, send_s, sent,
                pool) -> dict:  # fmt: skip
        groups = taken.groups
        record: dict[str, Any] = {"step": step, "batch_size": int(batch.tokens.shape[0])}
        record["_device"] = {k: float(v) for k, v in metrics.items()}
        record["_elapsed"] = max(wait_s + train_s, 1e-9)
        record["_batch_hash"] = batch.fingerprint()
        record.update(_reward_metrics(self.env.name, groups))
        for kind in STALENESS_KINDS:
            record[f"rl/staleness/{kind}"] = taken.counts[kind]
            record[f"rl/staleness/{kind}_total"] = self._buffer.totals[kind]
        record["rl/staleness/mean_lag"] = float(np.mean(taken.staleness)) if groups else 0.0
        response_tokens = float(batch.mask.sum())
        gen_s = sum(g.generate_s for g in groups)
        record["time/generation_wait_s"] = wait_s
        record["time/generation_s"] = gen_s
        record["time/scoring_s"] = sum(g.score_s for g in groups)
        record["time/training_s"] = train_s
        record["throughput/rollout_tokens_per_second"] = response_tokens / max(gen_s, 1e-9)
        record["throughput/train_tokens_per_second"] = response_tokens / max(train_s, 1e-9)
        record["rl/sync/send_s"] = send_s
        record["rl/sync/bytes"] = sent
        if pool.apply_s:
            record["rl/sync/apply_s"] = float(np.max(pool.apply_s))
            pool.apply_s.clear()
        record["rl/workers_lost"] = pool.lost
        record["rl/prompts"] = [g.index for g in groups]
        record["rl/dropped_prompts"] = taken.dropped
        return record

    # -- held-out evaluation -----------------------------------------------------------------
    def _evaluate(self, pool, step, state, teacher, sink, result) -> None:
        """The held-out split's exact-match reward, greedy ("reward") and of the policy's
        `n` samples at `rl.temperature` ("reward_sampled"); distilling, also the reverse KL to
        the teacher on those samples ("reverse_kl")."""
        rl = self.rl
        count = min(rl.eval_prompts, self.env.size("test"))
        if count == 0:
            return
        prompts = [(-(i + 1), self.env.prompt("test", i)) for i in range(count)]
        greedy = self._gather(pool, prompts, greedy=True)
        sampled = self._gather(pool, prompts, greedy=False)
        out = {
            "reward": float(np.mean([g.rewards[0] for g in greedy])),
            "reward_sampled": float(np.mean([r for g in sampled for r in g.rewards])),
        }
        if teacher is not None:
            out["reverse_kl"] = reverse_kl(
                self.spec, self.rl, state["train"].params, teacher, sampled, self._static,
                self._teacher_static,
            )  # fmt: skip
        result.evals[step] = out
        line = ", ".join(f"{k} {v:.4f}" for k, v in out.items())
        sink.say(f"step {step}: eval/{self.env.name} (held out, {count} prompts): {line}")
        with open(self.spec.run_dir / "evals.jsonl", "a") as f:
            f.write(json.dumps({"step": step, **out}) + "\n")

    def _gather(self, pool, prompts, *, greedy: bool) -> list[Group]:
        per = math.ceil(len(prompts) / self.rl.num_workers)
        wanted = {i for i, _ in prompts}
        for k in range(0, len(prompts), per):
            pool.request(prompts[k : k + per], greedy=greedy)
        got: dict[int, Group] = {}
        while wanted - set(got):
            for group in pool.poll(timeout=1.0):
                if group.index in wanted:
                    got[group.index] = group
                else:
                    self._buffer.put(group)
        return [got[i] for i, _ in prompts]
