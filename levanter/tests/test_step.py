"""The jitted train step: no recompilation, donation, accumulation, mixed precision."""

import _tiny
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from meltemi.levanter.trainer import init_state, make_train_step


def _setup(microbatches=1, compute_dtype=jnp.float32):
    model = _tiny.TinyLM.init(jax.random.key(3))
    params, static = eqx.partition(model, eqx.is_array)
    opt = optax.adam(0.01)
    step = make_train_step(
        _tiny.loss_fn, opt, static, microbatches=microbatches, compute_dtype=compute_dtype
    )
    return step, init_state(params, opt)


def _batch(rows=6, first=0):
    return {
        k: jnp.asarray(v)
        for k, v in _tiny.Counting().sequences(np.arange(first, first + rows)).items()
    }


def test_second_step_does_not_recompile():
    step, state = _setup()
    for i in range(3):
        state, _ = step(state, _batch(first=6 * i))
    assert step._cache_size() == 1


def test_state_buffers_are_donated():
    step, state = _setup()
    old = state.params.embed.array
    state, _ = step(state, _batch())
    assert old.is_deleted()


def test_gradient_accumulation_matches_one_big_batch():
    step1, state1 = _setup(microbatches=1)
    step3, state3 = _setup(microbatches=3)
    batch = _batch()  # rows carry different loss-token counts
    state1, m1 = step1(state1, batch)
    state3, m3 = step3(state3, batch)
    np.testing.assert_allclose(m1["train/loss"], m3["train/loss"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m1["optim/grad_norm"], m3["optim/grad_norm"], rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(state1.params), jax.tree.leaves(state3.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_bf16_compute_keeps_f32_parameters_and_optimizer_state():
    step, state = _setup(compute_dtype=jnp.bfloat16)
    state, metrics = step(state, _batch())
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.opt_state.__getitem__(0).mu))
    assert np.isfinite(float(metrics["train/loss"]))


def test_bf16_loss_is_close_to_f32_loss():
    step32, s32 = _setup()
    step16, s16 = _setup(compute_dtype=jnp.bfloat16)
    _, m32 = step32(s32, _batch())
    _, m16 = step16(s16, _batch())
    assert float(m16["train/loss"]) == pytest.approx(float(m32["train/loss"]), rel=2e-2)


def test_metrics_hold_loss_norms_and_skip_flag():
    step, state = _setup()
    _, metrics = step(state, _batch())
    assert {"train/loss", "optim/grad_norm", "optim/update_norm", "optim/skipped"} <= set(metrics)
    assert float(metrics["optim/skipped"]) == 0.0
