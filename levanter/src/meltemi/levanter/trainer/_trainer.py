"""The training loop: restore or initialise, step, log, evaluate, checkpoint, summarise."""

from __future__ import annotations

import contextlib
import logging
import pathlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from meltemi.data import Prefetcher
from meltemi.levanter import _exit
from meltemi.levanter.checkpoint import Checkpointer, RetentionPolicy
from meltemi.levanter.config import (
    BatchSizes,
    ConfigError,
    ResolvedConfig,
    RunSpec,
    as_spec,
    flatten,
)
from meltemi.levanter.evaluation import eval_line, eval_record
from meltemi.levanter.runtime import compute_context, display_path, global_batch, mesh_of
from meltemi.levanter.tracking import plot_loss_curve
from meltemi.levanter.trainer._build import build_parts
from meltemi.levanter.trainer._eval import Evaluator
from meltemi.levanter.trainer._fingerprint import batch_fingerprint
from meltemi.levanter.trainer._hf import export_hf, init_from_hf
from meltemi.levanter.trainer._hooks import CheckpointHook, EvalHook, Hook, StepEnd, hf_export_dir
from meltemi.levanter.trainer._loop import MetricsSink, StepTimer
from meltemi.levanter.trainer._lora import export_peft
from meltemi.levanter.trainer._parts import RunParts
from meltemi.levanter.trainer._plan import Plan, plan, uses_precomputed_reference
from meltemi.levanter.trainer._preemption import Preemption
from meltemi.levanter.trainer._profile import StepProfiler
from meltemi.levanter.trainer._reference import PrecomputedReference, load_reference, precompute
from meltemi.levanter.trainer._run_files import RunFiles
from meltemi.levanter.trainer._step import TrainState
from meltemi.levanter.trainer._summary import RunResult, summary

logger = logging.getLogger(__name__)


_PEAK_FLOPS: dict[tuple[int, int | None], float] = {}
#: The matmul sizes `measure_peak_flops` tries: on a CPU a small one that fits in cache often
#: reaches the peak, and a large one reads low when another process takes a core for a moment.
PEAK_SIZES = (256, 512, 1024)
#: An accelerator needs larger matmuls to reach its peak.
ACCELERATOR_PEAK_SIZES = (1024, 2048, 4096)
#: Seconds of repetitions per size (at least `_MIN_REPS` each): the fastest one counts.
PEAK_BUDGET_S = 0.15
_MIN_REPS = 3


def measure_peak_flops(device: jax.Device | None = None, size: int | None = None) -> float:
    """FLOP/s of a float32 matmul on one device (the MFU denominator, see `peak_flops`).

    The best rate over the sizes in `PEAK_SIZES` (CPU; else `ACCELERATOR_PEAK_SIZES`) or `size`
    alone, each the fastest of as many repetitions as fit in `PEAK_BUDGET_S`: a busy machine
    slows some repetitions, not all, so the peak is not read low (a low peak gives an MFU over
    100%). Measured on the first call for a device and size in a process and remembered: a
    process that trains several runs (a sweep's worker, a test) measures once.
    """
    device = device or jax.devices()[0]
    key = (device.id, size)
    if key not in _PEAK_FLOPS:
        sizes = PEAK_SIZES if device.platform == "cpu" else ACCELERATOR_PEAK_SIZES
        _PEAK_FLOPS[key] = max(_time_matmul(device, n) for n in ([size] if size else sizes))
    return _PEAK_FLOPS[key]


def peak_flops(devices: Sequence[jax.Device]) -> float:
    """The measured peak FLOP/s of `devices` together.

    Accelerators: one device's peak times their number. CPU devices are not chips: several of
    them in a process (`--xla_force_host_platform_device_count=N`) share the host's cores, and
    one device's matmul already uses them all, so the peak counts once per process (processes
    are taken to be on separate hosts: several on one machine give a lower MFU, never over 1).
    """
    if all(d.platform == "cpu" for d in devices):
        return measure_peak_flops() * len({d.process_index for d in devices})
    return measure_peak_flops() * len(devices)


