"""muP reparameterisations of Linear: init scale, activation scale, learning-rate scale."""

import jax
import numpy as np

import meltemi.haliax as hax
from meltemi.haliax.nn import mup

Batch, In, Out = hax.make_axes(batch=3, embed=401, mlp=301)


def _std(layer):
    return float(np.asarray(layer.weight.array).std())


def test_init_scales_follow_the_parameterisation():
    key = jax.random.key(0)
    std_unit = _std(hax.nn.Linear.init(In, Out, key=key, reparam_cls=mup.InputLinearMup))
    std_fan = _std(hax.nn.Linear.init(In, Out, key=key, reparam_cls=mup.HiddenLinearMup))
    std_default = _std(hax.nn.Linear.init(In, Out, key=key))
    np.testing.assert_allclose(std_unit / std_fan, np.sqrt(401), rtol=1e-4)
    np.testing.assert_allclose(std_default, std_fan, rtol=1e-6)
    assert abs(std_unit - 0.9866) < 0.01  # truncated at +-3: std 0.9866


def test_output_layer_scales_activations_by_inverse_fan_in():
    lin = hax.nn.Linear.init(In, Out, key=jax.random.key(1), reparam_cls=mup.OutputLinearMup)
    x = hax.random.normal(jax.random.key(2), (Batch, In))
    ref = np.asarray(x.array) @ np.asarray(lin.weight.array).T / 401 + np.asarray(lin.bias.array)
    np.testing.assert_allclose(lin(x).array, ref, rtol=1e-4, atol=1e-5)


def test_lr_scales_and_reparam_selectors():
    assert hax.nn.Linear.hidden_reparam()(In, Out).lr_scale == 1 / 401
    assert hax.nn.Linear.hidden_reparam(False) is mup.LinearStandardParam
    assert hax.nn.Linear.input_reparam() is mup.InputLinearMup
    assert hax.nn.Linear.output_reparam() is mup.OutputLinearMup
    lin = hax.nn.Linear.init(In, Out, key=jax.random.key(3), reparam_cls=mup.HiddenLinearMup)
    assert lin.reparam.lr_scale == 1 / 401
    emb = mup.EmbeddingMup(hax.Axis("embed", 64), hax.Axis("vocab", 11))
    assert emb.unembed_active_scale == 1 / 64
    assert mup.EmbeddingStandardParam.init_scale(None, hax.Axis("embed", 8)) == 1 / 8
