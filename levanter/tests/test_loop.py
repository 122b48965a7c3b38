"""The training loop: resume, preemption, batch-size schedules, metrics, retention."""

import os
import signal

import _tiny
import jax
import numpy as np

from meltemi.levanter.checkpoint import read_manifest, step_dir
from meltemi.levanter.config import ResolvedConfig
from meltemi.levanter.tracking import REQUIRED_KEYS, read_metrics
from meltemi.levanter.trainer import Trainer


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
    from meltemi.levanter import optim

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
    import pytest

    from meltemi.levanter.trainer import TrainerError

    config = _tiny.config(tmp_path, **{"trainer.microbatches": 3})
    with pytest.raises(
        TrainerError, match=r"trainer.microbatches=3 does not divide the batch size 8"
    ):
        Trainer(ResolvedConfig(config, {}), _tiny.parts(), _tiny.one_device_mesh())


def test_malformed_batch_schedule_names_the_key_and_the_format(tmp_path):
    import pytest

    from meltemi.levanter.trainer import BatchScheduleError

    config = _tiny.config(tmp_path, **{"trainer.batch_schedule": "0:8,100"})
    with pytest.raises(
        BatchScheduleError, match=r"trainer.batch_schedule='0:8,100': '100' is not STEP:SIZE"
    ):
        Trainer(ResolvedConfig(config, {}), _tiny.parts(), _tiny.one_device_mesh())


def test_unknown_compute_dtype_lists_the_choices(tmp_path):
    import pytest

    from meltemi.levanter.trainer import TrainerError

    config = _tiny.config(tmp_path, **{"trainer.compute_dtype": "bf16"})
    with pytest.raises(
        TrainerError, match=r"trainer.compute_dtype='bf16': use one of \['bfloat16'"
    ):
        Trainer(ResolvedConfig(config, {}), _tiny.parts(), _tiny.one_device_mesh())
