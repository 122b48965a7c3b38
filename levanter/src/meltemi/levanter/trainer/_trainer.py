"""The training loop: restore or initialise, step, log, evaluate, checkpoint, summarise."""

from __future__ import annotations

import contextlib
import logging
import pathlib
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from meltemi.data import Prefetcher
from meltemi.levanter.checkpoint import Checkpointer, RetentionPolicy, step_dir
from meltemi.levanter.config import (
    BatchSizes,
    ConfigError,
    ResolvedConfig,
    RunSpec,
    as_spec,
    flatten,
)
from meltemi.levanter.tracking import (
    MetricsWriter,
    ProgressBar,
    TensorBoardWriter,
    open_wandb,
    plot_loss_curve,
)
from meltemi.levanter.trainer._build import build_parts
from meltemi.levanter.trainer._eval import (
    Evaluator,
    HarnessHook,
    eval_line,
    eval_record,
    harness_line,
)
from meltemi.levanter.trainer._fingerprint import batch_fingerprint, fingerprint_value
from meltemi.levanter.trainer._hf import export_hf, init_from_hf
from meltemi.levanter.trainer._lora import export_peft
from meltemi.levanter.trainer._parts import RunParts
from meltemi.levanter.trainer._plan import Plan, compute_context, mesh_of, plan
from meltemi.levanter.trainer._preemption import Preemption
from meltemi.levanter.trainer._profile import StepProfiler
from meltemi.levanter.trainer._run_files import RunFiles
from meltemi.levanter.trainer._sharding import global_batch
from meltemi.levanter.trainer._step import TrainState
from meltemi.levanter.trainer._summary import RunResult, display_path, summary

logger = logging.getLogger(__name__)


_PEAK_FLOPS: dict[tuple[int, int], float] = {}


def measure_peak_flops(device: jax.Device | None = None, size: int = 1024) -> float:
    """FLOP/s of a float32 matmul on one device (the MFU denominator).

    Measured on the first call for a device and size in a process (a fresh jit and up to 0.5 s
    of matmuls) and remembered: a process that trains several runs (a sweep's worker, a test)
    measures once. The fastest of several repetitions counts, so a busy machine does not lower
    the peak.
    """
    device = device or jax.devices()[0]
    key = (device.id, size)
    if key not in _PEAK_FLOPS:
        _PEAK_FLOPS[key] = _time_matmul(device, size)
    return _PEAK_FLOPS[key]


def _time_matmul(device: jax.Device, size: int) -> float:
    a = jax.device_put(jnp.ones((size, size), jnp.float32), device)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best, start = float("inf"), time.perf_counter()
    for _ in range(20):
        t = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t)
        if time.perf_counter() - start > 0.5:
            break
    return 2 * size**3 / best


def _checkpointer(spec: RunSpec) -> Checkpointer | None:
    c = spec.checkpoint
    if not c.enabled:
        return None
    policy = RetentionPolicy(c.save_every_steps, c.save_every_minutes, c.keep_every_steps)
    return Checkpointer(
        spec.run_dir / "checkpoints", policy, async_save=c.async_save, verify=c.verify
    )


def _cost_flops(compiled: Any) -> float | None:
    try:
        cost = compiled.cost_analysis()
    except Exception:  # backends without cost analysis
        return None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    flops = (cost or {}).get("flops")
    return float(flops) if flops and flops > 0 else None


def _comparable(value: Any) -> Any:
    return tuple(_comparable(v) for v in value) if isinstance(value, (list, tuple)) else value