def _time_matmul(device: jax.Device, size: int) -> float:
    a = jax.device_put(jnp.ones((size, size), jnp.float32), device)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best, start, reps = float("inf"), time.perf_counter(), 0
    while reps < _MIN_REPS or time.perf_counter() - start < PEAK_BUDGET_S:
        t = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t)
        reps += 1
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

    Most users call `train(spec)`; tests and the benchmark use the pieces. The loop is
    components: a `StepTimer`, a `MetricsSink` and step-boundary hooks (evaluation, the
    `hooks` given here or with `add_hook`, then the checkpoint), see `meltemi.levanter.trainer`.

    Args:
        spec: the checked config (a `ResolvedConfig` is resolved first).
        parts: model/loss/optimizer/data; default: `build_parts(spec)`.
        mesh: default: `spec.mesh` on every device.
        hooks: more step-boundary hooks (`Hook`), run after evaluation and before the
            checkpoint, in this order.
    """

    def __init__(
        self,
        spec: RunSpec | ResolvedConfig,
        parts: RunParts | None = None,
        mesh: jax.sharding.Mesh | None = None,
        *,
        hooks: Sequence[Hook] = (),
    ):
        self.spec = spec = as_spec(spec)
        self.parts = parts = parts if parts is not None else build_parts(spec)
        if uses_precomputed_reference(spec) and not isinstance(
            parts.train_data, PrecomputedReference
        ):  # rows gain `reference_logps`, computed at the start of `run`
            parts.train_data = PrecomputedReference(parts.train_data, parts.seq_len)
        self.plan: Plan = plan(spec, mesh=mesh if mesh is not None else mesh_of(spec),
                               parts=parts.checked_step())  # fmt: skip
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
        self.hooks: list[Hook] = []
        for hook in hooks:
            self.add_hook(hook)
        if spec.eval.harness_tasks and not self.hooks:
            logger.warning(
                "eval.harness_tasks=%r: the trainer runs them only as a hook; pass "
                "hooks=meltemi.levanter.main._hooks.training_hooks(spec) (the binaries do).",
                spec.eval.harness_tasks,
            )
        self.state: TrainState | None = None

    def add_hook(self, hook: Hook) -> None:
        """Adds a step-boundary hook (after evaluation, before the checkpoint; in order).

        Raises:
            TypeError: `hook` has no `due(step, stopping)` or is not callable.
        """
        if not isinstance(hook, Hook):
            raise TypeError(
                f"add_hook({hook!r}): a hook needs due(step, stopping) -> bool and "
                f"__call__(end) -> metrics | None (meltemi.levanter.trainer.Hook)."
            )
        self.hooks.append(hook)

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
        # Step-boundary hooks, in order: evaluation, the caller's, the checkpoint.
        evaluation = EvalHook(self.evaluate, self.spec.eval.every_steps, num_steps)
        saving = None
        if ckpt is not None:
            saving = CheckpointHook(
                ckpt,
                num_steps,
                self.spec.to_json(),
                export_hf=self._export_step if self.spec.checkpoint.export_hf else None,
                push=self.files.push if self.primary else None,
            )
        hooks = [evaluation, *self.hooks, *([saving] if saving else [])]
        with contextlib.ExitStack() as cleanup:
            if self.primary:  # registered first, so it runs last: after the writers close
                cleanup.callback(self.files.push)
            state_step = self._loop(state, start, end, hooks, result, cleanup, on_step)
        result.step = state_step
        result.compile_s = self.compile_s
        result.eval = evaluation.last
        if saving is not None:
            result.checkpoint_saved = saving.saved_at == state_step
            result.checkpoint_blocking_s = saving.blocking_s
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

    def _loop(self, state, start, end, hooks, result, cleanup, on_step) -> int:
        """Steps `start` to `end`. Each step: run it, write the previous step's record (one
        step behind, so the host never waits for the device), ask every hook `due`, wait for
        the step if one is, run the due hooks (a pause), stop if preempted."""
        spec = self.spec
        sink = MetricsSink(
            spec,
            self.files.local,
            self.primary,
            start,
            result,
            cleanup,
            seq_len=self.parts.seq_len,
            model_flops=self._model_flops,
            peak_flops=self._peak_flops,
            on_step=on_step,
        )
        for hook in hooks:  # a hook with close() (the checkpointer's) is closed at the end
            if callable(getattr(hook, "close", None)):
                cleanup.callback(hook.close)
        if start == 0 and spec.eval.at_start and self.evaluate.eval_sets:
            # The baseline (for DPO, the policy's own preferences before training), step 0.
            result.eval_at_start = self.evaluate(state)
            sink.log({"step": 0, **eval_record(result.eval_at_start)})
            sink.say(eval_line(0, result.eval_at_start))
        if start < end:
            self.compiled_step(self.batch_sizes.size_at(start))
        profiler = StepProfiler(spec.trainer.profile, self.files.local)
        cleanup.callback(profiler.stop)
        timer = StepTimer()
        pending: dict | None = None  # the record of the step in flight, written a step later
        state_step = start
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
                    with timer.pause():
                        self.compiled_step(size)
                profiler.before(step + 1)
                state, metrics = self.plan.compile(size)(state, batch)
                state_step = step + 1
                if profiler.after(state_step, (state, metrics)):
                    first, last = spec.trainer.profile
                    where = self.files.remote_path(profiler.directory)
                    sink.say(f"profile of steps {first}-{last}: {display_path(where)}")
                if pending is not None:
                    sink.write(timer.ready(pending))
                pending = {"step": step + 1, "batch_size": size, "_device": metrics}
                pending["_batch_hash"] = batch_fingerprint(batch["tokens"])
                pending.update(self.data_metrics(step))  # host work while the step runs
                stop = preemption.agreed()
                due = [hook for hook in hooks if hook.due(state_step, stop)]
                if due or state_step == end:
                    timer.ready(pending)
                final = state_step == spec.trainer.num_train_steps
                boundary = StepEnd(state_step, state, self.plan, stop, final, sink.say)
                with timer.pause():
                    for hook in due:
                        pending.update(hook(boundary) or {})
                if stop:
                    result.preempted = state_step < spec.trainer.num_train_steps
                    break
            if pending is not None:
                sink.write(timer.ready(pending))
        self.state = state
        return state_step

    def _peak_flops(self) -> float:
        configured = self.spec.trainer.peak_flops_per_device
        if configured:
            return configured * self.mesh.size
        return peak_flops(list(self.mesh.devices.flat))

    def _export_step(self, step: int, state: TrainState) -> None:
        """`checkpoint.export_hf`: the Hugging Face export beside each checkpoint."""
        self.export_hf(hf_export_dir(self.files.local, step), state)

    def _model_flops(self, batch_size: int, tokens: int) -> float | None:
        if self.parts.flops_per_token:
            return self.parts.flops_per_token * tokens
        per_device = self.flops_per_step.get(batch_size)
        return per_device * self.mesh.size if per_device else None

    def _restore_or_init(self, ckpt: Checkpointer | None) -> tuple[TrainState, int]:
        precomputed = uses_precomputed_reference(self.spec)
        if ckpt is not None and ckpt.all_steps():
            step, state = ckpt.restore(self.template)
            saved = self._saved_config(ckpt, step)
            if saved is not None:
                check_resumed_rows(saved.get("trainer", {}), self.batch_sizes, step)
                self._warn_changed_config(saved, step)
            if precomputed:  # reopened from the cache (or computed again) by its key
                self._precompute_reference(self._start_state().params)
            return state, step
        state = self._start_state()
        if self.plan.parts.reference:
            state = self._with_reference(state, self._reference_params(state.params))
        elif precomputed:
            self._precompute_reference(state.params)
        return state, 0

    def _start_state(self) -> TrainState:
        """The state of step 0: initialised, then `checkpoint.init_from` or `init_from_hf`."""
        state = self.init_state()
        init_from = self.spec.checkpoint.init_from
        if init_from:
            state = self._warm_start(state, init_from)
        elif self.spec.init_from_hf:
            state = init_from_hf(self.spec, self.plan, state)
        return state

    def _reference_params(self, start: Any) -> Any:
        """The reference's arrays: `trainer.reference_from`, or the policy's start."""
        return load_reference(self.spec, start, self.parts.warm_start)

    def _with_reference(self, state: TrainState, reference: Any) -> TrainState:
        """`state` holding a copy of `reference` as its frozen reference model."""
        with compute_context(self.mesh):
            copy = jax.jit(
                lambda p: jax.tree.map(jnp.copy, p),
                out_shardings=self.plan.state_sharding.reference,
            )(reference)
        return TrainState(state.step, state.params, state.opt_state, copy)

    def _precompute_reference(self, start: Any) -> None:
        where = precompute(
            self.spec,
            self.plan,
            self.parts.train_data,
            self._reference_params(start),
            self.parts.eval_sets,
        )
        if self.primary:
            logger.info("reference log-probs: %s", display_path(where))

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
                self.plan.parts.optimizer.init, out_shardings=self.plan.state_sharding.opt_state
            )(params)
        return TrainState(state.step, params, opt_state, state.reference)


def train(
    spec: RunSpec | ResolvedConfig,
    parts: RunParts | None = None,
    *,
    mesh: jax.sharding.Mesh | None = None,
    stop_after: int | None = None,
    hooks: Sequence[Hook] = (),
) -> RunResult:
    """Runs (or resumes) the training described by `spec`.

    Args:
        spec: the checked config (`meltemi.levanter.config.resolve`; a `ResolvedConfig` from
            `load_config` is resolved here).
        parts: model/loss/optimizer/data; default: built from the config.
        mesh: default: from `mesh.*`.
        stop_after: stop after this many steps (a deliberate interruption, for tests).
        hooks: more step-boundary hooks (see `Trainer`).
    """
    try:
        return Trainer(spec, parts, mesh, hooks=hooks).run(stop_after=stop_after)
    except Exception as e:
        _exit.mark(e)  # its exit status survives pickling (a slice's error reaching its launcher)
        raise
