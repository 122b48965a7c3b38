"""Muon: Newton-Schulz orthogonality, the AdamW fallback, and named (stacked Layers) axes."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from meltemi.levanter import optim

try:  # the real haliax NamedArray; a duck-typed stand-in when haliax is not importable
    import meltemi.haliax as hax

    def named(array, names):
        return hax.named(array, names)

except (ImportError, AttributeError):  # pragma: no cover - only before haliax lands

    @dataclasses.dataclass(frozen=True)
    class _Axis:
        name: str
        size: int

    @jax.tree_util.register_pytree_node_class
    class _Named:
        def __init__(self, array, axes):
            self.array, self.axes = array, tuple(axes)

        def tree_flatten(self):
            return (self.array,), self.axes

        @classmethod
        def tree_unflatten(cls, axes, children):
            return cls(children[0], axes)

    def named(array, names):
        return _Named(array, [_Axis(n, s) for n, s in zip(names, array.shape, strict=True)])


CUBIC = (1.5, -0.5, 0.0)  # converges to the exact polar factor


def _polar(x):
    u, _, vt = jnp.linalg.svd(x, full_matrices=False)
    return u @ vt


@pytest.mark.parametrize("shape", [(3, 5), (7, 3), (2, 5, 3)])
def test_newton_schulz_converges_to_the_polar_factor(shape):
    x = jax.random.normal(jax.random.key(0), shape)
    o = optim.newton_schulz(x, steps=40, coeffs=CUBIC)
    np.testing.assert_allclose(o, _polar(x), atol=1e-4)


@pytest.mark.parametrize("shape", [(5, 9), (9, 5)])
def test_default_quintic_keeps_singular_vectors_and_bounds_singular_values(shape):
    k = min(shape)
    u, _ = jnp.linalg.qr(jax.random.normal(jax.random.key(1), (shape[0], k)))
    v, _ = jnp.linalg.qr(jax.random.normal(jax.random.key(2), (shape[1], k)))
    x = u @ jnp.diag(jnp.geomspace(0.1, 1.0, k)) @ v.T  # condition number 10
    d = u.T @ optim.newton_schulz(x) @ v
    off_diagonal = d - jnp.diag(jnp.diag(d))
    assert float(jnp.abs(off_diagonal).max()) < 1e-4
    assert bool(jnp.all((jnp.diag(d) > 0.6) & (jnp.diag(d) < 1.25)))


def test_muon_first_update_is_the_scaled_orthogonalised_gradient():
    g = jax.random.normal(jax.random.key(3), (7, 3))
    tx = optim.muon(0.02, ns_steps=40, ns_coeffs=CUBIC)
    params = {"w": jnp.zeros((7, 3))}
    u, _ = tx.update({"w": g}, tx.init(params), params)
    expected = -0.02 * np.sqrt(7 / 3) * _polar(g)  # spectral scale sqrt(max(1, rows/cols))
    np.testing.assert_allclose(u["w"], expected, atol=1e-5)


def test_muon_routes_non_matrices_and_embeddings_to_adamw():
    params = {"embed": jnp.ones((11, 3)), "w": jnp.ones((3, 5)), "norm": jnp.ones(3),
              "lm_head": jnp.ones((3, 11)), "conv": jnp.ones((2, 3, 5))}  # fmt: skip
    assert optim.muon_labels(params) == {
        "embed": "adam", "w": "muon", "norm": "adam", "lm_head": "adam", "conv": "adam",
    }  # fmt: skip
    tx = optim.muon(0.02, adam_learning_rate=1e-3, ns_steps=40, ns_coeffs=CUBIC)
    grads = jax.tree.map(lambda p: jnp.full(p.shape, 0.5), params)
    u, _ = tx.update(grads, tx.init(params), params)
    ref, _ = optim.adamw(1e-3).update(
        {"norm": grads["norm"]}, optim.adamw(1e-3).init({"norm": params["norm"]}),
        {"norm": params["norm"]},
    )  # fmt: skip
    np.testing.assert_allclose(u["norm"], ref["norm"], rtol=1e-6)


def test_stacked_layers_axis_is_a_batch_axis():
    layers, embed, mlp = 3, 5, 7
    g = jax.random.normal(jax.random.key(4), (embed, layers, mlp))
    w = named(g, ("embed", "layers", "mlp"))  # Layers in the middle: order must not matter
    assert optim.muon_matrix_dims(w) == optim.MatrixDims((1,), (0,), (2,))
    tx = optim.muon(1.0, ns_steps=40, ns_coeffs=CUBIC, scale="none")
    params = {"w": named(jnp.zeros_like(g), ("embed", "layers", "mlp"))}
    u, _ = tx.update({"w": w}, tx.init(params), params)
    assert optim.is_named_array(u["w"]) and tuple(a.name for a in u["w"].axes) == (
        "embed", "layers", "mlp",
    )  # fmt: skip
    for i in range(layers):
        np.testing.assert_allclose(u["w"].array[:, i, :], -_polar(g[:, i, :]), atol=1e-4)


def test_named_array_without_two_matrix_axes_falls_back_to_adamw():
    qkv = named(jnp.ones((3, 2, 5)), ("heads", "head_size", "embed"))
    scale = named(jnp.ones((3, 5)), ("layers", "embed"))
    assert optim.muon_labels({"qkv": qkv, "scale": scale}) == {"qkv": "adam", "scale": "adam"}


def test_matrix_dims_override_flattens_heads_and_head_size():
    x = jax.random.normal(jax.random.key(5), (3, 2, 5))
    dims = optim.MatrixDims((), (0, 1), (2,))
    o = optim.orthogonalize(x, dims, steps=40, coeffs=CUBIC, scale="none")
    np.testing.assert_allclose(o.reshape(6, 5), _polar(x.reshape(6, 5)), atol=1e-4)


def test_scale_by_muon_rejects_a_vector_with_a_fix():
    tx = optim.scale_by_muon()
    with pytest.raises(optim.OptimizerConfigError, match=r"not a matrix \(shape \(5,\).*muon\("):
        tx.update({"b": jnp.ones(5)}, tx.init({"b": jnp.ones(5)}))


def test_muon_decays_matrices_with_decoupled_weight_decay():
    params = {"w": jnp.full((3, 5), 2.0)}
    tx = optim.muon(0.1, weight_decay=0.5, ns_steps=40, ns_coeffs=CUBIC, scale="none")
    g = {"w": jax.random.normal(jax.random.key(6), (3, 5))}
    u, _ = tx.update(g, tx.init(params), params)
    expected = -0.1 * (_polar(g["w"]) + 0.5 * params["w"])
    np.testing.assert_allclose(u["w"], expected, atol=1e-5)
    assert isinstance(optax.apply_updates(params, u)["w"], jax.Array)
