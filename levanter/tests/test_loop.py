"""The training loop: resume, preemption, batch-size schedules, metrics, retention."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import signal  # noqa: E402

import _tiny  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from meltemi.levanter import optim  # noqa: E402
from meltemi.levanter.checkpoint import read_manifest, step_dir  # noqa: E402
from meltemi.levanter.config import (  # noqa: E402
    BatchScheduleError,
    ConfigError,
    ResolvedConfig,
    resolve,
)
from meltemi.levanter.mesh import make_mesh  # noqa: E402
from meltemi.levanter.tracking import REQUIRED_KEYS, read_metrics  # noqa: E402
from meltemi.levanter.trainer import Trainer  # noqa: E402


def _run(config, parts=None, **kwargs):
    trainer = Trainer(ResolvedConfig(config, {}), parts or _tiny.parts(), _tiny.one_device_mesh())
    return trainer, trainer.run(**kwargs)


def _param_bytes(trainer):
    return [np.asarray(x).tobytes() for x in jax.tree.leaves(trainer.state.params)]


def test_interrupted_run_resumes_bit_for_bit(tmp_path):
    full, full_result = _run(_tiny.config(tmp_path / "full"))
    config = _tiny.config(tmp_path / "cut")
    _, first = _run(config, stop_after=3)
    resumed, second = _run(config)
    assert second.start_step == 2  # the newest checkpoint before the cut (every 2 steps)
    losses = {**first.losses, **second.losses}
    assert losses == full_result.losses
    assert _param_bytes(resumed) == _param_bytes(full)


def test_sigterm_saves_a_checkpoint_and_stops(tmp_path):
    config = _tiny.config(tmp_path, **{"checkpoint.save_every_steps": 100})

    def preempt(step, record):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    trainer = Trainer(ResolvedConfig(config, {}), _tiny.parts(), _tiny.one_device_mesh())
    result = trainer.run(on_step=preempt)
    assert result.preempted and result.step == 3
    assert read_manifest(step_dir(tmp_path / "checkpoints", 3)) is not None


def test_metrics_file_has_one_record_per_step_with_required_keys(tmp_path):
    _run(_tiny.config(tmp_path))
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    for record in records:
        assert set(REQUIRED_KEYS) <= set(record)
    assert "eval/synthetic/bpb" in records[-1]


class _Recording(_tiny.Counting):
    def __init__(self):
        self.rows = []

    def sequences(self, indices):
        self.rows.extend(np.asarray(indices).tolist())
        return super().sequences(indices)


def test_batch_size_schedule_changes_size_without_skipping_rows(tmp_path):
    parts = _tiny.parts()
    parts.train_data = _Recording()
    config = _tiny.config(
        tmp_path, **{"trainer.batch_schedule": "0:4,3:8", "trainer.num_train_steps": 5}
    )
    trainer = Trainer(ResolvedConfig(config, {}), parts, _tiny.one_device_mesh())
    parts.train_data.rows.clear()  # shape probing at construction
    trainer.run()
    sizes = [r["batch_size"] for r in read_metrics(tmp_path / "metrics.jsonl")]
    assert sizes == [4, 4, 4, 8, 8]
    trained = [r for r in parts.train_data.rows if r < 10_000]
    assert sorted(trained) == list(range(28))


def test_retention_keeps_permanent_and_final_checkpoints(tmp_path):
    config = _tiny.config(
        tmp_path, **{"checkpoint.keep_every_steps": 3, "trainer.num_train_steps": 5}
    )
    _run(config)
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert kept == ["step_00000003", "step_00000005"]


def test_tensorboard_option_writes_event_files(tmp_path):
    _run(_tiny.config(tmp_path, **{"logging.tensorboard": True}))
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 100


def test_ema_parameters_are_evaluated_beside_the_parameters(tmp_path):
    tx, _ = optim.build_optimizer({"learning_rate": 0.05, "ema_beta": 0.5, "total_steps": 6})
    _, result = _run(_tiny.config(tmp_path), parts=_tiny.parts(optimizer=tx))
    assert set(result.eval) == {"synthetic", "synthetic-ema"}
    assert result.eval["synthetic"]["loss"] != result.eval["synthetic-ema"]["loss"]


def test_resuming_with_a_changed_config_warns_with_the_differences(tmp_path, caplog):
    _run(_tiny.config(tmp_path), stop_after=2)
    with caplog.at_level("WARNING"):
        _run(_tiny.config(tmp_path, **{"trainer.z_loss": 0.5}))
    assert "trainer.z_loss: 0.0001 -> 0.5" in caplog.text


def test_microbatches_that_do_not_divide_the_batch_are_rejected(tmp_path):
    config = _tiny.config(tmp_path, **{"trainer.microbatches": 3})
    with pytest.raises(
        ConfigError, match=r"trainer.microbatches=3 does not divide the batch size 8"
    ):
        resolve(config)


def test_malformed_batch_schedule_names_the_key_and_the_format(tmp_path):
    config = _tiny.config(tmp_path, **{"trainer.batch_schedule": "0:8,100"})
    with pytest.raises(
        BatchScheduleError, match=r"trainer.batch_schedule='0:8,100': '100' is not STEP:SIZE"
    ):
        resolve(config)


def test_a_batch_that_does_not_split_over_the_devices_names_the_key(tmp_path):
    config = _tiny.config(tmp_path, **{"trainer.train_batch_size": 3})
    mesh = make_mesh({"data": 2}, devices=jax.devices()[:2])
    with pytest.raises(ConfigError, match=r"trainer.train_batch_size: the microbatch of 3 rows"):
        Trainer(resolve(config), _tiny.parts(), mesh)


def test_resuming_with_another_batch_size_is_refused_with_a_schedule_that_keeps_the_past(
    tmp_path,
):
    _run(_tiny.config(tmp_path, **{"trainer.train_batch_size": 4}), stop_after=2)
    config = _tiny.config(tmp_path, **{"trainer.train_batch_size": 8})
    with pytest.raises(
        ConfigError,
        match=r"resuming step 2: the checkpoint trained rows 0-7 \(batch size 4\).*skip 8 rows.*"
        r'--config.trainer.batch_schedule="0:4,2:8"',
    ):
        _run(config)


def test_resuming_with_the_suggested_schedule_continues_at_the_next_row(tmp_path):
    _run(_tiny.config(tmp_path, **{"trainer.train_batch_size": 4}), stop_after=2)
    parts = _tiny.parts()
    parts.train_data = _Recording()
    config = _tiny.config(tmp_path, **{"trainer.batch_schedule": "0:4,2:8"})
    trainer = Trainer(ResolvedConfig(config, {}), parts, _tiny.one_device_mesh())
    parts.train_data.rows.clear()  # shape probing at construction
    result = trainer.run()
    assert result.start_step == 2
    trained = [r for r in parts.train_data.rows if r < 10_000]
    assert sorted(trained) == list(range(8, 8 + 4 * 8))  # rows 8.. : none skipped or repeated


def test_sigterm_without_checkpoints_does_not_claim_a_checkpoint(tmp_path):
    config = _tiny.config(tmp_path, **{"checkpoint.enabled": False})

    def preempt(step, record):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    result = Trainer(ResolvedConfig(config, {}), _tiny.parts(), _tiny.one_device_mesh()).run(
        on_step=preempt
    )
    assert result.preempted and not result.checkpoint_saved
    assert "checkpoint saved" not in result.summary
    assert "run preempted (no checkpoint: checkpoint.enabled=false" in result.summary
    assert not (tmp_path / "checkpoints").exists()


def test_sigterm_summary_says_the_checkpoint_was_saved(tmp_path):
    config = _tiny.config(tmp_path, **{"checkpoint.save_every_steps": 100})

    def preempt(step, record):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    result = Trainer(ResolvedConfig(config, {}), _tiny.parts(), _tiny.one_device_mesh()).run(
        on_step=preempt
    )
    assert "run preempted (checkpoint saved): step 3/6" in result.summary


def test_profile_traces_the_chosen_steps_into_the_run_dir(tmp_path):
    _run(_tiny.config(tmp_path, **{"trainer.profile": (2, 3)}))
    traces = list((tmp_path / "profile").rglob("*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0


def test_profile_steps_outside_the_run_are_refused(tmp_path):
    with pytest.raises(
        ConfigError, match=r"trainer.profile=\(5, 9\): \(FIRST, LAST\).*num_train_steps=6"
    ):
        resolve(_tiny.config(tmp_path, **{"trainer.profile": (5, 9)}))


class _ParamSum:
    """A hook from outside the trainer (as `main/` adds the harness): every 3 steps, the sum of
    the parameters, logged as `probe/param_sum`."""

    def __init__(self):
        self.calls = []

    def due(self, step, stopping):
        return step % 3 == 0

    def __call__(self, end):
        self.calls.append((end.step, end.stopping, end.final))
        total = sum(
            float(np.asarray(x, np.float64).sum()) for x in jax.tree.leaves(end.state.params)
        )
        end.say(f"step {end.step}: param sum {total:.6f}")
        return {"probe/param_sum": total}


def test_a_hook_given_to_the_trainer_runs_when_due_and_logs_with_its_step(tmp_path):
    hook = _ParamSum()
    trainer = Trainer(
        ResolvedConfig(_tiny.config(tmp_path / "hooked"), {}),
        _tiny.parts(),
        _tiny.one_device_mesh(),
        hooks=[hook],
    )
    result = trainer.run()
    assert hook.calls == [(3, False, False), (6, False, True)]
    records = read_metrics(tmp_path / "hooked" / "metrics.jsonl")
    logged = {r["step"]: r.get("probe/param_sum") for r in records}
    assert [s for s, v in logged.items() if v is not None] == [3, 6]
    # The logged sums are those of the parameters after steps 3 and 6, trained without a hook.
    for step in (3, 6):
        plain, _ = _run(_tiny.config(tmp_path / f"plain{step}"), stop_after=step)
        expect = sum(
            float(np.asarray(x, np.float64).sum()) for x in jax.tree.leaves(plain.state.params)
        )
        assert logged[step] == expect
    # A hook changes nothing the run computes.
    _, unhooked = _run(_tiny.config(tmp_path / "unhooked"))
    assert result.losses == unhooked.losses and result.eval == unhooked.eval


def test_add_hook_refuses_what_is_not_a_hook(tmp_path):
    trainer = Trainer(
        ResolvedConfig(_tiny.config(tmp_path), {}), _tiny.parts(), _tiny.one_device_mesh()
    )
    with pytest.raises(TypeError, match=r"add_hook\(.*\): a hook needs due\(step, stopping\)"):
        trainer.add_hook(lambda end: None)


def test_run_parts_read_a_rows_fields_from_the_data_and_check_declared_ones(tmp_path):
    import dataclasses

    from meltemi.levanter.trainer import fields_of, plan

    parts = _tiny.parts()  # its StepParts declares no batch fields
    step = parts.checked_step()
    assert step.batch_fields == fields_of(parts.train_data.sequences(np.arange(1)))
    spec = resolve(ResolvedConfig(_tiny.config(tmp_path), {}))
    with pytest.raises(ValueError, match=r"parts.batch_fields is None; pass RunParts.checked_"):
        plan(spec, mesh=_tiny.one_device_mesh(), parts=parts.step)
    wrong = dict(step.batch_fields, tokens=jax.ShapeDtypeStruct((3,), np.int32))
    parts.step = dataclasses.replace(parts.step, batch_fields=wrong)
    with pytest.raises(RuntimeError, match=r"batch fields .* differ from the data's"):
        parts.checked_step()
