"""The training loop: restore or initialise, step, log, evaluate, checkpoint, summarise."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import math
import os
import pathlib
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import meltemi.haliax as hax
from meltemi.data import Prefetcher
from meltemi.levanter.checkpoint import Checkpointer, RetentionPolicy, step_dir
from meltemi.levanter.config import ResolvedConfig, flatten
from meltemi.levanter.mesh import COMPUTE_RULES, PARAMETER_RULES, make_mesh
from meltemi.levanter.tracking import MetricsWriter, ProgressBar, TensorBoardWriter, plot_loss_curve
from meltemi.levanter.trainer._parts import EvalSet, RunParts
from meltemi.levanter.trainer._schedule import BatchSizes
from meltemi.levanter.trainer._sharding import (
    batch_sharding,
    global_batch,
    tree_shardings,
    with_shardings,
)
from meltemi.levanter.trainer._step import (
    DTYPES,
    TrainState,
    cast_floating,
    init_state,
    make_train_step,
)

logger = logging.getLogger(__name__)

#: Exit status of a run stopped by SIGTERM after saving its checkpoint: "try again later".
PREEMPTED_EXIT_CODE = 75


class TrainerError(RuntimeError):
    """A run that cannot proceed as configured (the message says which key to change)."""


def resolve_run_dir(config) -> pathlib.Path:
    """`run_dir`, or `runs/<name>`, relative to the directory the user started from.

    Under `bazel run` the working directory is the runfiles tree, so relative paths are
    taken against `$BUILD_WORKING_DIRECTORY` instead.
    """
    text = config.run_dir or os.path.join("runs", config.name)
    path = pathlib.Path(text).expanduser()
    if not path.is_absolute():
        path = pathlib.Path(os.environ.get("BUILD_WORKING_DIRECTORY") or os.getcwd()) / path
    return path


@dataclasses.dataclass
class RunResult:
    """What a run did.

    Attributes:
        run_dir: where its config, metrics, checkpoints and loss curve are.
        start_step: the step it started from (0, or the checkpoint it resumed).
        step: the steps completed when it stopped.
        preempted: stopped by SIGTERM (a checkpoint of `step` was saved).
        losses: train loss of each step this process ran, `{step: loss}`.
        eval: the last evaluation, `{"<set>": {"loss": ..., "bpb": ...}}`.
        loss_png: the loss curve (None if not drawn).
        summary: the text printed at the end.
        compile_s: seconds to compile the train step (first batch size).
        tokens_per_s: tokens over seconds of this run's steps after the first (pauses for
            evaluation, checkpoints and compiles excluded).
        checkpoint_blocking_s: longest time a checkpoint save blocked the loop.
    """

    run_dir: pathlib.Path
    start_step: int
    step: int
    preempted: bool = False
    losses: dict[int, float] = dataclasses.field(default_factory=dict)
    eval: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    loss_png: pathlib.Path | None = None
    summary: str = ""
    compile_s: float = 0.0
    tokens_per_s: float = 0.0
    checkpoint_blocking_s: float = 0.0
    throughput: list[tuple[int, float]] = dataclasses.field(default_factory=list, repr=False)


# Set by SIGTERM. A process whose training runs outside the main thread (a fray actor)
# installs the handler from its main thread with `install_sigterm_handler()`.
_SIGTERM = threading.Event()


def install_sigterm_handler() -> bool:
    """Makes SIGTERM request a checkpoint-and-stop; True if installed (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, lambda signum, frame: _SIGTERM.set())
    return True


class _Preemption:
    """Turns SIGTERM into a flag the loop checks after every step."""

    def __init__(self):
        self._previous = None

    def __enter__(self):
        _SIGTERM.clear()
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, lambda signum, frame: _SIGTERM.set())
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    @property
    def requested(self) -> bool:
        return _SIGTERM.is_set()

    def agreed(self) -> bool:
        """Whether any process was asked to stop (all processes must stop at the same step)."""
        if jax.process_count() == 1:
            return self.requested
        from jax.experimental import multihost_utils

        flags = multihost_utils.process_allgather(np.int32(self.requested))
        return bool(np.max(flags))


def measure_peak_flops(device: jax.Device | None = None, size: int = 1024) -> float:
    """FLOP/s of a float32 matmul on one device, measured now (the MFU denominator).

    The fastest of several repetitions counts, so a busy machine does not lower the peak.
    """
    device = device or jax.devices()[0]
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