def check_resumed_rows(saved_trainer: Mapping[str, Any], sizes: BatchSizes, step: int) -> None:
    """Refuses a resume whose batch sizes would move the data of the steps already trained.

    The rows of step `s` start at `rows_before(s)`: if the checkpoint's batch sizes and the
    current ones disagree on the rows before `step`, resuming would skip or repeat data.

    Raises:
        ConfigError: naming the sizes and a batch schedule that keeps the past and changes
            the size from `step` on.
    """
    saved = BatchSizes.parse(
        saved_trainer.get("batch_schedule", "") or "", int(saved_trainer["train_batch_size"])
    )
    before, now = saved.rows_before(step), sizes.rows_before(step)
    if before == now:
        return
    old, new = saved.size_at(max(step - 1, 0)), sizes.size_at(step)
    past = ",".join(f"{s}:{b}" for s, b in saved.segments if s < step)
    raise ConfigError(
        f"resuming step {step}: the checkpoint trained rows 0-{before - 1} (batch size {old}), "
        f"but trainer.train_batch_size / trainer.batch_schedule put step {step} at row {now}, "
        f"which would {'skip' if now > before else 'repeat'} {abs(now - before)} rows. Keep the "
        f'past and change the size from step {step} on: --config.trainer.batch_schedule="'
        f'{past},{step}:{new}" (or start a new run dir with checkpoint.init_from).'
    )


