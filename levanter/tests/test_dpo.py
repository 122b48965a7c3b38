"""DPO in the trainer: the reference model (live copy, precomputed, LoRA base), metrics, resume
and the errors of `trainer.objective` / `trainer.reference_from`.

Every run is `configs/dpo.py:smoke` (a 2-layer, width-32 model from scratch, whose own start
is the reference) on the shipped preference pairs, a few steps each.
"""

import json
import pathlib
import subprocess
import sys

import _subprocess
import jax
import numpy as np
import pytest
from _one_error import one_error_line

from meltemi.levanter.config import ConfigError, load_config, resolve
from meltemi.levanter.trainer import Trainer

CONFIGS = pathlib.Path(__file__).parent.parent / "configs"
DPO = f"{CONFIGS / 'dpo.py'}:smoke"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("dpo")


def _config(root, name, *overrides, steps=3):
    return load_config(
        DPO,
        [("run_dir", str(root / name)), ("data.cache_dir", str(root / "cache")),
         ("trainer.num_train_steps", str(steps)), *overrides],
    )  # fmt: skip


def _records(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def live(root):
    trainer = Trainer(_config(root, "live", ("eval.at_start", "true")))
    return trainer, trainer.run()


@pytest.fixture(scope="module")
def pre(root):
    trainer = Trainer(_config(root, "pre", ("trainer.reference", "precomputed")))
    return trainer, trainer.run()


def test_a_dpo_step_logs_rewards_accuracies_and_log_ratios(root, live):
    _, result = live
    first = _records(root / "live")[1]  # [0] is the evaluation at the start (step 0)
    assert first["step"] == 1
    # Step 1: the policy is its own reference, so the loss is log 2 and the rewards are 0.
    assert first["train/loss"] == pytest.approx(np.log(2), abs=1e-6)
    for name in ("rewards/margins", "rewards/chosen", "logratios/rejected"):
        assert first[f"train/{name}"] == pytest.approx(0.0, abs=1e-6)
    assert first["train/logps/chosen"] < 0
    ev = result.eval["validation"]
    assert {"loss", "pairs", "rewards/accuracies", "rewards/margins", "logps/accuracies",
            "logratios/chosen"} <= set(ev)  # fmt: skip
    assert ev["pairs"] == 4  # eval.batch_size 4 rows of one batch: pairs that fit
    last = _records(root / "live")[-1]
    assert "eval/validation/rewards/accuracies" in last and "eval/validation/bpb" not in last


def test_eval_at_start_evaluates_the_starting_model_as_step_0(root, live):
    _, result = live
    start = result.eval_at_start["validation"]
    record = _records(root / "live")[0]
    assert record["step"] == 0 and "train/loss" not in record
    assert record["eval/validation/logps/accuracies"] == start["logps/accuracies"]
    # The policy is its own reference: every pair ties, so the loss is log 2 and no implied
    # reward prefers either reply; the policy's own preference is measured all the same.
    assert start["loss"] == pytest.approx(np.log(2), abs=1e-6)
    assert start["rewards/margins"] == 0.0 and start["rewards/accuracies"] == 0.0
    assert 0.0 <= start["logps/accuracies"] <= 1.0 and start["pairs"] == 4
    assert "eval/validation at step 0: loss 0.6931" in result.summary
    print(f"start: {start}\nend: {result.eval['validation']}")


def test_the_live_reference_is_a_frozen_copy_of_the_start(live):
    trainer, _ = live
    state = trainer.state
    start = trainer.init_state()  # the same seed: the policy's start
    same = jax.tree.map(lambda a, b: bool((np.asarray(a) == np.asarray(b)).all()),
                        state.reference, start.params)  # fmt: skip
    assert all(jax.tree.leaves(same))
    moved = jax.tree.map(lambda a, b: bool((np.asarray(a) != np.asarray(b)).any()),
                         state.params, start.params)  # fmt: skip
    assert any(jax.tree.leaves(moved))
    # No optimizer state for the reference: the opt state's arrays are those of the params.
    opt_bytes = sum(x.nbytes for x in jax.tree.leaves(state.opt_state))
    params_bytes = sum(x.nbytes for x in jax.tree.leaves(state.params))
    assert opt_bytes < 2.5 * params_bytes


def test_the_precomputed_reference_gives_the_live_loss(root, live, pre):
    _, live_result = live
    trainer, result = pre
    assert trainer.parts.train_data.computed_rows == 3 * 4
    for step, loss in live_result.losses.items():
        assert abs(result.losses[step] - loss) < 1e-5, (step, result.losses[step], loss)
    for k, v in live_result.eval["validation"].items():
        assert abs(result.eval["validation"][k] - v) < 1e-5, k
    stored = list((root / "cache" / "reference").iterdir())
    assert len(stored) == 1 and (stored[0] / "logps.npy").exists()
    key = json.loads((stored[0] / "key.json").read_text())
    assert key["rows"] == 3 * 4  # every training row, computed once
    # Another reference (another seed's start) is detected: a second, separate entry.
    Trainer(_config(root, "pre-seed", ("trainer.reference", "precomputed"),
                    ("trainer.seed", "1"), steps=1)).run()  # fmt: skip
    assert len(list((root / "cache" / "reference").iterdir())) == 2


def test_resume_is_bitwise(root, live):
    trainer, result = live
    config = _config(root, "resumed", ("checkpoint.save_every_steps", "1"))
    Trainer(config).run(stop_after=2)
    resumed = Trainer(config)
    again = resumed.run()
    assert again.start_step == 2
    for step in (3,):
        assert again.losses[step] == result.losses[step]
    same = jax.tree.map(lambda a, b: bool((np.asarray(a) == np.asarray(b)).all()),
                        resumed.state.params, trainer.state.params)  # fmt: skip
    assert all(jax.tree.leaves(same))


def test_resume_with_the_precomputed_reference_is_bitwise_and_reuses_its_log_probs(root, pre):
    straight, result = pre
    config = _config(root, "pre-resumed", ("trainer.reference", "precomputed"),
                     ("data.cache_dir", str(root / "cache-resumed")),
                     ("checkpoint.save_every_steps", "1"))  # fmt: skip
    first = Trainer(config)
    first.run(stop_after=2)
    assert first.parts.train_data.computed_rows == 3 * 4  # a new cache: computed once
    (stored,) = (root / "cache-resumed" / "reference").iterdir()
    written = (stored / "logps.npy").stat().st_mtime_ns
    resumed = Trainer(config)
    again = resumed.run()
    assert again.start_step == 2 and again.losses[3] == result.losses[3]
    # Reopened from the cache by its key, not computed again.
    assert resumed.parts.train_data.computed_rows == 0
    assert (stored / "logps.npy").stat().st_mtime_ns == written
    assert list((root / "cache-resumed" / "reference").iterdir()) == [stored]
    for name in ("params", "opt_state"):
        ours, theirs = getattr(resumed.state, name), getattr(straight.state, name)
        same = jax.tree.map(lambda a, b: bool((np.asarray(a) == np.asarray(b)).all()), ours, theirs)
        assert all(jax.tree.leaves(same)), name


def _state_bytes(state):
    return sum(x.nbytes for x in jax.tree.leaves(state) if isinstance(x, jax.Array))


def test_the_lora_reference_is_the_base_model_without_a_second_copy(root, live):
    live_trainer, _ = live
    trainer = Trainer(_config(root, "lora", ("model.lora.rank", "4"), steps=2))
    result = trainer.run()
    state = trainer.state
    assert state.reference is None
    base = sum(x.nbytes for x in jax.tree.leaves(live_trainer.state.params))
    adapters = _state_bytes(state.params) - base
    assert 0 < adapters < 0.2 * base
    # Live: params + reference (two copies of the base) + Adam's two moments of the base.
    live_bytes = _state_bytes(live_trainer.state)
    lora_bytes = _state_bytes(state)
    print(f"train state bytes: live reference {live_bytes:,}, LoRA {lora_bytes:,} "
          f"(base weights {base:,})")  # fmt: skip
    assert live_bytes >= 4 * base and lora_bytes < base + 4 * adapters
    # What the compiled step holds as arguments: one copy of the base, not two.
    live_args = live_trainer.compiled_step(4).memory_analysis().argument_size_in_bytes
    lora_args = trainer.compiled_step(4).memory_analysis().argument_size_in_bytes
    assert lora_args < live_args - 0.9 * base
    # The base is the reference: at step 1 (adapters' B = 0) the policy equals it.
    assert result.losses[1] == pytest.approx(np.log(2), abs=1e-6)


def test_simpo_and_ipo_train_without_and_with_a_reference(root):
    for objective, extra in (("simpo", [("trainer.beta", "2.0")]), ("ipo", [])):
        result = Trainer(_config(root, objective, ("trainer.objective", objective), *extra,
                                 ("eval.num_batches", "0"), steps=1)).run()  # fmt: skip
        first = _records(root / objective)[0]
        assert np.isfinite(result.losses[1])
        assert ("train/logratios/chosen" in first) == (objective == "ipo")


def test_a_missing_reference_is_one_error_line(root, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(_subprocess.TRAIN), f"--config={DPO}",
         f"--config.run_dir={tmp_path / 'run'}", f"--config.data.cache_dir={root / 'cache'}",
         "--config.checkpoint.init_from=runs/sft",
         f"--config.trainer.reference_from={tmp_path / 'nope'}"],
        env=_subprocess.env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2
    line = one_error_line(proc.stderr)
    missing = tmp_path / "nope"
    assert line.startswith(f"error: trainer.reference_from='{missing}': no such directory")
    assert "checkpoint.init_from='runs/sft'" in line


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ([("model.lora.rank", "4"), ("trainer.reference_from", ".")], r"with LoRA .* base model"),
        ([("trainer.objective", "simpo"), ("trainer.reference_from", ".")], r"SimPO uses no"),
        ([("data.source", "stdlib"), ("data.train_files", "()")], r"data.source=chat"),
        ([("trainer.beta", "0.0")], r"trainer.beta=0.0: must be > 0"),
        ([("trainer.label_smoothing", "0.5")], r"trainer.label_smoothing=0.5: .* \[0, 0.5\)"),
    ],
)
def test_objective_keys_are_checked_at_load(root, overrides, match):
    with pytest.raises(ConfigError, match=match):
        resolve(_config(root, "bad", *overrides))


def test_supervised_training_still_refuses_the_pairs(root):
    from meltemi.levanter.trainer._data import build_stores, packed

    store, _ = build_stores(resolve(_config(root, "pairs")))
    assert store.is_preference
    spec = resolve(_config(root, "lm", ("trainer.objective", "lm")))
    with pytest.raises(ConfigError, match=r"holds preference pairs .*trainer.objective=dpo"):
        packed(spec, store)
