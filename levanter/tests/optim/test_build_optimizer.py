"""build_optimizer: from a dataclass, a dict or a ConfigDict; typos and bad values are errors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from meltemi.levanter import optim

MARIN = dict(
    learning_rate=3e-4, total_steps=1_000, lr_schedule="linear", warmup=0.01, decay=0.4,
    cycles=(500,), rewarmup=100, weight_decay=0.1, adamc="decay",
    max_grad_norm=((0, 1.0), (500, 0.2)), update_clip_window=128, update_clip_sigma=2.0,
    skip_step_window=128, skip_step_sigma=2.0, ema_beta=0.995,
)  # fmt: skip


def _params():
    return {"w": jnp.ones((3, 5)), "norm": jnp.ones(5), "embed": jnp.ones((11, 3))}


def test_marin_config_builds_the_whole_chain_and_reports_every_metric():
    tx, schedule = optim.build_optimizer(optim.OptimizerConfig(**MARIN))
    params = _params()
    state = tx.init(params)
    _, state = tx.update(_params(), state, params, loss=jnp.float32(2.5))
    assert set(optim.metrics(state)) >= {
        "grad_clip_norm", "grad_clip_threshold", "grad_clipped", "learning_rate",
        "weight_decay", "update_clip_norm", "update_clip_threshold", "update_clipped",
        "skip/skipped", "skip/reason",
    }  # fmt: skip
    assert optim.ema_of(state)["w"].shape == (3, 5)
    assert [p["start"] for p in schedule.phases()] == [0, 500]
    assert float(schedule(600)) == pytest.approx(3e-4)


def _grads(t):
    return jax.tree.map(lambda p: jnp.cos(p * (t + 1.0)) * (1.0 + 0.3 * t), _params())


def _train(tx, steps):
    """Params after `steps` updates (past any warmup, where the lr is 0 at step 0)."""
    tx = optax.with_extra_args_support(tx)
    params = _params()
    state = tx.init(params)
    for t in range(steps):
        u, state = tx.update(_grads(t), state, params, loss=jnp.float32(2.0 + 0.01 * t))
        params = optax.apply_updates(params, u)
    moved = sum(
        float(jnp.abs(a - b).sum()) for a, b in zip(*map(jax.tree.leaves, (params, _params())))
    )
    assert moved > 0, "nothing was updated: the comparison below would be vacuous"
    return params


def test_dict_and_configdict_build_the_same_optimizer():
    ml_collections = pytest.importorskip("ml_collections")
    cfg = {**MARIN, "cycles": [500], "max_grad_norm": [[0, 1.0], [500, 0.2]]}
    results = []
    for c in (cfg, ml_collections.ConfigDict(cfg), optim.OptimizerConfig(**MARIN)):
        results.append(_train(optim.build_optimizer(c)[0], steps=15))  # warmup is 10 steps
    for other in results[1:]:
        for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(other), strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("weight_decay", [0.0, 0.5])
def test_default_config_is_clipped_adamw_matching_optax(weight_decay):
    config = {"learning_rate": 1e-2, "total_steps": 50, "weight_decay": weight_decay, "b1": 0.8}
    tx, schedule = optim.build_optimizer(config)
    assert float(schedule(0)) == 0.0  # 1% warmup: step 0 alone would compare nothing
    ref = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(
            schedule, b1=0.8, b2=0.95, weight_decay=weight_decay,
            mask=optim.decay_mask(_params()),
        ),
    )  # fmt: skip
    ours, theirs = _train(tx, steps=6), _train(ref, steps=6)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_changing_a_hyperparameter_changes_the_result():
    # The comparison above can fail: another b1 or decay gives other params.
    base = _train(optim.build_optimizer({"learning_rate": 1e-2, "total_steps": 50})[0], 6)
    for change in ({"b1": 0.1}, {"weight_decay": 0.5}):
        config = {"learning_rate": 1e-2, "total_steps": 50, **change}
        other = _train(optim.build_optimizer(config)[0], 6)
        assert not np.allclose(other["w"], base["w"], rtol=1e-6, atol=1e-7)


def test_total_steps_argument_overrides_the_config():
    _, schedule = optim.build_optimizer({"total_steps": 10}, total_steps=300)
    assert schedule.total_steps == 300


def test_mu_dtype_sets_the_first_moment_dtype():
    tx, _ = optim.build_optimizer({"mu_dtype": "bfloat16"})
    state = tx.init(_params())
    adam = [s for s in jax.tree.leaves(state, is_leaf=_is_adam) if _is_adam(s)]
    assert adam and all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(adam[0].mu))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(adam[0].nu))


def _is_adam(x):
    return isinstance(x, optax.ScaleByAdamState)


def test_lr_multipliers_scale_matching_parameters_updates():
    base = {"learning_rate": 1e-2, "total_steps": 50, "warmup": 0, "max_grad_norm": None}
    plain, _ = optim.build_optimizer(base)
    scaled, _ = optim.build_optimizer({**base, "lr_multipliers": [["^w$", 0.25], ["w", 9.0]]})
    g = _grads(0)
    u1, _ = plain.update(g, plain.init(_params()), _params())
    u2, _ = scaled.update(g, scaled.init(_params()), _params())
    np.testing.assert_allclose(u2["w"], 0.25 * u1["w"], rtol=1e-6)  # first match wins
    np.testing.assert_array_equal(u2["norm"], u1["norm"])


def test_muon_config_uses_its_own_adam_learning_rate():
    tx, schedule = optim.build_optimizer(
        {"name": "muon", "learning_rate": 0.02, "adam_learning_rate": 1e-3, "warmup": 0}
    )
    _, state = tx.update(_params(), tx.init(_params()), _params())
    m = optim.metrics(state)
    assert float(m["muon/learning_rate"]) == pytest.approx(0.02)
    assert float(m["adam/learning_rate"]) == pytest.approx(1e-3)


def test_a_typo_in_a_key_suggests_the_right_name():
    with pytest.raises(
        optim.OptimizerConfigError, match="'max_grad_nrom'; did you mean 'max_grad_norm'"
    ):
        optim.build_optimizer({"max_grad_nrom": 0.2})


def test_a_typo_in_a_choice_suggests_the_right_value():
    with pytest.raises(optim.OptimizerConfigError, match="did you mean lr_schedule='cosine'"):
        optim.build_optimizer({"lr_schedule": "cosin"})


def test_a_non_mapping_config_is_an_error():
    with pytest.raises(optim.OptimizerConfigError, match="got int"):
        optim.build_optimizer(3)


INERT = [
    ({"adam_learning_rate": 1e-3}, r"adam_learning_rate=0.001 has no effect with name='adamw'"),
    ({"muon_beta": 0.9}, r"muon_beta=0.9 has no effect with name='adamw'.*set name='muon'"),
    ({"name": "muon"}, r"adam_learning_rate=None with name='muon'.*adam_learning_rate=3e-4"),
    ({"skip_step_sigma": 3.0}, r"skip_step_sigma=3.0 .* skip_step_window=None.*=128"),
    ({"skip_step_warmup": 8}, r"skip_step_warmup=8 has no effect while skip_step_window=None"),
    ({"skip_step_schedule": "applied"}, r"skip_step_schedule='applied' has no effect while"),
    ({"update_clip_sigma": 1.0}, r"update_clip_sigma=1.0 .* update_clip_window=None"),
    ({"update_clip_warmup": 4}, r"update_clip_warmup=4 .* update_clip_window=None"),
    ({"rewarmup": 100}, r"rewarmup=100 has no effect while cycles=None.*cycles=2"),
    (
        {"adamc": "decay", "weight_decay": 0.1, "lr_schedule": "constant"},
        r"adamc='decay' has no effect with lr_schedule='constant'.*adamc='always'",
    ),
    ({"adamc": "always"}, r"adamc='always' has no effect while weight_decay=0"),
    (
        {"adamc_exclude_patterns": ("head",), "weight_decay": 0.1},
        r"adamc_exclude_patterns=\('head',\) has no effect while adamc='off'",
    ),
    ({"no_decay_patterns": ("norm",)}, r"no_decay_patterns=\('norm',\) .* weight_decay=0"),
    (
        {"no_decay_patterns": "norm", "weight_decay": 0.1},
        r"no_decay_patterns='norm' is a plain string.*no_decay_patterns=\('norm',\)",
    ),
    ({"mu_dtype": "bf16"}, r"mu_dtype='bf16' is not one of .*did you mean mu_dtype='bfloat16'"),
    ({"lr_multipliers": [["lm_head"]]}, r"lr_multipliers: \('lm_head',\) is not a \(pattern"),
    ({"lr_multipliers": "lm_head"}, r"lr_multipliers='lm_head' must be \(pattern, factor\)"),
]


@pytest.mark.parametrize(("config", "message"), INERT)
def test_a_setting_that_has_no_effect_is_an_error_naming_it_and_the_fix(config, message):
    with pytest.raises(optim.OptimizerConfigError, match=message):
        optim.OptimizerConfig(**{k: optim._config._tuplify(v) for k, v in config.items()})
    with pytest.raises(optim.OptimizerConfigError, match=message):
        optim.build_optimizer(config)


def test_the_same_settings_are_accepted_where_they_take_effect():
    for config in (
        {"name": "muon", "adam_learning_rate": 1e-3, "muon_beta": 0.9},
        {"skip_step_window": 16, "skip_step_sigma": 3.0, "skip_step_schedule": "applied"},
        {"update_clip_window": 16, "update_clip_sigma": 1.0},
        {"cycles": 2, "rewarmup": 10},
        {"adamc": "decay", "weight_decay": 0.1, "lr_schedule": "linear"},
        {"adamc": "always", "weight_decay": 0.1, "lr_schedule": "constant"},
        {"no_decay_patterns": ["norm"], "weight_decay": 0.1},
    ):
        optim.build_optimizer(config)