class Trainer:
    """One run: owns the plan (mesh, shardings, step), state, checkpointer and loggers.

    Most users call `train(spec)`; tests and the benchmark use the pieces.

    Args:
        spec: the checked config (a `ResolvedConfig` is resolved first).
        parts: model/loss/optimizer/data; default: `build_parts(spec)`.
        mesh: default: `spec.mesh` on every device.
    """

    def __init__(
        self,
        spec: RunSpec | ResolvedConfig,
        parts: RunParts | None = None,
        mesh: jax.sharding.Mesh | None = None,
    ):
        self.spec = spec = as_spec(spec)
        self.parts = parts = parts if parts is not None else build_parts(spec)
        self.plan: Plan = plan(spec, mesh=mesh if mesh is not None else mesh_of(spec),
                               parts=parts.step_parts())  # fmt: skip
        self.mesh = self.plan.mesh
        self.run_dir = spec.run_dir
        # Metrics, events, profile and plot: the run dir, or a local copy of a gs:// one.
        self.files = RunFiles(spec.run_dir)
        self.primary = jax.process_index() == 0
        self.batch_sizes = self.plan.batch_sizes
        self.template = self.plan.template
        self.compile_s = 0.0
        self.flops_per_step: dict[int, float | None] = {}
        self.evaluate = Evaluator(self.plan, parts.eval_loss_fn, parts.eval_sets)
        self.harness = HarnessHook(spec, self.plan)  # eval.harness_tasks (lm-eval)
        self.state: TrainState | None = None

    # -- set-up -------------------------------------------------------------------------------

    def init_state(self) -> TrainState:
        """The freshly initialised state (params from `trainer.seed`), sharded on the mesh."""
        return self.plan.init_state(jax.random.key(self.spec.trainer.seed))

    def compiled_step(self, batch_size: int) -> Any:
        """The train step compiled (ahead of time) for one batch size."""
        if batch_size not in self.flops_per_step:
            compiled = self.plan.compile(batch_size)
            if not self.flops_per_step:
                self.compile_s = self.plan.compile_s[batch_size]
            self.flops_per_step[batch_size] = _cost_flops(compiled)
        return self.plan.compile(batch_size)

    def host_batch(self, step: int) -> Mapping[str, np.ndarray]:
        """This process's rows of the batch of `step` (numpy)."""
        size = self.batch_sizes.size_at(step)
        offset = self.batch_sizes.rows_before(step)
        per = size // jax.process_count()
        start = offset + jax.process_index() * per
        return self.parts.train_data.sequences(np.arange(start, start + per, dtype=np.int64))

    def data_metrics(self, step: int) -> dict[str, float]:
        """What the data source reports about the rows of `step` (e.g. mixture fractions)."""
        if self.parts.data_metrics is None:
            return {}
        start = self.batch_sizes.rows_before(step)
        rows = np.arange(start, start + self.batch_sizes.size_at(step), dtype=np.int64)
        return {k: float(v) for k, v in self.parts.data_metrics(rows).items()}

    def batch(self, step: int) -> dict[str, jax.Array]:
        """The global batch of `step` on the mesh (this process reads only its own rows)."""
        return global_batch(self.host_batch(step), self.mesh)

    # -- the loop -----------------------------------------------------------------------------

    def run(
        self,
        *,
        stop_after: int | None = None,
        on_step: Callable[[int, Mapping[str, float]], None] | None = None,
    ) -> RunResult:
        """Trains to `trainer.num_train_steps` (or `stop_after` steps from the start).

        Resumes from the newest intact checkpoint in the run directory, if any.
        """
        num_steps = self.spec.trainer.num_train_steps
        if self.primary:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.json").write_text(self.spec.to_json())
            self.files.pull()  # a resumed gs:// run continues its metrics
        ckpt = _checkpointer(self.spec)
        state, start = self._restore_or_init(ckpt)
        result = RunResult(self.run_dir, start_step=start, step=start)
        end = num_steps if stop_after is None else min(num_steps, start + stop_after)
        with contextlib.ExitStack() as cleanup:
            if self.primary:  # registered first, so it runs last: after the writers close
                cleanup.callback(self.files.push)
            state_step = self._loop(state, start, end, ckpt, result, cleanup, on_step)
        result.step = state_step
        result.compile_s = self.compile_s
        if result.throughput:
            tokens, seconds = (sum(x) for x in zip(*result.throughput, strict=True))
            result.tokens_per_s = tokens / seconds
        if self.primary and result.losses and state_step == num_steps:
            try:
                png = plot_loss_curve(self.files.local)
                self.files.push()
                result.loss_png = self.files.remote_path(png)
            except Exception as e:  # a broken plot must not hide a finished run
                logger.warning("could not draw the loss curve: %s", e)
        result.summary = summary(self.spec, result)
        return result

    def _loggers(self, start: int, cleanup: contextlib.ExitStack) -> list[Callable[[dict], None]]:
        """The writers every step record goes to (process 0 only)."""
        if not self.primary:
            return []
        spec = self.spec
        local = self.files.local
        writer = MetricsWriter(local / "metrics.jsonl", resume_step=start)
        cleanup.callback(writer.close)
        out = [writer.write]
        if spec.logging.tensorboard:
            tb = TensorBoardWriter(local / "tensorboard")
            cleanup.callback(tb.close)
            out.append(lambda record: tb.write(record["step"], record))
        if spec.logging.wandb:
            run = open_wandb(
                local,
                project=spec.logging.wandb_project,
                name=spec.name,
                mode=spec.logging.wandb_mode,
                config=spec.resolved.config.to_dict(),
            )
            cleanup.callback(run.finish)
            out.append(lambda record: run.log(record, step=record["step"]))
        return out

    def _loop(self, state, start, end, ckpt, result, cleanup, on_step) -> int:
        spec = self.spec
        num_steps = spec.trainer.num_train_steps
        every = spec.eval.every_steps
        loggers = self._loggers(start, cleanup)
        if ckpt:
            cleanup.callback(ckpt.close)
        bar = ProgressBar(num_steps, start, enabled=spec.trainer.progress_bar and self.primary)
        cleanup.callback(bar.close)
        if start:
            bar.write(f"resumed from {step_dir(self.run_dir / 'checkpoints', start)}")
        peak = spec.trainer.peak_flops_per_device or measure_peak_flops()
        num_devices = self.mesh.size
        if start < end:
            self.compiled_step(self.batch_sizes.size_at(start))
        profiler = StepProfiler(spec.trainer.profile, self.files.local)
        cleanup.callback(profiler.stop)
        pending: dict | None = None
        last_fetch = time.perf_counter()
        paused = 0.0
        state_step = start

        def mark_ready(record: dict) -> None:
            # Step time = between two observed completions, minus the pauses (eval,
            # checkpoint, compile) in between; completions are observed in step order.
            nonlocal last_fetch, paused
            jax.block_until_ready(record["_device"])
            now = time.perf_counter()
            record["_elapsed"] = max(now - last_fetch - paused, 1e-9)
            last_fetch, paused = now, 0.0

        def flush(record: dict) -> None:
            if "_elapsed" not in record:
                mark_ready(record)
            elapsed = record.pop("_elapsed")
            metrics = {k: float(v) for k, v in jax.device_get(record.pop("_device")).items()}
            tokens = record["batch_size"] * self.parts.seq_len
            tps = tokens / elapsed
            if record["step"] > start + 1:
                result.throughput.append((tokens, elapsed))
            flops = self._model_flops(record["batch_size"], tokens)
            mfu = flops / elapsed / (peak * num_devices) if flops else None
            record.update(metrics)
            record["throughput/tokens_per_second"] = tps
            # Elastic multislice: the rows of a step and the slice count it ran on.
            record["data/batch_hash"] = fingerprint_value(record.pop("_batch_hash"))
            record["mesh/num_slices"] = spec.mesh.num_slices
            if mfu is not None:
                record["throughput/mfu"] = mfu
            result.losses[record["step"]] = metrics["train/loss"]
            for log in loggers:
                log(record)
            bar.update(record["step"], loss=metrics["train/loss"], tokens_per_s=tps, mfu=mfu)
            if on_step:
                on_step(record["step"], record)

        # Batches are read and put on the devices by a background thread, two steps ahead.
        batches = cleanup.enter_context(
            Prefetcher(
                self.host_batch,
                range(start, end),
                depth=2,
                transform=lambda b: global_batch(b, self.mesh),
            )
        )
        with Preemption() as preemption:
            for step, batch in batches:
                size = self.batch_sizes.size_at(step)
                if size not in self.flops_per_step:  # a new batch size: compiling is a pause
                    pause_start = time.perf_counter()
                    self.compiled_step(size)
                    paused += time.perf_counter() - pause_start
                profiler.before(step + 1)
                state, metrics = self.plan.compile(size)(state, batch)
                state_step = step + 1
                if profiler.after(state_step, (state, metrics)):
                    first, last = spec.trainer.profile
                    where = self.files.remote_path(profiler.directory)
                    bar.write(f"profile of steps {first}-{last}: {display_path(where)}")
                if pending is not None:
                    flush(pending)
                pending = {"step": step + 1, "batch_size": size, "_device": metrics}
                pending["_batch_hash"] = batch_fingerprint(batch["tokens"])
                pending.update(self.data_metrics(step))  # host work while the step runs
                eval_due = every and state_step % every == 0
                stop = preemption.agreed()
                kind = ckpt.due(state_step) if ckpt else None
                if state_step == num_steps:
                    kind = "final"
                elif stop:
                    kind = kind or "temporary"
                harness_due = self.harness.due(state_step)
                if eval_due or harness_due or kind or state_step == end:
                    mark_ready(pending)
                pause_start = time.perf_counter()
                if eval_due:
                    result.eval = self.evaluate(state)
                    pending.update(eval_record(result.eval))
                    bar.write(eval_line(state_step, result.eval))
                if harness_due:
                    harness_metrics = self.harness(state.params, state_step)
                    pending.update(harness_metrics)
                    bar.write(harness_line(state_step, harness_metrics))
                if ckpt and kind:
                    ckpt.save(state_step, state, config_json=spec.to_json(), kind=kind)
                    if spec.checkpoint.export_hf:
                        self.export_hf(self.files.local / "hf" / f"step_{state_step:08d}", state)
                    if self.primary:
                        self.files.push()  # the metrics so far, beside the checkpoint
                    result.checkpoint_saved = True
                    result.checkpoint_blocking_s = max(
                        result.checkpoint_blocking_s, ckpt.last_blocking_s
                    )
                else:
                    result.checkpoint_saved = False
                paused += time.perf_counter() - pause_start
                if stop:
                    result.preempted = state_step < num_steps
                    break
            evaluated = every and num_steps % every == 0
            if pending is not None and state_step == num_steps and not evaluated:
                pause_start = time.perf_counter()
                result.eval = self.evaluate(state)
                pending.update(eval_record(result.eval))
                paused += time.perf_counter() - pause_start
            if pending is not None:
                flush(pending)
                pending = None
        self.state = state
        return state_step

    def _model_flops(self, batch_size: int, tokens: int) -> float | None:
        if self.parts.flops_per_token:
            return self.parts.flops_per_token * tokens
        per_device = self.flops_per_step.get(batch_size)
        return per_device * self.mesh.size if per_device else None

    def _restore_or_init(self, ckpt: Checkpointer | None) -> tuple[TrainState, int]:
        if ckpt is not None and ckpt.all_steps():
            step, state = ckpt.restore(self.template)
            saved = self._saved_config(ckpt, step)
            if saved is not None:
                check_resumed_rows(saved.get("trainer", {}), self.batch_sizes, step)
                self._warn_changed_config(saved, step)
            return state, step
        state = self.init_state()
        init_from = self.spec.checkpoint.init_from
        if init_from:
            state = self._warm_start(state, init_from)
        elif self.spec.init_from_hf:
            state = init_from_hf(self.spec, self.plan, state)
        return state, 0

    def export_hf(
        self, directory: str | pathlib.Path, state: TrainState | None = None
    ) -> list[str]:
        """Writes the parameters of `state` (default: the state after `run`) as a Hugging
        Face checkpoint."""
        state = state if state is not None else self.state
        if state is None:
            raise RuntimeError("export_hf needs a state: call run() first")
        return export_hf(self.spec, self.plan, state, pathlib.Path(directory))

    def export_peft(
        self, directory: str | pathlib.Path, state: TrainState | None = None
    ) -> list[str]:
        """Writes the LoRA adapters of `state` (default: the state after `run`) as a PEFT
        adapter directory (`adapter_config.json`, `adapter_model.safetensors`)."""
        state = state if state is not None else self.state
        if state is None:
            raise RuntimeError("export_peft needs a state: call run() first")
        params = jax.device_get(state.params)
        return export_peft(self.spec, params, self.plan.static, pathlib.Path(directory))

    @staticmethod
    def _saved_config(ckpt: Checkpointer, step: int) -> dict | None:
        try:
            return ckpt.read_config(step)["config"]
        except Exception:  # an old, torn or unreadable config item: nothing to compare
            return None

    def _warn_changed_config(self, saved_config: Mapping[str, Any], step: int) -> None:
        saved = flatten(saved_config)
        current = flatten(self.spec.resolved.config)
        changed = [
            f"{k}: {saved.get(k)!r} -> {v!r}"
            for k, v in current.items()
            if _comparable(saved.get(k)) != _comparable(v) and k != "run_dir"
        ]
        if changed:
            logger.warning(
                "resuming step %d with a config that differs from the checkpoint's: %s",
                step,
                "; ".join(changed),
            )

    def _warm_start(self, state: TrainState, init_from: str) -> TrainState:
        if self.parts.warm_start is None:
            raise ConfigError(
                f"checkpoint.init_from={init_from!r}: this model does not support warm starts."
            )
        params, report = self.parts.warm_start(state.params, init_from)
        for line in report:
            logger.warning("warm start: %s", line)
        if self.primary:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "warm_start.txt").write_text("\n".join(report) + "\n")
        # A new optimizer state for the loaded weights: schedules re-warm from step 0.
        with compute_context(self.mesh):
            opt_state = jax.jit(
                self.parts.optimizer.init, out_shardings=self.plan.state_sharding.opt_state
            )(params)
        return TrainState(state.step, params, opt_state)


def train(
    spec: RunSpec | ResolvedConfig,
    parts: RunParts | None = None,
    *,
    mesh: jax.sharding.Mesh | None = None,
    stop_after: int | None = None,
) -> RunResult:
    """Runs (or resumes) the training described by `spec`.

    Args:
        spec: the checked config (`meltemi.levanter.config.resolve`; a `ResolvedConfig` from
            `load_config` is resolved here).
        parts: model/loss/optimizer/data; default: built from the config.
        mesh: default: from `mesh.*`.
        stop_after: stop after this many steps (a deliberate interruption, for tests).
    """
    return Trainer(spec, parts, mesh).run(stop_after=stop_after)
