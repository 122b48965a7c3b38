"""EMA of the parameters as the last transform of a chain."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from meltemi.levanter import optim


def test_ema_follows_the_updated_params():
    beta = 0.9
    tx = optax.chain(optax.sgd(0.5), optim.ema_params(beta))
    params = {"w": jnp.linspace(0.0, 1.0, 7)}
    state = tx.init(params)
    expected = np.asarray(params["w"])
    for t in range(3):
        g = {"w": jnp.full((7,), float(t + 1))}
        updates, state = tx.update(g, state, params)
        params = optax.apply_updates(params, updates)
        expected = beta * expected + (1 - beta) * np.asarray(params["w"])
    np.testing.assert_allclose(optim.ema_of(state)["w"], expected, rtol=1e-6)


def test_ema_passes_updates_through_unchanged():
    tx = optim.ema_params(0.5)
    params = {"w": jnp.ones(3)}
    updates, _ = tx.update({"w": jnp.arange(3.0)}, tx.init(params), params)
    np.testing.assert_array_equal(updates["w"], jnp.arange(3.0))


def test_ema_is_left_alone_on_a_skipped_step():
    tx = optim.skip_step(optax.chain(optax.sgd(0.5), optim.ema_params(0.9)), window=3)
    params = {"w": jnp.ones(3)}
    state = tx.init(params)
    _, state = tx.update({"w": jnp.full(3, jnp.nan)}, state, params, loss=jnp.float32(1.0))
    np.testing.assert_array_equal(optim.ema_of(state)["w"], params["w"])


def test_ema_state_is_a_copy_of_the_params_not_an_alias():
    params = {"w": jnp.ones(3)}
    state = optim.ema_params(0.9).init(params)
    assert state.ema["w"] is not params["w"]
    jax.jit(lambda p: p, donate_argnums=0)(params)  # donating params must not delete the EMA
    assert float(state.ema["w"].sum()) == 3.0


def test_ema_of_without_an_ema_state_says_how_to_add_one():
    state = optax.sgd(0.1).init({"w": jnp.ones(3)})
    with pytest.raises(ValueError, match=r"add ema_params\(beta\)"):
        optim.ema_of(state)


def test_ema_beta_out_of_range_is_an_error():
    with pytest.raises(optim.OptimizerConfigError, match="beta=1.0 must be in"):
        optim.ema_params(1.0)
