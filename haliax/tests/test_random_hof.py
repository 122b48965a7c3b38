import jax
import jax.numpy as jnp
import numpy as np

import meltemi.haliax as hax

Layers, Batch, Embed = hax.Axis("layers", 3), hax.Axis("batch", 5), hax.Axis("embed", 7)


def test_random_normal_matches_jax_with_named_shape():
    key = jax.random.key(3)
    x = hax.random.normal(key, (Batch, Embed))
    assert x.axes == (Batch, Embed)
    np.testing.assert_array_equal(x.array, jax.random.normal(key, (5, 7)))


def test_random_bernoulli_randint_uniform_shapes():
    key = jax.random.key(0)
    assert hax.random.bernoulli(key, Embed, 0.3).dtype == jnp.bool_
    r = hax.random.randint(key, (Batch,), 0, 4)
    assert r.axes == (Batch,) and int(hax.max(r).scalar()) < 4
    u = hax.random.uniform(key, Embed, minval=2.0, maxval=3.0)
    assert float(hax.min(u).scalar()) >= 2.0


def test_random_categorical_removes_axis():
    logits = hax.named(jnp.log(jnp.array([[0.0, 1.0, 0.0]] * 5)), (Batch, "v"))
    assert np.all(hax.random.categorical(jax.random.key(0), logits, "v").array == 1)


def test_vmap_maps_named_axis_wherever_it_is():
    x = hax.random.normal(jax.random.key(0), (Embed, Batch))
    out = hax.vmap(lambda row: hax.sum(row * 2.0), Batch)(x)
    assert out.axes == (Batch,)
    np.testing.assert_allclose(out.array, 2.0 * x.array.sum(0), rtol=1e-5)


def test_vmap_passes_unmapped_named_arrays_whole():
    x = hax.ones((Batch, Embed))
    w = hax.arange(Embed).astype(jnp.float32)
    out = hax.vmap(lambda row, w: hax.dot(row, w, axis=Embed), Batch)(x, w)
    np.testing.assert_allclose(out.array, np.full(5, 21.0))


def test_scan_slices_named_axis_and_stacks_outputs():
    xs = hax.named(jnp.arange(21.0).reshape(3, 7), (Layers, Embed))

    def step(c, x):
        c = c + x
        return c, hax.sum(c)

    carry, ys = hax.scan(step, Layers)(hax.zeros(Embed), xs)
    np.testing.assert_allclose(carry.array, xs.array.sum(0))
    assert ys.axes == (Layers,)
    np.testing.assert_allclose(ys.array, np.cumsum(xs.array.sum(1)))


def test_scan_reorders_transposed_carry():
    init = hax.zeros((Batch, Embed))
    xs = hax.ones((Layers,))
    out = hax.fold(lambda c, x: (c + x).rearrange(("embed", "batch")), Layers)(init, xs)
    assert out.axes == (Batch, Embed)
    np.testing.assert_allclose(out.array, 3.0)


def test_fold_scans_raw_arrays_on_leading_dim():
    keys = jax.random.split(jax.random.key(0), 3)
    out = hax.fold(lambda c, k: c + jax.random.uniform(k), Layers)(0.0, keys)
    ref = sum(float(jax.random.uniform(k)) for k in keys)
    np.testing.assert_allclose(out, ref, rtol=1e-6)


def test_map_is_sequential_vmap():
    x = hax.random.normal(jax.random.key(1), (Layers, Embed))
    out = hax.map(lambda r: hax.max(r, "embed"), Layers)(x)
    np.testing.assert_allclose(out.array, x.array.max(1))


def test_vmap_over_two_axes_nests():
    x = hax.random.normal(jax.random.key(0), (Batch, Layers, Embed))
    out = hax.vmap(lambda r: hax.sum(r), (Batch, Layers))(x)
    assert out.axes == (Batch, Layers)
    np.testing.assert_allclose(out.array, x.array.sum(-1), rtol=1e-5)


def test_vmap_by_name_without_named_argument_is_an_error():
    import pytest

    with pytest.raises(hax.AxisError, match=r"given by name but no NamedArray argument has it"):
        hax.vmap(lambda a: a, "layers")(jnp.zeros(3))
