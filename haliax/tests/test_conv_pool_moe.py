"""Conv / ConvTranspose against explicit numpy loops, pools against numpy windows, MoELinear
and ragged_dot against per-expert matmuls. Sizes are odd and distinct."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meltemi.haliax as hax

Batch, H, W, C, D = hax.make_axes(batch=3, h=7, w=5, c=3, d=4)


def _conv_ref(x, w, stride, pad, dil, groups):
    """x (N, C, H, W), w (O, C/g, kh, kw): cross-correlation by loops."""
    x = np.pad(x, [(0, 0), (0, 0), pad[0], pad[1]])
    n, c, hh, ww = x.shape
    o, cg, kh, kw = w.shape
    oh = (hh - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (ww - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for b, oc, i, j in itertools.product(range(n), range(o), range(oh), range(ow)):
        g = oc // og
        for ci, a, bb in itertools.product(range(cg), range(kh), range(kw)):
            xi = x[b, g * cg + ci, i * stride[0] + a * dil[0], j * stride[1] + bb * dil[1]]
            out[b, oc, i, j] += xi * w[oc, ci, a, bb]
    return out


def test_conv2d_matches_loops_with_stride_padding_dilation():
    conv = hax.nn.Conv.init(
        (H, W),
        C,
        D,
        kernel_size=(3, 2),
        stride=(2, 1),
        padding=((1, 2), 1),
        dilation=(1, 2),
        key=jax.random.key(0),
    )
    x = hax.random.normal(jax.random.key(1), (H, Batch, C, W))  # channels in the middle
    y = conv(x)
    assert [a.name for a in y.axes] == ["h", "batch", "d", "w"]
    raw = np.transpose(np.asarray(x.array), (1, 2, 0, 3))
    ref = _conv_ref(raw, np.asarray(conv.weight.array), (2, 1), ((1, 2), (1, 1)), (1, 2), 1)
    ref = ref + np.asarray(conv.bias.array)[None, :, None, None]
    np.testing.assert_allclose(
        np.transpose(np.asarray(y.array), (1, 2, 0, 3)), ref, rtol=1e-4, atol=1e-5
    )


def test_grouped_conv_matches_loops():
    C6, D4 = hax.Axis("c", 6), hax.Axis("d", 4)
    conv = hax.nn.Conv.init((H, W), C6, D4, 3, groups=2, use_bias=False, key=jax.random.key(2))
    assert conv.weight.shape == {"d": 4, "c": 3, "h": 3, "w": 3}
    x = hax.random.normal(jax.random.key(3), (Batch, C6, H, W))
    ref = _conv_ref(
        np.asarray(x.array), np.asarray(conv.weight.array), (1, 1), ((0, 0),) * 2, (1, 1), 2
    )
    np.testing.assert_allclose(conv(x).array, ref, rtol=1e-4, atol=1e-5)


def test_conv_missing_axis_names_what_is_missing():
    conv = hax.nn.Conv.init((H, W), C, D, 3, key=jax.random.key(4))
    with pytest.raises(hax.AxisError, match=r"lack \['w'\]"):
        conv(hax.ones((Batch, H, C)))


def test_conv_transpose_matches_the_scatter_definition():
    T, Cin, Cout = hax.Axis("t", 5), hax.Axis("c", 3), hax.Axis("d", 2)
    ct = hax.nn.ConvTranspose.init(
        T, Cin, Cout, 3, stride=2, padding=1, output_padding=1, dilation=1, key=jax.random.key(5)
    )
    x = hax.random.normal(jax.random.key(6), (Batch, T, Cin))
    y = ct(x)
    assert y.shape == {"batch": 3, "t": (5 - 1) * 2 - 2 + 2 + 1 + 1, "d": 2}
    w = np.asarray(ct.weight.array)  # (d, c, k)
    xr = np.asarray(x.array)
    full = np.zeros((3, (5 - 1) * 2 + 3 + 1, 2))
    for b, i, c, m in itertools.product(range(3), range(5), range(3), range(3)):
        full[b, i * 2 + m] += xr[b, i, c] * w[:, c, 2 - m]
    ref = full[:, 1 : 1 + y.shape["t"]] + np.asarray(ct.bias.array)
    np.testing.assert_allclose(y.array, ref, rtol=1e-4, atol=1e-5)


def _windows(x, k, s, pad_value, pad=(0, 0)):
    x = np.pad(x, [(0, 0), pad], constant_values=pad_value)
    n = (x.shape[1] - k) // s + 1
    return np.stack([x[:, i * s : i * s + k] for i in range(n)], 1)


@pytest.mark.parametrize(
    "name,ref,init", [("max_pool", np.max, -np.inf), ("min_pool", np.min, np.inf)]
)
def test_max_min_pool_over_a_named_axis(name, ref, init):
    x = hax.random.normal(jax.random.key(7), (H, Batch))
    out = getattr(hax.nn, name)(hax.Axis("h", 3), x, stride=2, padding=((1, 1),))
    assert out.axes == (hax.Axis("h", 4), Batch)
    win = _windows(np.asarray(x.array).T, 3, 2, init, (1, 1))
    np.testing.assert_allclose(out.array, ref(win, axis=2).T)


def test_mean_pool_counts_only_real_elements_unless_asked():
    x = hax.random.normal(jax.random.key(8), (Batch, W))
    out = hax.nn.mean_pool(hax.Axis("w", 2), x, stride=2, padding=((0, 1),))
    raw = np.asarray(x.array)
    ref = np.stack([raw[:, 0:2].mean(1), raw[:, 2:4].mean(1), raw[:, 4]], 1)
    np.testing.assert_allclose(out.array, ref, rtol=1e-6)
    incl = hax.nn.mean_pool(hax.Axis("w", 2), x, 2, ((0, 1),), count_include_pad=True)
    np.testing.assert_allclose(incl.array[:, 2], raw[:, 4] / 2, rtol=1e-6)


def test_pool_use_ceil_keeps_the_last_partial_window():
    x = hax.random.normal(jax.random.key(9), (Batch, H))
    floor = hax.nn.max_pool(hax.Axis("h", 2), x, stride=2)
    ceil = hax.nn.max_pool(hax.Axis("h", 2), x, stride=2, use_ceil=True)
    assert floor.shape["h"] == 3 and ceil.shape["h"] == 4
    np.testing.assert_allclose(ceil.array[:, 3], x.array[:, 6])


def test_2d_pool_with_same_padding():
    x = hax.random.normal(jax.random.key(10), (Batch, H, W))
    out = hax.nn.max_pool((hax.Axis("h", 3), hax.Axis("w", 3)), x, padding="SAME")
    assert out.shape == {"batch": 3, "h": 7, "w": 5}
    raw = np.pad(np.asarray(x.array), [(0, 0), (1, 1), (1, 1)], constant_values=-np.inf)
    ref = np.max([raw[:, a : a + 7, b : b + 5] for a in range(3) for b in range(3)], axis=0)
    np.testing.assert_allclose(out.array, ref)


def test_ragged_dot_is_a_matmul_per_expert_group():
    lhs = jax.random.normal(jax.random.key(11), (11, 3))
    rhs = jax.random.normal(jax.random.key(12), (3, 3, 5))
    sizes = jnp.array([4, 0, 7])
    out = hax.nn.ragged_dot(lhs, rhs, sizes)
    ref = np.concatenate([lhs[:4] @ rhs[0], lhs[4:11] @ rhs[2]])
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(NotImplementedError, match="needs a TPU"):
        hax.nn.ragged_dot(lhs, rhs, sizes, implementation="megablox")


def test_moe_linear_routes_sorted_tokens_to_their_expert():
    Tok, E, In, Out = hax.make_axes(tok=11, experts=3, embed=5, mlp=7)
    layer = hax.nn.MoELinear.init(E, In, Out, key=jax.random.key(13), out_first=True)
    layer = jax.tree.map(lambda a: a, layer)
    bias = hax.random.normal(jax.random.key(14), Out)
    layer = hax.nn.MoELinear(layer.weight, bias, E, In, Out)
    x = hax.random.normal(jax.random.key(15), (In, Tok))
    sizes = hax.named(jnp.array([2, 6, 3]), E)
    y = layer(x, sizes)
    assert y.axes == (Out, Tok)
    w = np.asarray(layer.weight.array)  # (e, out, in)
    xr = np.asarray(x.array).T
    expert = np.repeat([0, 1, 2], [2, 6, 3])
    ref = np.stack([w[e] @ xr[t] for t, e in enumerate(expert)]) + np.asarray(bias.array)
    np.testing.assert_allclose(y.array.T, ref, rtol=1e-4, atol=1e-5)
