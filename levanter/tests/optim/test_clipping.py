"""Global-norm clipping (optax's, recording the norm) and rolling update-norm clipping."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from meltemi.levanter import optim


def _tree(scale):
    return {"a": jnp.full((3, 5), scale), "b": jnp.full((7,), -scale)}


def _norm(tree):
    return float(optax.tree_utils.tree_norm(tree))


def test_clip_by_global_norm_matches_optax_and_records_the_norm():
    g = {"a": jnp.arange(15.0).reshape(3, 5), "b": -jnp.arange(7.0)}
    tx = optim.clip_by_global_norm(2.5)
    ours, state = tx.update(g, tx.init(g))
    ref, _ = optax.clip_by_global_norm(2.5).update(g, optax.EmptyState())
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(ref), strict=True):
        np.testing.assert_array_equal(a, b)
    m = optim.metrics(state)
    assert float(m["grad_clip_norm"]) == pytest.approx(_norm(g), rel=1e-6)
    assert float(m["grad_clip_threshold"]) == 2.5 and float(m["grad_clipped"]) == 1.0


def test_clip_by_global_norm_follows_a_threshold_schedule():
    tx = optim.clip_by_global_norm(optim.step_schedule([(0, 1.0), (2, 0.2)]))
    state = tx.init(None)
    norms = []
    for _ in range(3):
        u, state = tx.update(_tree(1.0), state)
        norms.append(_norm(u))
    np.testing.assert_allclose(norms, [1.0, 1.0, 0.2], rtol=1e-6)


def test_scheduled_threshold_clips_bfloat16_gradients_in_their_dtype():
    tx = optim.clip_by_global_norm(optim.step_schedule([(0, 0.5)]))
    g = {"a": jnp.full((3, 5), 1.0, jnp.bfloat16)}
    u, _ = tx.update(g, tx.init(None))
    assert u["a"].dtype == jnp.bfloat16
    assert _norm(jax.tree.map(lambda x: x.astype(jnp.float32), u)) == pytest.approx(0.5, rel=1e-2)


def test_update_clipping_scales_exactly_to_the_threshold():
    tx = optim.clip_update_norm(window=5, sigma=2.0, warmup=3)
    state = tx.init(None)
    history = [1.0, 2.0, 4.0]
    for n in history:
        u, state = tx.update({"w": jnp.array([n])}, state)
        assert not bool(state.clipped) and float(u["w"][0]) == n  # warmup: untouched
    threshold = np.mean(history) + 2.0 * np.std(history)
    u, state = tx.update(_tree(10.0), state)
    assert bool(state.clipped)
    assert _norm(u) == pytest.approx(threshold, rel=1e-5)
    assert float(state.threshold) == pytest.approx(threshold, rel=1e-6)


def test_update_clipping_records_the_unclipped_norm():
    tx = optim.clip_update_norm(window=4, sigma=0.0, warmup=2)
    state = tx.init(None)
    for n in (1.0, 1.0, 9.0):
        _, state = tx.update({"w": jnp.array([n])}, state)
    assert bool(state.clipped)
    np.testing.assert_array_equal(state.history.values[:3], [1.0, 1.0, 9.0])
    assert float(optim.metrics(state)["update_clip_norm"]) == 9.0


def test_update_clipping_leaves_small_updates_untouched():
    tx = optim.clip_update_norm(window=4, sigma=1.0, warmup=2)
    state = tx.init(None)
    for n in (3.0, 5.0):
        _, state = tx.update({"w": jnp.array([n])}, state)
    u, state = tx.update({"w": jnp.array([4.5])}, state)
    assert float(u["w"][0]) == 4.5 and not bool(state.clipped)


def test_update_clipping_does_not_record_a_nan_norm():
    tx = optim.clip_update_norm(window=4, sigma=1.0, warmup=2)
    state = tx.init(None)
    _, state = tx.update({"w": jnp.array([2.0])}, state)
    _, state = tx.update({"w": jnp.array([jnp.nan])}, state)
    assert int(state.history.count) == 1 and bool(jnp.all(jnp.isfinite(state.history.values)))


def test_update_clipping_window_keeps_only_the_latest_norms():
    tx = optim.clip_update_norm(window=2, sigma=0.0, warmup=2)
    state = tx.init(None)
    norms = [100.0, 1.0, 3.0, 5.0]
    for i, n in enumerate(norms):
        u, state = tx.update({"w": jnp.array([n])}, state)
        if i >= 2:  # checked against the window of the two norms before it (sigma 0: the mean)
            assert float(state.threshold) == pytest.approx(np.mean(norms[i - 2 : i]))
    # The third norm (3) was checked against (100, 1): 50.5. By the fourth, 100 has left the
    # window, so 5 is checked against (1, 3) and clipped to their mean.
    assert float(u["w"][0]) == pytest.approx(2.0) and bool(state.clipped)


def test_update_clipping_rejects_a_window_of_one():
    with pytest.raises(optim.OptimizerConfigError, match="window=1 must be an int >= 2"):
        optim.clip_update_norm(window=1)


def test_clip_by_global_norm_rejects_a_non_positive_threshold():
    with pytest.raises(optim.OptimizerConfigError, match="max_norm=0.0 must be > 0"):
        optim.clip_by_global_norm(0.0)
