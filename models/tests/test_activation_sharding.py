"""Activations follow the axis mapping (batch split) under FSDP, on 8 fake CPU devices.

FSDP shards the parameters along `embed` over the same devices that split the batch. Without
sharding constraints on the activations, XLA's propagation may follow the weights and keep
every layer's activations whole on each device; the model pins them by name instead.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import jax  # noqa: E402
import model_testing as T  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import meltemi.haliax as hax  # noqa: E402
import meltemi.models as mm  # noqa: E402
from meltemi.haliax import partitioning  # noqa: E402

# Sizes the 8-way mesh divides where it must (hidden, batch), odd elsewhere; the sequence is
# long enough that activations (attention scores above all) outweigh the parameters.
CONFIG = mm.get_preset("tiny-llama").replace(
    hidden_dim=40, num_heads=5, num_kv_heads=1, head_dim=8, intermediate_dim=56
)
PARAMETER_MAPPING = {"batch": "data", "embed": "data"}  # FSDP storage
COMPUTE_MAPPING = {"batch": "data"}  # activations: batch split, embed whole
TOKENS = np.random.default_rng(3).integers(0, CONFIG.vocab_size, (32, 61)).astype(np.int32)


def _loss(model, tokens):
    return model.loss(tokens, z_loss=1e-4)


@pytest.fixture(scope="module")
def model():
    return T.random_model(CONFIG, seed=5)


@pytest.fixture(scope="module")
def mesh():
    return partitioning.make_mesh({"data": 8})


def _fsdp_grad(model, mesh):
    """The jitted FSDP gradient, its sharded inputs, and the mapping active while tracing."""
    params = hax.shard(model, PARAMETER_MAPPING, mesh)
    tokens = jax.device_put(TOKENS, jax.NamedSharding(mesh, jax.P("data")))
    return jax.jit(jax.value_and_grad(_loss)), params, tokens


def test_fsdp_activations_stay_batch_sharded(model, mesh):
    single = jax.jit(jax.value_and_grad(_loss)).lower(model, TOKENS).compile()
    single_temp = single.memory_analysis().temp_size_in_bytes
    grad, params, tokens = _fsdp_grad(model, mesh)
    with jax.set_mesh(mesh), hax.axis_mapping(COMPUTE_MAPPING):
        compiled = grad.lower(params, tokens).compile()
    fsdp_temp = compiled.memory_analysis().temp_size_in_bytes
    # Each device holds 1/8 of the batch, so its activations are ~1/8 of one device's
    # (plus gathered weights). Without the constraints XLA keeps the whole batch on every
    # device here and this ratio is about 1.
    assert fsdp_temp < single_temp / 4, (fsdp_temp, single_temp)


def test_fsdp_loss_and_gradients_match_one_device(model, mesh):
    expected_loss, expected_grads = jax.jit(jax.value_and_grad(_loss))(model, TOKENS)
    grad, params, tokens = _fsdp_grad(model, mesh)
    with jax.set_mesh(mesh), hax.axis_mapping(COMPUTE_MAPPING):
        loss, grads = grad(params, tokens)
    np.testing.assert_allclose(float(loss), float(expected_loss), rtol=1e-5)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)


def _jaxpr(model):
    # A new function each time: jit's trace cache does not key on the thread-local mapping.
    return str(jax.make_jaxpr(lambda m, t: _loss(m, t))(model, TOKENS))


def test_a_mesh_without_an_axis_mapping_adds_no_sharding_constraint(model, mesh):
    # A mesh alone (no `hax.axis_mapping`) must not pin activations to "replicated".
    with jax.set_mesh(mesh):
        assert "sharding_constraint" not in _jaxpr(model)


def test_an_axis_mapping_adds_sharding_constraints(model, mesh):
    with jax.set_mesh(mesh), hax.axis_mapping(COMPUTE_MAPPING):
        assert "sharding_constraint" in _jaxpr(model)
