"""Muon: optax's Newton-Schulz on input x output axes by name, the AdamW fallback, stacked axes."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import meltemi.haliax as hax
import meltemi.models as mm
from meltemi.levanter import optim

CUBIC = (1.5, -0.5, 0.0)  # converges to the exact polar factor
EXACT = dict(ns_steps=40, ns_coeffs=CUBIC)


def _polar(x):
    u, _, vt = jnp.linalg.svd(x, full_matrices=False)
    return u @ vt


def _tiny_llama_params():
    model = mm.init(mm.get_preset("tiny-llama"), key=jax.random.key(0))
    return eqx.partition(model, eqx.is_array)[0]


def test_first_update_is_the_orthogonalised_gradient_scaled_by_fan_out_over_fan_in():
    # x @ W: a (7 in, 3 out) matrix has fan_out / fan_in < 1 (scale 1), its transpose sqrt(7/3).
    g = jax.random.normal(jax.random.key(3), (7, 3))
    tx = optim.muon(0.02, adam_learning_rate=1e-3, **EXACT)
    params = {"w": jnp.zeros((7, 3)), "w_t": jnp.zeros((3, 7))}
    u, _ = tx.update({"w": g, "w_t": g.T}, tx.init(params), params)
    np.testing.assert_allclose(u["w"], -0.02 * _polar(g), atol=1e-5)
    np.testing.assert_allclose(u["w_t"], -0.02 * np.sqrt(7 / 3) * _polar(g.T), atol=1e-5)


def test_matrices_follow_optax_contrib_muon_over_several_steps():
    params = {
        "a": jax.random.normal(jax.random.key(1), (5, 9)),
        "b": jax.random.normal(jax.random.key(2), (9, 5)),
    }
    ours = optim.muon(0.02, adam_learning_rate=1e-3, beta=0.9)
    ref = optax.contrib.muon(0.02, beta=0.9, adam_learning_rate=1e-3)
    p1, s1, p2, s2 = params, ours.init(params), params, ref.init(params)
    for t in range(4):
        g = jax.tree.map(lambda p, k=t + 1.0: jnp.sin(p * k), params)
        u1, s1 = ours.update(g, s1, p1)
        u2, s2 = ref.update(g, s2, p2)
        p1, p2 = optax.apply_updates(p1, u1), optax.apply_updates(p2, u2)
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_every_attention_and_mlp_weight_of_a_model_gets_muon():
    labels = optim.muon_labels(_tiny_llama_params())
    flat = {
        jax.tree_util.keystr(p, simple=True, separator="/"): v
        for p, v in jax.tree_util.tree_leaves_with_path(labels)
    }
    muon = sorted(k.split("/")[-2] for k, v in flat.items() if v == "muon")
    assert muon == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    assert flat["embed/weight"] == flat["lm_head/weight"] == "adam"
    assert flat["final_norm/weight"] == flat["blocks/stacked/attn_norm/weight"] == "adam"


def test_attention_projection_is_orthogonalised_as_inputs_by_outputs_per_layer():
    params = _tiny_llama_params()
    q = (
        params.blocks.stacked.attn.q_proj.weight
    )  # layers, kv_heads, q_heads_per_group, head_size, embed
    assert [a.name for a in q.axes][0] == "layers" and q.axes[-1].name == "embed"
    grads = jax.tree.map(lambda p: jnp.cos(3.0 * p + 1.0), params)
    tx = optim.muon(1.0, adam_learning_rate=1e-3, scale="none", **EXACT)
    u, _ = tx.update(grads, tx.init(params), params)
    g, out = grads.blocks.stacked.attn.q_proj.weight.array, u.blocks.stacked.attn.q_proj.weight
    assert [a.name for a in out.axes] == [a.name for a in q.axes]
    for layer in range(g.shape[0]):
        matrix = g[layer].reshape(-1, g.shape[-1]).T  # [embed, heads * head_size]
        expected = -_polar(matrix).T.reshape(g.shape[1:])
        np.testing.assert_allclose(out.array[layer], expected, atol=1e-4)


def test_stacked_layers_axis_is_a_batch_axis_wherever_it_sits():
    layers, embed, mlp = 3, 5, 7
    g = jax.random.normal(jax.random.key(4), (embed, layers, mlp))
    w = hax.named(g, ("embed", "layers", "mlp"))
    assert optim.muon_dimension_numbers({"w": w})["w"] == optim.MuonDimensionNumbers(0, 2)
    tx = optim.muon(1.0, adam_learning_rate=1e-3, scale="none", **EXACT)
    params = {"w": hax.named(jnp.zeros_like(g), ("embed", "layers", "mlp"))}
    u, _ = tx.update({"w": w}, tx.init(params), params)
    assert optim.is_named_array(u["w"])
    assert tuple(a.name for a in u["w"].axes) == ("embed", "layers", "mlp")
    for i in range(layers):
        np.testing.assert_allclose(u["w"].array[:, i, :], -_polar(g[:, i, :]), atol=1e-4)


def test_named_array_without_two_matrix_axes_falls_back_to_adamw():
    qkv = hax.named(jnp.ones((3, 2, 5)), ("heads", "head_size", "embed"))
    scale = hax.named(jnp.ones((3, 5)), ("layers", "embed"))
    assert optim.muon_labels({"qkv": qkv, "scale": scale}) == {"qkv": "adam", "scale": "adam"}


def test_adamw_fallback_uses_its_own_learning_rate():
    params = {"embed": jnp.ones((11, 3)), "w": jnp.ones((3, 5)), "norm": jnp.ones(3)}
    tx = optim.muon(0.02, adam_learning_rate=1e-3)
    grads = jax.tree.map(lambda p: jnp.full(p.shape, 0.5), params)
    u, _ = tx.update(grads, tx.init(params), params)
    ref_tx = optim.adamw(1e-3)
    sub = {"embed": params["embed"], "norm": params["norm"]}
    ref, _ = ref_tx.update({k: grads[k] for k in sub}, ref_tx.init(sub), sub)
    for k in sub:
        np.testing.assert_allclose(u[k], ref[k], rtol=1e-6)


def test_muon_without_an_adam_learning_rate_is_an_error():
    with pytest.raises(optim.OptimizerConfigError, match=r"adam_learning_rate=None.*3e-4"):
        optim.muon(0.02)


def test_scale_by_muon_rejects_a_vector_with_a_fix():
    tx = optim.scale_by_muon()
    with pytest.raises(optim.OptimizerConfigError, match=r"not a matrix \(shape \(5,\).*muon\("):
        tx.init({"b": jnp.ones(5)})


def test_muon_decays_matrices_with_decoupled_weight_decay():
    params = {"w": jnp.full((3, 5), 2.0)}
    tx = optim.muon(0.1, adam_learning_rate=1e-3, weight_decay=0.5, scale="none", **EXACT)
    g = {"w": jax.random.normal(jax.random.key(6), (3, 5))}
    u, _ = tx.update(g, tx.init(params), params)
    expected = -0.1 * (_polar(g["w"]) + 0.5 * params["w"])
    np.testing.assert_allclose(u["w"], expected, atol=1e-5)
