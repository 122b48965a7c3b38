"""skip_step: zero update and bit-identical inner state on a skipped step, never NaN-poisoned."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from meltemi.levanter import optim


def _params():
    return {"w": jnp.linspace(-1.0, 1.0, 15).reshape(3, 5), "b": jnp.ones((7,))}


def _grad(scale, seed=0):
    return jax.tree.map(
        lambda p: scale * jax.random.normal(jax.random.key(seed), p.shape), _params()
    )


def _tx(**kw):
    inner = optax.chain(optim.clip_by_global_norm(10.0), optim.adamw(1e-2, weight_decay=0.1))
    return optim.skip_step(inner, window=5, sigma=2.0, warmup=3, **kw)


def _warm(tx, steps=4):
    params, state = _params(), tx.init(_params())
    for t in range(steps):
        u, state = tx.update(_grad(1.0, t), state, params, loss=jnp.float32(2.0 + 0.1 * (t % 2)))
        params = optax.apply_updates(params, u)
    assert int(state.num_skipped) == 0
    return params, state


def _assert_bit_identical(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb, strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_loss_spike_is_skipped_with_inner_state_bit_identical():
    tx = _tx(schedule="applied")
    params, state = _warm(tx)
    updates, new = tx.update(_grad(1.0, 9), state, params, loss=jnp.float32(50.0))
    assert bool(new.skipped) and optim.skip_reasons(int(new.reason)) == ["loss_spike"]
    _assert_bit_identical(new.inner_state, state.inner_state)
    assert all(bool(jnp.all(u == 0)) for u in jax.tree.leaves(updates))


def test_grad_norm_spike_is_skipped():
    tx = _tx(schedule="applied")
    params, state = _warm(tx)
    _, new = tx.update(_grad(1000.0, 9), state, params, loss=jnp.float32(2.05))
    assert optim.skip_reasons(int(new.reason)) == ["grad_norm_spike"]
    _assert_bit_identical(new.inner_state, state.inner_state)


@pytest.mark.parametrize(
    ("grad_scale", "loss", "reasons"),
    [
        (jnp.nan, 2.0, ["grad_norm_not_finite"]),
        (1.0, jnp.inf, ["loss_not_finite"]),
        (jnp.nan, jnp.nan, ["loss_not_finite", "grad_norm_not_finite"]),
    ],
)
def test_non_finite_step_is_skipped_without_poisoning_the_state(grad_scale, loss, reasons):
    tx = _tx(schedule="applied")
    params, state = _warm(tx, steps=1)  # before warmup: non-finite is still skipped
    updates, new = tx.update(_grad(grad_scale, 9), state, params, loss=jnp.float32(loss))
    assert optim.skip_reasons(int(new.reason)) == reasons
    _assert_bit_identical(new.inner_state, state.inner_state)
    for history in (new.loss_history, new.grad_norm_history):  # only finite values recorded
        assert bool(jnp.all(jnp.isfinite(history.values)))
    assert all(bool(jnp.all(u == 0)) for u in jax.tree.leaves(updates))


def test_a_skipped_nan_step_leaves_the_run_as_if_it_never_happened():
    tx = _tx(schedule="applied")  # with "step" (default), only the schedule counters move on
    params, state = _warm(tx)
    _, skipped = tx.update(_grad(jnp.nan, 9), state, params, loss=jnp.float32(2.0))
    after_skip, s1 = tx.update(_grad(1.0, 10), skipped, params, loss=jnp.float32(2.1))
    direct, s2 = tx.update(_grad(1.0, 10), state, params, loss=jnp.float32(2.1))
    _assert_bit_identical(after_skip, direct)
    _assert_bit_identical(s1.inner_state, s2.inner_state)


def test_normal_step_is_applied_and_recorded():
    tx = _tx()
    params, state = _warm(tx)
    inner = optax.chain(optim.clip_by_global_norm(10.0), optim.adamw(1e-2, weight_decay=0.1))
    expected, _ = inner.update(_grad(1.0, 9), state.inner_state, params)
    updates, new = tx.update(_grad(1.0, 9), state, params, loss=jnp.float32(2.05))
    assert not bool(new.skipped) and int(new.reason) == 0
    _assert_bit_identical(updates, expected)
    assert int(new.loss_history.count) == 5 and int(new.num_skipped) == 0


def test_missing_loss_is_an_error_naming_the_fix():
    tx = _tx()
    with pytest.raises(ValueError, match=r"loss=loss"):
        tx.update(_grad(1.0), tx.init(_params()), _params())


def test_without_loss_only_the_grad_norm_is_checked():
    tx = _tx(use_loss=False)
    params, state = _params(), tx.init(_params())
    _, state = tx.update(_grad(jnp.nan), state, params)
    assert optim.skip_reasons(int(state.reason)) == ["grad_norm_not_finite"]


def test_skip_metrics_are_reported():
    tx = _tx()
    params, state = _warm(tx)
    _, new = tx.update(_grad(1.0, 9), state, params, loss=jnp.float32(50.0))
    m = optim.metrics(new)
    assert float(m["skip/skipped"]) == 1.0 and int(m["skip/reason"]) == 4
    assert float(m["skip/loss"]) == 50.0 and int(m["skip/num_skipped"]) == 1
    assert np.isfinite(float(m["skip/loss_threshold"]))


def _run_with_skips(schedule_mode, skipped=(3, 4, 5), steps=10):
    lr = optim.linear_schedule(1.0, steps)  # 1 - t / 10
    inner = optax.chain(
        optim.clip_by_global_norm(optim.step_schedule([(0, 100.0), (5, 50.0)])),
        optim.adamw(lr, weight_decay=0.1, adamc="always"),
    )
    tx = optim.skip_step(inner, window=4, warmup=2, schedule=schedule_mode)
    params, state = _params(), tx.init(_params())
    for t in range(steps):
        loss = jnp.float32(jnp.nan if t in skipped else 2.0)
        _, state = tx.update(_grad(1.0, t), state, params, loss=loss)
        assert bool(state.skipped) == (t in skipped)
    return optim.metrics(state)


def test_by_default_a_skipped_step_spends_its_schedule_slot():
    m = _run_with_skips("step")  # 3 of 10 steps skipped; the last, step 9, was applied
    assert float(m["learning_rate"]) == pytest.approx(1.0 - 9 / 10)
    assert float(m["weight_decay"]) == pytest.approx(0.1 * (1.0 - 9 / 10), rel=1e-6)
    assert float(m["grad_clip_threshold"]) == 50.0


def test_schedule_applied_counts_only_applied_steps():
    m = _run_with_skips("applied")  # step 9 is the 7th applied update: schedule(6)
    assert float(m["learning_rate"]) == pytest.approx(1.0 - 6 / 10)
    assert float(m["grad_clip_threshold"]) == 50.0  # 6 >= 5


def test_a_skip_leaves_adam_moments_and_bias_correction_count_alone():
    tx = _tx()
    params, state = _warm(tx)
    _, new = tx.update(_grad(jnp.nan, 9), state, params, loss=jnp.float32(2.0))
    adam_old = [s for s in jax.tree.leaves(state.inner_state, is_leaf=_is_adam) if _is_adam(s)]
    adam_new = [s for s in jax.tree.leaves(new.inner_state, is_leaf=_is_adam) if _is_adam(s)]
    _assert_bit_identical(adam_new, adam_old)


def _is_adam(x):
    return isinstance(x, optax.ScaleByAdamState)


def test_unknown_schedule_mode_is_an_error():
    with pytest.raises(optim.OptimizerConfigError, match=r"schedule='trainer' is not one of"):
        optim.skip_step(optax.sgd(0.1), schedule="trainer")
