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
        "grad_norm", "grad_clip_threshold", "grad_clipped", "learning_rate", "weight_decay",
        "update_norm", "update_clip_threshold", "update_clipped", "skip/skipped", "skip/reason",
    }  # fmt: skip
    assert optim.ema_of(state)["w"].shape == (3, 5)
    assert [p["start"] for p in schedule.phases()] == [0, 500]
    assert float(schedule(600)) == pytest.approx(3e-4)


def test_dict_and_configdict_build_the_same_optimizer():
    ml_collections = pytest.importorskip("ml_collections")
    cfg = {**MARIN, "cycles": [500], "max_grad_norm": [[0, 1.0], [500, 0.2]]}
    results = []
    for c in (cfg, ml_collections.ConfigDict(cfg), optim.OptimizerConfig(**MARIN)):
        tx, _ = optim.build_optimizer(c)
        u, _ = tx.update(_params(), tx.init(_params()), _params(), loss=jnp.float32(1.0))
        results.append(u)
    for other in results[1:]:
        for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(other), strict=True):
            np.testing.assert_array_equal(a, b)


def test_default_config_is_clipped_adamw_matching_optax():
    tx, schedule = optim.build_optimizer({"learning_rate": 1e-3, "total_steps": 50})
    ref = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=0.0),
    )
    params, g = _params(), jax.tree.map(lambda p: 3.0 * p, _params())
    ours, _ = tx.update(g, tx.init(params), params)
    theirs, _ = ref.update(g, ref.init(params), params)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_total_steps_argument_overrides_the_config():
    _, schedule = optim.build_optimizer({"total_steps": 10}, total_steps=300)
    assert schedule.total_steps == 300


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