def compute_context(mesh: jax.sharding.Mesh):
    """The mesh and logical-axis mapping model code sees while the step is traced."""
    stack = contextlib.ExitStack()
    stack.enter_context(jax.set_mesh(mesh))
    stack.enter_context(hax.axis_mapping(COMPUTE_RULES))
    return stack


def _checkpointer(config, run_dir: pathlib.Path) -> Checkpointer | None:
    c = config.checkpoint
    if not c.enabled:
        return None
    policy = RetentionPolicy(c.save_every_steps, c.save_every_minutes, c.keep_every_steps)
    return Checkpointer(run_dir / "checkpoints", policy, async_save=c.async_save, verify=c.verify)


def _cost_flops(compiled) -> float | None:
    try:
        cost = compiled.cost_analysis()
    except Exception:  # backends without cost analysis
        return None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    flops = (cost or {}).get("flops")
    return float(flops) if flops and flops > 0 else None


class Trainer:
    """One run: owns the mesh, state, step function, checkpointer and loggers.

    Most users call `train(resolved)`; tests and the benchmark use the pieces.
    """

    def __init__(
        self,
        resolved: ResolvedConfig,
        parts: RunParts,
        mesh: jax.sharding.Mesh | None = None,
    ):
        self.resolved = resolved
        self.config = config = resolved.config
        self.parts = parts
        self.mesh = mesh or make_mesh(
            config.mesh.ici.to_dict(),
            config.mesh.dcn.to_dict(),
            num_slices=config.mesh.num_slices,
        )
        self.run_dir = resolve_run_dir(config)
        self.primary = jax.process_index() == 0
        self.batch_sizes = BatchSizes.parse(
            config.trainer.batch_schedule, config.trainer.train_batch_size
        )
        self._check_divisibility()
        if config.trainer.compute_dtype not in DTYPES:
            raise TrainerError(
                f"trainer.compute_dtype={config.trainer.compute_dtype!r}: use one of "
                f"{sorted(DTYPES)} (e.g. --config.trainer.compute_dtype=bfloat16)."
            )
        self.compute_dtype = DTYPES[config.trainer.compute_dtype]
        init_key = jax.random.key(config.trainer.seed)
        self._init_key = init_key
        abstract_model = eqx.filter_eval_shape(parts.init_model, init_key)
        is_leaf_array = lambda x: isinstance(x, jax.ShapeDtypeStruct)  # noqa: E731
        abstract_params, self.static = eqx.partition(abstract_model, is_leaf_array)
        abstract_state = jax.eval_shape(lambda p: init_state(p, parts.optimizer), abstract_params)
        self.state_sharding = tree_shardings(abstract_state, self.mesh, PARAMETER_RULES)
        self.template = with_shardings(self.state_sharding, abstract_state)
        self.batch_sharding = batch_sharding(self.mesh)
        with compute_context(self.mesh):
            self._step_fn = make_train_step(
                parts.loss_fn,
                parts.optimizer,
                self.static,
                microbatches=config.trainer.microbatches,
                compute_dtype=self.compute_dtype,
                metrics_fn=parts.metrics_fn,
                state_sharding=self.state_sharding,
                batch_sharding=self.batch_sharding,
                mesh=self.mesh,
            )
        self._compiled: dict[int, Any] = {}
        self.compile_s = 0.0
        self.flops_per_step: dict[int, float | None] = {}
        self._eval_fn = None
        self._eval_cache: dict[str, list] = {}
        # One row, to learn the batch's keys, dtypes and shapes.
        self._example = parts.train_data.sequences(np.arange(1))

    # -- set-up -------------------------------------------------------------------------------

    def _check_divisibility(self) -> None:
        micro = self.config.trainer.microbatches
        dp = math.prod(self.mesh.shape[a] for a in ("replica", "data", "fsdp"))
        for start, size in self.batch_sizes.segments:
            if micro < 1 or size % micro:
                raise TrainerError(
                    f"trainer.microbatches={micro} does not divide the batch size {size} (from "
                    f"step {start}); pick a divisor, e.g. --config.trainer.microbatches=1."
                )
            if (size // micro) % dp:
                raise TrainerError(
                    f"the microbatch of {size // micro} rows (batch {size} / microbatches "
                    f"{micro}) does not split over the {dp} data-parallel devices "
                    f"(mesh replica x data x fsdp); use a batch size that is a multiple of "
                    f"{dp * micro}."
                )
            if size % jax.process_count():
                raise TrainerError(
                    f"batch size {size} does not split over {jax.process_count()} processes."
                )

    def init_state(self) -> TrainState:
        """The freshly initialised state (params from `trainer.seed`), sharded on the mesh."""
        parts = self.parts

        def init(key):
            params = eqx.filter(parts.init_model(key), eqx.is_array)
            return init_state(params, parts.optimizer)

        with compute_context(self.mesh):
            return jax.jit(init, out_shardings=self.state_sharding)(self._init_key)

    def compiled_step(self, batch_size: int):
        """The train step compiled (ahead of time) for one batch size."""
        if batch_size not in self._compiled:
            seq_len = self.parts.seq_len
            abstract_batch = self.abstract_batch(batch_size, seq_len)
            start = time.perf_counter()
            with compute_context(self.mesh):
                compiled = self._step_fn.lower(self.template, abstract_batch).compile()
            elapsed = time.perf_counter() - start
            if not self._compiled:
                self.compile_s = elapsed
            self._compiled[batch_size] = compiled
            self.flops_per_step[batch_size] = _cost_flops(compiled)
        return self._compiled[batch_size]

    def abstract_batch(self, batch_size: int, seq_len: int) -> dict[str, jax.ShapeDtypeStruct]:
        """The shapes of a batch as the data source produces it."""
        example = self._example
        return {
            k: jax.ShapeDtypeStruct(
                (batch_size,) + np.asarray(v).shape[1:],
                np.asarray(v).dtype,
                sharding=self.batch_sharding,
            )
            for k, v in example.items()
        }

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

    # -- evaluation ---------------------------------------------------------------------------

    def evaluate(self, state: TrainState) -> dict[str, dict[str, float]]:
        """Loss (nats/token) and bits per byte on every validation set.

        With an EMA of the parameters in the optimizer state (`optimizer.ema_beta`), the EMA
        parameters are evaluated too, as `<set>-ema`.
        """
        results = self._evaluate_params(state.params)
        ema = _ema_params(state.opt_state)
        if ema is not None:
            for name, values in self._evaluate_params(ema).items():
                results[f"{name}-ema"] = values
        return results

    def _evaluate_params(self, params: Any) -> dict[str, dict[str, float]]:
        if not self.parts.eval_sets:
            return {}
        if self._eval_fn is None:
            static, parts, dtype = self.static, self.parts, self.compute_dtype

            def eval_step(p, batch):
                model = eqx.combine(cast_floating(p, dtype), static)
                nll, count = parts.eval_loss_fn(model, batch)
                return jnp.asarray(nll, jnp.float32), jnp.asarray(count, jnp.float32)

            with compute_context(self.mesh):
                self._eval_fn = jax.jit(eval_step)
        results = {}
        for eval_set in self.parts.eval_sets:
            results[eval_set.name] = self._evaluate_set(params, eval_set)
        return results

    def _evaluate_set(self, params: Any, eval_set: EvalSet) -> dict[str, float]:
        if eval_set.name not in self._eval_cache:
            per = jax.process_count()
            index = jax.process_index()
            dp = math.prod(self.mesh.shape[a] for a in ("replica", "data", "fsdp"))
            batches = []
            for b in eval_set.batches:
                b = _pad_rows(b, math.lcm(dp, per))
                rows = len(next(iter(b.values()))) // per
                local = {k: v[index * rows : (index + 1) * rows] for k, v in b.items()}
                batches.append(global_batch(local, self.mesh))
            self._eval_cache[eval_set.name] = batches
        total, count = 0.0, 0.0
        with compute_context(self.mesh):
            for batch in self._eval_cache[eval_set.name]:
                nll, n = self._eval_fn(params, batch)
                total += float(nll)
                count += float(n)
        loss = total / max(count, 1.0)
        bpb = total / math.log(2) / max(eval_set.num_bytes, 1)
        return {"loss": loss, "bpb": bpb}

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
        config = self.config
        tcfg = config.trainer
        num_steps = tcfg.num_train_steps
        if self.primary:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.json").write_text(self.resolved.to_json())
        ckpt = _checkpointer(config, self.run_dir)
        state, start = self._restore_or_init(ckpt)
        result = RunResult(self.run_dir, start_step=start, step=start)
        end = num_steps if stop_after is None else min(num_steps, start + stop_after)

        with contextlib.ExitStack() as cleanup:
            state_step = self._loop(state, start, end, ckpt, result, cleanup, on_step)
        result.step = state_step
        result.compile_s = self.compile_s
        if result.throughput:
            tokens, seconds = (sum(x) for x in zip(*result.throughput, strict=True))
            result.tokens_per_s = tokens / seconds
        if self.primary and result.losses and state_step == num_steps:
            try:
                result.loss_png = plot_loss_curve(self.run_dir)
            except Exception as e:  # a broken plot must not hide a finished run
                logger.warning("could not draw the loss curve: %s", e)
        result.summary = self._summary(result)
        return result

    def _loop(self, state, start, end, ckpt, result, cleanup, on_step) -> int:
        config = self.config
        tcfg = config.trainer
        num_steps = tcfg.num_train_steps
        writer = tb = wandb_run = None
        if self.primary:
            writer = MetricsWriter(self.run_dir / "metrics.jsonl", resume_step=start)
            cleanup.callback(writer.close)
            if config.logging.tensorboard:
                tb = TensorBoardWriter(self.run_dir / "tensorboard")
                cleanup.callback(tb.close)
            if config.logging.wandb:
                wandb_run = self._wandb()
                cleanup.callback(wandb_run.finish)
        if ckpt:
            cleanup.callback(ckpt.close)
        bar = ProgressBar(num_steps, start, enabled=tcfg.progress_bar and self.primary)
        cleanup.callback(bar.close)
        if start:
            bar.write(f"resumed from {step_dir(self.run_dir / 'checkpoints', start)}")
        peak = tcfg.peak_flops_per_device or measure_peak_flops()
        num_devices = self.mesh.size
        if start < end:
            self.compiled_step(self.batch_sizes.size_at(start))
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
            if mfu is not None:
                record["throughput/mfu"] = mfu
            result.losses[record["step"]] = metrics["train/loss"]
            if writer:
                writer.write(record)
            if tb:
                tb.write(record["step"], record)
            if wandb_run:
                wandb_run.log(record, step=record["step"])
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
        with _Preemption() as preemption:
            for step, batch in batches:
                size = self.batch_sizes.size_at(step)
                if size not in self._compiled:  # a new batch size: compile time is a pause
                    pause_start = time.perf_counter()
                    self.compiled_step(size)
                    paused += time.perf_counter() - pause_start
                compiled = self._compiled[size]
                state, metrics = compiled(state, batch)
                state_step = step + 1
                if pending is not None:
                    flush(pending)
                pending = {"step": step + 1, "batch_size": size, "_device": metrics}
                pending.update(self.data_metrics(step))  # host work while the step runs
                eval_due = config.eval.every_steps and state_step % config.eval.every_steps == 0
                stop = preemption.agreed()
                kind = ckpt.due(state_step) if ckpt else None
                if state_step == num_steps:
                    kind = "final"
                elif stop:
                    kind = kind or "temporary"
                if eval_due or kind or state_step == end:
                    mark_ready(pending)
                pause_start = time.perf_counter()
                if eval_due:
                    evals = self.evaluate(state)
                    result.eval = evals
                    pending.update(_eval_record(evals))
                    bar.write(_eval_line(state_step, evals))
                if ckpt and kind:
                    ckpt.save(state_step, state, config_json=self.resolved.to_json(), kind=kind)
                    result.checkpoint_blocking_s = max(
                        result.checkpoint_blocking_s, ckpt.last_blocking_s
                    )
                paused += time.perf_counter() - pause_start
                if stop:
                    result.preempted = state_step < num_steps
                    break
            evaluated = config.eval.every_steps and num_steps % config.eval.every_steps == 0
            if pending is not None and state_step == num_steps and not evaluated:
                pause_start = time.perf_counter()
                result.eval = self.evaluate(state)
                pending.update(_eval_record(result.eval))
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
            self._warn_changed_config(ckpt, step)
            return state, step
        state = self.init_state()
        init_from = self.config.checkpoint.init_from
        if init_from:
            state = self._warm_start(state, init_from)
        return state, 0

    def _warn_changed_config(self, ckpt: Checkpointer, step: int) -> None:
        try:
            saved = flatten(ckpt.read_config(step)["config"])
        except Exception:  # an old or unreadable config item: nothing to compare
            return
        current = flatten(self.config)
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
            raise TrainerError(
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
                self.parts.optimizer.init, out_shardings=self.state_sharding.opt_state
            )(params)
        return TrainState(state.step, params, opt_state)

    def _wandb(self):
        try:
            # The `wandb` extra: imported by name, only when asked for.
            wandb = importlib.import_module("wandb")
        except ImportError:
            raise TrainerError(
                "logging.wandb=True needs the `wandb` package, which is not installed: "
                "pip install meltemi-levanter[wandb], or turn it off with "
                "--config.logging.wandb=false."
            ) from None
        return wandb.init(
            project=self.config.logging.wandb_project,
            name=self.config.name,
            dir=str(self.run_dir),
            mode=self.config.logging.wandb_mode,
            config=self.config.to_dict(),
        )

    def _summary(self, result: RunResult) -> str:
        lines = []
        ran = result.step - result.start_step
        state = "preempted (checkpoint saved)" if result.preempted else "finished"
        lines.append(
            f"run {state}: step {result.step}/{self.config.trainer.num_train_steps} "
            f"({ran} steps this run, {result.tokens_per_s:,.0f} tokens/s)"
        )
        if result.losses:
            steps = sorted(result.losses)
            lines.append(
                f"  train/loss: {result.losses[steps[0]]:.4f} (step {steps[0]}) -> "
                f"{result.losses[steps[-1]]:.4f} (step {steps[-1]})"
            )
        for name, ev in result.eval.items():
            lines.append(f"  eval/{name}: loss {ev['loss']:.4f}, bits/byte {ev['bpb']:.4f}")
        lines.append(f"  run dir: {self.run_dir}")
        if self.config.checkpoint.enabled:
            lines.append(f"  checkpoints: {self.run_dir / 'checkpoints'}")
        lines.append(f"  metrics: {self.run_dir / 'metrics.jsonl'}")
        if result.loss_png:
            lines.append(f"  loss curve: {result.loss_png}")
        return "\n".join(lines)


def _comparable(value: Any) -> Any:
    return tuple(_comparable(v) for v in value) if isinstance(value, (list, tuple)) else value


def _ema_params(opt_state: Any) -> Any:
    """The EMA parameters in an optimizer state, or None when it keeps no EMA."""
    from meltemi.levanter import optim

    try:
        return optim.ema_of(opt_state)
    except ValueError:
        return None


def _pad_rows(batch: Mapping[str, np.ndarray], multiple: int) -> dict[str, np.ndarray]:
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


def _eval_record(evals: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    out = {}
    for name, ev in evals.items():
        out[f"eval/{name}/loss"] = ev["loss"]
        out[f"eval/{name}/bpb"] = ev["bpb"]
    return out


def _eval_line(step: int, evals: Mapping[str, Mapping[str, float]]) -> str:
    parts = [f"eval/{n}: loss {e['loss']:.4f}, bits/byte {e['bpb']:.4f}" for n, e in evals.items()]
    return f"step {step}: " + "; ".join(parts)


def train(
    resolved: ResolvedConfig,
    parts: RunParts | None = None,
    *,
    mesh: jax.sharding.Mesh | None = None,
    stop_after: int | None = None,
) -> RunResult:
    """Runs (or resumes) the training described by `resolved`.

    Args:
        resolved: the config (see `meltemi.levanter.config.load_config`).
        parts: model/loss/optimizer/data; default: built from the config.
        mesh: default: from `mesh.*`.
        stop_after: stop after this many steps (a deliberate interruption, for tests).
    """
    if mesh is None:
        c = resolved.config.mesh
        mesh = make_mesh(c.ici.to_dict(), c.dcn.to_dict(), num_slices=c.num_slices)
    if parts is None:
        from meltemi.levanter.trainer._build import build_parts

        parts = build_parts(resolved.config, mesh)
    return Trainer(resolved, parts, mesh).run(stop_after=stop_after)
