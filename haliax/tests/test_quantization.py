"""FP8 and INT8 `dot_general`s on the CPU, against numpy emulations (ml_dtypes' float8)."""

import equinox as eqx
import jax
import ml_dtypes
import numpy as np
import pytest

import meltemi.haliax as hax
from meltemi.haliax import quantization as hq

Batch, In, Out, Layers = hax.make_axes(batch=7, embed=5, mlp=3, layers=11)


def _lin(seed=0):
    return hax.nn.Linear.init(In, Out, key=jax.random.key(seed))


def _x(seed=1):
    return hax.random.normal(jax.random.key(seed), (Batch, In)) * 4


def _e4m3(a, scale):
    q = np.clip(a / scale, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    return q.astype(np.float32) * scale


def test_fp8_forward_is_the_matmul_of_e4m3_rounded_inputs():
    lin, x = _lin(), _x()
    q = hq.quantize_linear_layers(lin, hq.QuantizationConfig(fp8=True, amax_history_length=3))
    loss = lambda m: hax.sum(m(x)).scalar()  # noqa: E731
    grads = jax.grad(loss)(q)
    overwrites, grads = hq.partition_for_grad_overwrite(grads)
    q = hq.apply_updates(q, jax.tree.map(lambda g: -0.0 * g, grads), overwrites)
    dg = q.dot_general
    xr, wr = np.asarray(x.array), np.asarray(lin.weight.array)
    assert np.isclose(dg.input_amax_history[0], np.abs(xr).max())
    assert np.isclose(dg.kernel_amax_history[0], np.abs(wr).max())
    # step 2 scales come from the recorded amax: amax / 448
    sx, sw = np.abs(xr).max() / 448, np.abs(wr).max() / 448
    ref = _e4m3(xr, sx) @ _e4m3(wr, sw).T + np.asarray(lin.bias.array)
    np.testing.assert_allclose(q(x).array, ref, rtol=1e-5, atol=1e-5)
    assert not np.allclose(q(x).array, lin(x).array, atol=1e-4)  # rounding is visible
    err = np.linalg.norm(q(x).array - lin(x).array) / np.linalg.norm(lin(x).array)
    assert err < 0.1  # e4m3 keeps 3 mantissa bits


def test_fp8_weight_gradient_flows_and_state_is_overwritten_not_added():
    lin, x = _lin(2), _x(3)
    q = hq.quantize_linear_layers(lin, hq.QuantizationConfig(fp8=True, amax_history_length=2))
    grads = jax.grad(lambda m: hax.sum(m(x) ** 2).scalar())(q)
    ref = jax.grad(lambda m: hax.sum(m(x) ** 2).scalar())(lin)
    gq, gf = np.asarray(grads.weight.array), np.asarray(ref.weight.array)
    assert np.linalg.norm(gq - gf) / np.linalg.norm(gf) < 0.15
    overwrites, rest = hq.partition_for_grad_overwrite(grads)
    assert isinstance(overwrites.dot_general, hq.Fp8DotGeneralOp)
    assert rest.dot_general is None
    new = hq.apply_updates(q, rest, overwrites)
    np.testing.assert_array_equal(
        new.dot_general.input_amax_history, overwrites.dot_general.input_amax_history
    )
    np.testing.assert_allclose(new.weight.array, q.weight.array + grads.weight.array)


def test_int8_matches_a_numpy_int8_matmul_and_has_straight_through_gradients():
    lin, x = _lin(4), _x(5)
    q = hq.quantize_linear_layers(lin, hq.QuantizationConfig(int8=True))
    xr, wr = np.asarray(x.array), np.asarray(lin.weight.array)
    sx, sw = np.abs(xr).max() / 127, np.abs(wr).max() / 127
    qx = np.clip(np.round(xr / sx), -127, 127).astype(np.int32)
    qw = np.clip(np.round(wr / sw), -127, 127).astype(np.int32)
    ref = (qx @ qw.T).astype(np.float32) * (sx * sw) + np.asarray(lin.bias.array)
    np.testing.assert_allclose(q(x).array, ref, rtol=1e-5, atol=1e-5)
    g = jax.grad(lambda m: hax.sum(m(x)).scalar())(q)
    g_ref = jax.grad(lambda m: hax.sum(m(x)).scalar())(lin)
    np.testing.assert_allclose(g.weight.array, g_ref.weight.array, rtol=1e-5)


def test_targets_select_layers_by_name_and_stacked_layers_get_per_layer_state():
    class Block(eqx.Module):
        up: hax.nn.Linear
        down: hax.nn.Linear

        @staticmethod
        def init(*, key):
            k1, k2 = jax.random.split(key)
            return Block(hax.nn.Linear.init(In, Out, key=k1), hax.nn.Linear.init(Out, In, key=k2))

        def __call__(self, x):
            return self.down(self.up(x))

    stack = hax.nn.Stacked.init(Layers, Block)(key=jax.random.split(jax.random.key(6), 11))
    cfg = hq.QuantizationConfig(targets=["up"], fp8=True, amax_history_length=5)
    q = hq.quantize_linear_layers(stack, cfg)
    assert isinstance(q.stacked.down.dot_general, hq.DefaultDotGeneralOp)
    hist = q.stacked.up.dot_general.input_amax_history
    assert hist.shape == (11, 5)  # one history per layer (an unnamed leading dim)
    out = q(_x(7))
    assert out.axes == (Batch, In)
    regex = hq.quantize_linear_layers(stack, hq.QuantizationConfig(targets=r".*down", int8=True))
    assert isinstance(regex.stacked.down.dot_general, hq.Int8DotGeneralOp)
    assert isinstance(regex.stacked.up.dot_general, hq.DefaultDotGeneralOp)


def test_config_rejects_both_formats():
    with pytest.raises(ValueError, match="not both"):
        hq.QuantizationConfig(fp8=True, int8=True)
