"""Training on a data mixture (levanter/configs/mixture.py): stages, batch-size schedules,
resume, warm start, per-component metrics and evaluation, and errors in mixture configs."""

import pathlib

import jax
import ml_collections
import numpy as np
import pytest

from meltemi.levanter.checkpoint import flatten_state, restore_arrays, step_dir
from meltemi.levanter.config import base_config, load_config, mixture_component, with_variant
from meltemi.levanter.mesh import make_mesh
from meltemi.levanter.tracking import read_metrics
from meltemi.levanter.trainer import MixtureConfigError, Trainer, build_parts, mixture_plan

MIXTURE = pathlib.Path(__file__).parent.parent / "configs" / "mixture.py"
# 4 steps: 4 rows for steps 0-1, 8 rows from step 2; the weights change at step 3.
RUN = (
    ("trainer.num_train_steps", "4"),
    ("trainer.batch_schedule", "0:4,2:8"),
    ("data.weight_stages", "((3, {'stdlib': 0.25, 'tests': 0.75}),)"),
    ("checkpoint.save_every_steps", "2"),
    ("checkpoint.verify", "sizes"),
)


def _resolved(root, name, *overrides):
    return load_config(
        f"{MIXTURE}:smoke",
        [("run_dir", str(root / name)), ("data.cache_dir", str(root / "cache")), *overrides],
    )


def _plan(*overrides):
    return mixture_plan(load_config(f"{MIXTURE}:smoke", list(overrides)).config)


def _trainer(resolved):
    mesh = make_mesh({"data": 1}, devices=jax.devices()[:1])
    return Trainer(resolved, build_parts(resolved.config), mesh)


def _param_bytes(trainer):
    return [np.asarray(x).tobytes() for x in jax.tree.leaves(trainer.state.params)]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture")
    trainer = _trainer(_resolved(root, "full", *RUN))
    return root, trainer, trainer.run()


# -- training -------------------------------------------------------------------------------


def test_metrics_log_each_components_fraction_at_every_step(full_run):
    root, trainer, _ = full_run
    records = read_metrics(root / "full" / "metrics.jsonl")
    fractions = [(r["data/stdlib/fraction"], r["data/tests/fraction"]) for r in records]
    # 0.75/0.25 of 4 and 8 rows, then the stage of step 3 (logged as step 4): 0.25/0.75.
    assert fractions == [(0.75, 0.25), (0.75, 0.25), (0.75, 0.25), (0.25, 0.75)]
    assert [r["batch_size"] for r in records] == [4, 4, 8, 8]
    components = trainer.host_batch(3)["component"]  # the rows the step trained on
    assert np.bincount(components, minlength=2).tolist() == [2, 6]


def test_each_components_validation_text_is_evaluated_under_its_name(full_run):
    _, _, result = full_run
    assert set(result.eval) == {"stdlib", "tests"}
    assert result.eval["stdlib"]["bpb"] != result.eval["tests"]["bpb"]


def test_interrupted_mixture_run_resumes_bit_for_bit(full_run):
    root, full, full_result = full_run
    resolved = _resolved(root, "cut", *RUN)
    first = _trainer(resolved).run(stop_after=3)  # past the batch-size change
    resumed = _trainer(resolved)
    second = resumed.run()
    assert second.start_step == 2
    assert {**first.losses, **second.losses} == full_result.losses
    assert _param_bytes(resumed) == _param_bytes(full)


def test_warm_start_from_a_checkpoint_with_another_mixture_and_batch_size(full_run):
    root, _, _ = full_run
    source = step_dir(root / "full" / "checkpoints", 4)
    resolved = _resolved(
        root,
        "warm",
        ("checkpoint.init_from", str(source)),
        ("trainer.batch_schedule", ""),
        ("trainer.train_batch_size", "8"),
        ("data.components.stdlib.weight", "0.5"),
        ("data.components.tests.weight", "0.5"),
        ("data.weight_stages", "()"),
    )
    trainer = _trainer(resolved)
    state, start = trainer._restore_or_init(None)
    assert start == 0
    params = flatten_state({"params": state.params})
    saved = restore_arrays(source, params)
    assert set(saved) == set(params)  # same model: every array loaded, none initialised
    for key, value in params.items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(saved[key]), err_msg=key)
    result = trainer.run()
    assert result.step == 2 and np.isfinite(list(result.losses.values())).all()
    records = read_metrics(root / "warm" / "metrics.jsonl")
    assert [r["batch_size"] for r in records] == [8, 8]
    assert all(r["data/stdlib/fraction"] == 0.5 for r in records)


