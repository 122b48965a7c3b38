"""ArrayStacked against a Python loop over the same layers, with gradients and remat."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meltemi.haliax as hax

N = 5  # layers


class Dense(eqx.Module):
    w: jax.Array
    b: jax.Array

    @staticmethod
    def init(*, key):
        k1, k2 = jax.random.split(key)
        return Dense(jax.random.normal(k1, (7, 7)) / 3, jax.random.normal(k2, (7,)))

    def __call__(self, x, scale=1.0):
        return jnp.tanh(x @ self.w + self.b) * scale


def _stack(remat=False):
    return hax.nn.ArrayStacked.init(N, Dense, gradient_checkpointing=remat)(
        key=jax.random.split(jax.random.key(0), N)
    )


def _loop(stack, x, scales=None):
    for i, layer in enumerate(stack.unstacked()):
        x = layer(x, 1.0 if scales is None else scales[i])
    return x


def test_layers_have_a_leading_dimension_and_fold_matches_a_loop():
    stack = _stack()
    assert stack.stacked.w.shape == (N, 7, 7)
    x = jax.random.normal(jax.random.key(1), (3, 7))
    np.testing.assert_allclose(stack.fold(x), _loop(stack, x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stack(x), _loop(stack, x), rtol=1e-5, atol=1e-6)


def test_in_axes_slices_per_layer_arguments():
    stack = _stack()
    x = jax.random.normal(jax.random.key(2), (3, 7))
    scales = jnp.linspace(0.5, 1.5, N)
    out = stack.fold(x, scales, in_axes=0)
    np.testing.assert_allclose(out, _loop(stack, x, scales), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="needs size 5"):
        stack.fold(x, jnp.ones(4), in_axes=0)


def test_scan_collects_per_layer_outputs_and_vmap_via_maps_layers():
    stack = _stack()
    x = jax.random.normal(jax.random.key(3), (3, 7))
    carry, ys = stack.scan_via(lambda m, c: (m(c), jnp.sum(m(c))))(x)
    assert ys.shape == (N,)
    norms = stack.vmap_via(lambda m, x: m(x))(x)
    assert norms.shape == (N, 3, 7)
    np.testing.assert_allclose(norms[2], stack.get_layer(2)(x), rtol=1e-6)


@pytest.mark.parametrize("remat", [False, True, "full"])
def test_gradients_match_the_loop_with_every_checkpointing(remat):
    stack = _stack(remat)
    x = jax.random.normal(jax.random.key(4), (3, 7))
    g = jax.grad(lambda s: jnp.sum(s.fold(x) ** 2))(stack)
    g_ref = jax.grad(lambda s: jnp.sum(_loop(s, x) ** 2))(stack)
    np.testing.assert_allclose(g.stacked.w, g_ref.stacked.w, rtol=1e-4, atol=1e-6)


def test_named_array_modules_are_refused_with_the_alternative():
    with pytest.raises(TypeError, match="hax.nn.Stacked"):
        hax.nn.ArrayStacked.init(2, hax.nn.Linear)(
            hax.Axis("a", 3), hax.Axis("b", 5), key=jax.random.split(jax.random.key(0), 2)
        )
