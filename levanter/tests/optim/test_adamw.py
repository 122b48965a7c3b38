"""AdamW numerics against optax, the default decay mask, and AdamC against its formula."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from meltemi.levanter import optim


def _params():
    k1, k2, k3, k4 = jax.random.split(jax.random.key(0), 4)
    return {
        "embed": jax.random.normal(k1, (11, 3)),
        "layers": [{"w": jax.random.normal(k2, (3, 5)), "bias": jax.random.normal(k3, (5,))}],
        "final_norm": {"weight": jnp.ones((3,))},
        "lm_head": jax.random.normal(k4, (3, 11)),
    }


def _grads(step):
    return jax.tree.map(lambda p: jax.random.normal(jax.random.key(100 + step), p.shape), _params())


def _run(tx, steps=5):
    params = _params()
    state = tx.init(params)
    for t in range(steps):
        updates, state = tx.update(_grads(t), state, params)
        params = optax.apply_updates(params, updates)
    return params, state


@pytest.mark.parametrize("lr", [1e-2, optax.linear_schedule(1e-2, 1e-3, 4)])
def test_adamw_matches_optax_adamw(lr):
    mask = optim.decay_mask(_params())
    ours, _ = _run(optim.adamw(lr, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.1, mask=mask))
    ref, _ = _run(optax.adamw(lr, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.1, mask=mask))
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_default_mask_skips_norms_biases_embeddings():
    mask = optim.decay_mask(_params())
    assert mask == {
        "embed": False,
        "layers": [{"w": True, "bias": False}],
        "final_norm": {"weight": False},
        "lm_head": True,
    }


def test_mask_patterns_are_configurable():
    mask = optim.decay_mask(_params(), no_decay=(r"lm_head",))
    assert mask["lm_head"] is False and mask["embed"] is True and mask["final_norm"]["weight"]


def test_gpt2_style_names_get_no_decay():
    params = {"wte": jnp.ones(2), "wpe": jnp.ones(2), "h": {"ln_1": {"g": jnp.ones(2)}}}
    assert optim.decay_mask(params) == {"wte": False, "wpe": False, "h": {"ln_1": {"g": False}}}


def _decay_only(tx, schedule, steps):
    """Runs zero gradients so the update is pure decay; returns per-step multipliers."""
    params = {"w": jnp.full((3, 5), 2.0)}
    state = tx.init(params)
    factors, wds = [], []
    for _ in range(steps):
        updates, state = tx.update({"w": jnp.zeros((3, 5))}, state, params)
        new = optax.apply_updates(params, updates)
        factors.append(float(new["w"][0, 0] / params["w"][0, 0]))
        wds.append(float(optim.metrics(state)["weight_decay"]))
        params = new
    return factors, wds


def test_adamc_always_decays_by_wd_times_lr_squared_over_lr_max():
    schedule = optim.wsd_schedule(0.5, 20, warmup=4, decay=8, shape="cosine")
    wd = 0.3
    tx = optim.adamw(schedule, weight_decay=wd, mask=(), adamc="always")
    factors, wds = _decay_only(tx, schedule, 20)
    for t in (0, 2, 4, 11, 12, 15, 19):
        lr = float(schedule(t))
        assert wds[t] == pytest.approx(wd * lr / 0.5, rel=1e-6)
        assert factors[t] == pytest.approx(1.0 - wd * lr * lr / 0.5, rel=1e-6)


def test_adamc_decay_mode_is_plain_adamw_before_the_decay_phase():
    schedule = optim.wsd_schedule(0.5, 20, warmup=4, decay=8, shape="linear")
    wd = 0.3
    tx = optim.adamw(schedule, weight_decay=wd, mask=(), adamc="decay")
    factors, wds = _decay_only(tx, schedule, 20)
    for t in (0, 3, 4, 11):  # warmup and stable: wd_t = wd
        assert wds[t] == pytest.approx(wd, rel=1e-6)
        assert factors[t] == pytest.approx(1.0 - wd * float(schedule(t)), rel=1e-6)
    for t in (12, 14, 19):  # decay phase: wd_t = wd * lr_t / lr_max
        lr = float(schedule(t))
        assert wds[t] == pytest.approx(wd * lr / 0.5, rel=1e-6)
        assert factors[t] == pytest.approx(1.0 - wd * lr * lr / 0.5, rel=1e-6)


def test_adamc_decay_mode_rejects_a_schedule_without_phases():
    with pytest.raises(optim.OptimizerConfigError, match="adamc='decay' needs a schedule"):
        optim.adamw(optax.linear_schedule(1.0, 0.0, 10), adamc="decay", lr_max=1.0)


def test_adamc_needs_lr_max_for_a_plain_callable():
    with pytest.raises(optim.OptimizerConfigError, match="lr_max=3e-4"):
        optim.adamw(optax.linear_schedule(1.0, 0.0, 10), adamc="always")


def test_unknown_adamc_mode_is_an_error():
    with pytest.raises(optim.OptimizerConfigError, match="adamc='sometimes' is not one of"):
        optim.adamw(1e-3, adamc="sometimes")


def test_learning_rate_metric_is_the_lr_applied():
    schedule = optim.linear_schedule(1.0, 10)
    _, state = _run(optim.adamw(schedule), steps=3)
    assert float(optim.metrics(state)["learning_rate"]) == pytest.approx(float(schedule(2)))


def _decay_factors(adamc_mask, schedule, t_end):
    """Per-parameter multiplier `new / old` of a pure-decay step (zero gradients) at `t_end`."""
    kwargs = {} if adamc_mask is None else {"adamc_mask": adamc_mask}
    tx = optim.adamw(schedule, weight_decay=0.3, mask=(), adamc="always", **kwargs)
    params = {"lm_head": jnp.full((3, 11), 2.0), "layers": {"w": jnp.full((3, 5), 2.0)}}
    state = tx.init(params)
    zeros = jax.tree.map(jnp.zeros_like, params)
    for _ in range(t_end + 1):  # params held fixed: the last update is step t_end's decay
        updates, state = tx.update(zeros, state, params)
    new = optax.apply_updates(params, updates)
    return {"lm_head": float(new["lm_head"][0, 0]), "layers": float(new["layers"]["w"][0, 0])}


def test_adamc_corrects_hidden_layers_but_not_the_output_head_by_default():
    # Defazio 2025 (arXiv:2506.02285): the correction is for hidden layers followed by a norm.
    schedule = optim.wsd_schedule(0.5, 20, warmup=4, decay=8, shape="linear")
    t = 15
    lr = float(schedule(t))
    new = _decay_factors(None, schedule, t)
    assert new["layers"] / 2.0 == pytest.approx(1.0 - 0.3 * lr * lr / 0.5, rel=1e-6)
    assert new["lm_head"] / 2.0 == pytest.approx(1.0 - 0.3 * lr, rel=1e-6)  # plain AdamW


def test_adamc_mask_can_include_the_output_head():
    schedule = optim.wsd_schedule(0.5, 20, warmup=4, decay=8, shape="linear")
    t = 15
    lr = float(schedule(t))
    new = _decay_factors((), schedule, t)  # exclude nothing
    assert new["lm_head"] / 2.0 == pytest.approx(1.0 - 0.3 * lr * lr / 0.5, rel=1e-6)


def test_a_mask_given_as_a_plain_string_is_an_error():
    with pytest.raises(optim.OptimizerConfigError, match=r"mask='norm' is a string.*\('norm',\)"):
        tx = optim.adamw(1e-3, weight_decay=0.1, mask="norm")
        tx.update(_params(), tx.init(_params()), _params())