# -- config errors (checked before any store is built) --------------------------------------


def test_the_smoke_mixture_plan_orders_components_by_name_and_starts_at_step_0():
    plan = _plan()
    assert plan.names == ["stdlib", "tests"]
    assert plan.stages == ((0, {"stdlib": 0.75, "tests": 0.25}), (1, {"stdlib": 0.5, "tests": 0.5}))


def test_a_stage_naming_an_unknown_component_suggests_the_closest():
    with pytest.raises(
        MixtureConfigError,
        match=r"data.weight_stages\[0\] \(step 5\): unknown component 'test'\. "
        r"Did you mean 'tests'\? Components: stdlib, tests\.",
    ):
        _plan(("data.weight_stages", "((5, {'stdlib': 0.5, 'test': 0.5}),)"))


def test_weights_not_summing_to_one_show_the_normalised_weights():
    with pytest.raises(
        MixtureConfigError,
        match=r"data.components.\*.weight: the weights sum to 1.25 \(stdlib=0.75, tests=0.5\); "
        r"they must sum to 1, e.g. stdlib=0.6, tests=0.4",
    ):
        _plan(("data.components.tests.weight", "0.5"))


def test_a_negative_weight_names_the_key_and_the_value():
    with pytest.raises(
        MixtureConfigError,
        match=r"data.components.tests.weight=-0.25: a weight is a number >= 0.*"
        r"--config.data.components.tests.weight=0.5",
    ):
        _plan(("data.components.tests.weight", "-0.25"), ("data.components.stdlib.weight", "1.25"))


def test_a_negative_stage_weight_names_the_stage():
    with pytest.raises(
        MixtureConfigError, match=r"data.weight_stages\[0\]\['tests'\]=-1: a weight is a number"
    ):
        _plan(("data.weight_stages", "((5, {'stdlib': 2, 'tests': -1}),)"))


def test_stage_steps_that_do_not_increase_are_refused():
    with pytest.raises(
        MixtureConfigError,
        match=r"stage steps must increase, but data.weight_stages\[1\] starts at step 3 after "
        r"a stage at step 5; list the stages in step order",
    ):
        _plan(("data.weight_stages", "((5, {'stdlib': 1.0}), (3, {'tests': 1.0}))"))


def test_a_stage_at_step_0_points_to_the_component_weights():
    with pytest.raises(
        MixtureConfigError, match=r"step 0 must be an int > 0 \(step 0 uses data.components"
    ):
        _plan(("data.weight_stages", "((0, {'stdlib': 1.0}),)"))


def test_a_misspelt_component_key_suggests_the_right_one():
    config = base_config()
    config.data.source = "mixture"
    config.data.components.code = ml_collections.ConfigDict({"source": "a.txt", "wieght": 1.0})
    with pytest.raises(
        MixtureConfigError,
        match=r"`data.components.code.wieght`: a component has no key 'wieght'\. "
        r"Did you mean `data.components.code.weight`\?",
    ):
        mixture_plan(with_variant(config, None, {}))


def test_components_without_the_mixture_source_are_refused():
    config = base_config()
    config.data.components.code = mixture_component("stdlib:train", 1.0)
    with pytest.raises(
        MixtureConfigError, match=r"data.source='stdlib'.*--config.data.source=mixture"
    ):
        mixture_plan(with_variant(config, None, {}))


def test_a_mixture_without_components_shows_how_to_add_one():
    with pytest.raises(MixtureConfigError, match=r"needs data.components.*mixture_component\("):
        mixture_plan(load_config(f"{MIXTURE.parent / 'default.py'}:smoke",
                                 [("data.source", "mixture")]).config)  # fmt: skip


def test_a_component_source_matching_no_file_names_the_key(tmp_path):
    resolved = _resolved(
        tmp_path, "run", ("data.components.tests.source", f"text:{tmp_path}/none/*.py")
    )
    with pytest.raises(
        MixtureConfigError, match=r"data.components.tests.source: TextFiles.*no files match"
    ):
        build_parts(resolved.config)
