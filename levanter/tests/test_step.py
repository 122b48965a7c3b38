"""The jitted train step: no recompilation, donation, accumulation, mixed precision, metrics.

The step runs the optimizer the trainer builds (`optim.build_optimizer`, with its metrics), so
the tests see what a run logs.
"""

import _tiny
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meltemi.levanter import optim
from meltemi.levanter.trainer import init_state, make_train_step

OPTIMIZER = {"learning_rate": 0.01, "total_steps": 20, "warmup": 0, "lr_schedule": "constant"}
# Skip-step and update clipping on, with short windows, so a few steps arm them.
GUARDED = {
    **OPTIMIZER, "skip_step_window": 4, "skip_step_warmup": 2, "update_clip_window": 4,
    "update_clip_warmup": 2, "max_grad_norm": 1.0,
}  # fmt: skip


def _scaled_loss(model, batch):
    # A per-row multiplier on the loss: 1 for ordinary steps, 1000 for a spike.
    return _tiny.loss_fn(model, batch) * jnp.mean(batch["scale"])


def _setup(microbatches=1, compute_dtype=jnp.float32, config=OPTIMIZER, loss_fn=_tiny.loss_fn):
    model = _tiny.TinyLM.init(jax.random.key(3))
    params, static = eqx.partition(model, eqx.is_array)
    opt, _ = optim.build_optimizer(config)
    step = make_train_step(
        loss_fn, opt, static, microbatches=microbatches, compute_dtype=compute_dtype,
        metrics_fn=optim.metrics,
    )  # fmt: skip
    return step, init_state(params, opt), static


def _batch(rows=6, first=0):
    return {
        k: jnp.asarray(v)
        for k, v in _tiny.Counting().sequences(np.arange(first, first + rows)).items()
    }


def test_second_step_does_not_recompile():
    step, state, _ = _setup()
    for i in range(3):
        state, _ = step(state, _batch(first=6 * i))
    assert step._cache_size() == 1


def test_state_buffers_are_donated():
    step, state, _ = _setup()
    old = state.params.embed.array
    state, _ = step(state, _batch())
    assert old.is_deleted()


def test_gradient_accumulation_matches_one_big_batch():
    step1, state1, _ = _setup(microbatches=1)
    step3, state3, _ = _setup(microbatches=3)
    batch = _batch()  # rows carry different loss-token counts
    state1, m1 = step1(state1, batch)
    state3, m3 = step3(state3, batch)
    np.testing.assert_allclose(m1["train/loss"], m3["train/loss"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m1["optim/grad_norm"], m3["optim/grad_norm"], rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(state1.params), jax.tree.leaves(state3.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_bf16_compute_keeps_f32_parameters_and_optimizer_state():
    step, state, _ = _setup(compute_dtype=jnp.bfloat16)
    state, metrics = step(state, _batch())
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))
    moments = [x for x in jax.tree.leaves(state.opt_state) if x.shape[:1] in ((6,), (10,), (11,))]
    assert moments and all(x.dtype == jnp.float32 for x in moments)
    assert np.isfinite(float(metrics["train/loss"]))


def test_bf16_loss_is_close_to_f32_loss():
    step32, s32, _ = _setup()
    step16, s16, _ = _setup(compute_dtype=jnp.bfloat16)
    _, m32 = step32(s32, _batch())
    _, m16 = step16(s16, _batch())
    assert float(m16["train/loss"]) == pytest.approx(float(m32["train/loss"]), rel=2e-2)


def test_metrics_hold_loss_norms_and_skip_flag():
    step, state, _ = _setup()
    _, metrics = step(state, _batch())
    assert {"train/loss", "optim/grad_norm", "optim/update_norm", "optim/skipped"} <= set(metrics)
    assert float(metrics["optim/skipped"]) == 0.0


def _scaled_batch(first, scale):
    batch = _batch(first=first)
    return {**batch, "scale": jnp.full((6,), scale, jnp.float32)}


def _reference_grad_norm(static, params, batch):
    grads = jax.grad(lambda p: _scaled_loss(eqx.combine(p, static), batch))(params)
    return float(jnp.sqrt(sum(jnp.sum(g.astype(jnp.float32) ** 2) for g in jax.tree.leaves(grads))))


def test_a_skipped_step_logs_its_own_grad_norm_and_a_zero_update():
    step, state, static = _setup(config=GUARDED, loss_fn=_scaled_loss)
    for i in range(3):
        state, metrics = step(state, _scaled_batch(6 * i, 1.0))
        assert float(metrics["optim/skipped"]) == 0.0
    batch = _scaled_batch(18, 1000.0)
    params_before = jax.tree.map(jnp.copy, state.params)
    expected = _reference_grad_norm(static, params_before, batch)
    state, metrics = step(state, batch)
    assert float(metrics["optim/skipped"]) == 1.0
    assert float(metrics["optim/grad_norm"]) == pytest.approx(expected, rel=1e-5)
    assert float(metrics["optim/update_norm"]) == 0.0
    # The clip's own (frozen) norm is still logged, under its own name.
    assert float(metrics["optim/grad_clip_norm"]) < expected / 100
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params_before), strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_applied_step_logs_the_norm_of_the_change_it_made():
    step, state, static = _setup(config=GUARDED, loss_fn=_scaled_loss)
    batch = _scaled_batch(0, 1.0)
    params_before = jax.tree.map(jnp.copy, state.params)
    expected = _reference_grad_norm(static, params_before, batch)
    state, metrics = step(state, batch)
    change = jax.tree.map(lambda a, b: a - b, state.params, params_before)
    change_norm = float(jnp.sqrt(sum(jnp.sum(c**2) for c in jax.tree.leaves(change))))
    assert float(metrics["optim/grad_norm"]) == pytest.approx(expected, rel=1e-5)
    assert float(metrics["optim/update_norm"]) == pytest.approx(change_norm, rel=1e-4)


def test_peak_flops_are_measured_once_per_device_and_remembered():
    from meltemi.levanter.trainer import measure_peak_flops

    first = measure_peak_flops(size=256)
    assert first > 0
    # A second measurement would differ in the last bits; the remembered one is identical.
    assert measure_peak_flops(size=256) == first
    assert measure_peak_flops(jax.devices()[0], size=256) == first
