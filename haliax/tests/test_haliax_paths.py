"""Haliax's module paths and the behaviours issue #39 aligned that the vendored upstream suite
does not pin on its own (tests/upstream/ runs Haliax's tests themselves)."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meltemi.haliax as hax
from meltemi.haliax import state_dict as sd
from meltemi.haliax._src.fp8 import compute_scale

A, B, C = hax.make_axes(a=3, b=5, c=7)


@pytest.mark.parametrize(
    "path, name",
    [
        ("meltemi.haliax.axis", "rearrange_for_partial_order"),
        ("meltemi.haliax.core", "NamedArray"),
        ("meltemi.haliax.haxtyping", "f32"),
        ("meltemi.haliax.jax_utils", "tree_checkpoint_name"),
        ("meltemi.haliax.nn.conv", "ConvTranspose"),
        ("meltemi.haliax.nn.pool", "max_pool"),
        ("meltemi.haliax.nn.scan", "Stacked"),
        ("meltemi.haliax._src.einsum", "einsum"),
        ("meltemi.haliax._src.fp8", "compute_scale"),
        ("meltemi.haliax._src.parsing", "parse_rearrangement"),
        ("meltemi.haliax._src.rearrange", "einops_rearrange"),
        ("meltemi.haliax._src.state_dict", "flatten_modules_for_export"),
    ],
)
def test_haliax_module_paths_export_the_same_objects(path, name):
    obj = getattr(importlib.import_module(path), name)
    top = {"einops_rearrange": hax.rearrange, "NamedArray": hax.NamedArray, "einsum": hax.einsum}
    if name in top:
        assert obj is top[name]


def test_to_state_dict_returns_the_modules_own_arrays_and_numpy_on_request():
    w = jnp.arange(3.0)
    tree = {"w": w, "x": hax.arange(A)}
    out = sd.to_state_dict(tree)
    assert out["w"] is w and isinstance(out["x"], jax.Array)
    host = sd.to_numpy_state_dict(tree)
    assert all(type(v) is np.ndarray for v in host.values())
    np.testing.assert_array_equal(host["x"], np.arange(3))


def test_selects_axis_takes_several_axes_and_dicts():
    assert hax.selects_axis((A, B), ("b", A))
    assert not hax.selects_axis((A, B), (A, C))
    assert not hax.selects_axis({"a": 3}, A.resize(4))
    assert hax.selects_axis({"a": None, "b": 5}, A)


def test_bool_of_one_element_with_size_one_axes_is_its_value():
    One = hax.Axis("one", 1)
    assert bool(hax.ones(One)) and not bool(hax.zeros((One, One.alias("two"))))
    with pytest.raises(ValueError):
        bool(hax.ones(A))


def test_rearrange_with_several_ellipses_places_axes_as_haliax():
    # expected orders are what marin-haliax 0.2.20 returns for the same calls
    x = hax.zeros((A, B, C, hax.Axis("d", 2)))
    assert [a.name for a in hax.rearrange(x, ("c", ..., "a", ...)).axes] == ["c", "a", "b", "d"]
    out = x.rearrange("a b c d -> d ... a ... b")
    assert [a.name for a in out.axes] == ["d", "a", "c", "b"]
    np.testing.assert_array_equal(out.array, jnp.transpose(x.array, (3, 0, 2, 1)))


def test_compute_scale_is_amax_over_fp8_max_and_keeps_the_old_scale_at_zero():
    fp8_max = float(jnp.finfo(jnp.float8_e4m3fn).max)
    np.testing.assert_allclose(compute_scale(jnp.float32(3.5), 1.0, fp8_max, margin=1), 7 / fp8_max)
    assert float(compute_scale(jnp.float32(0.0), jnp.float32(0.25), fp8_max)) == 0.25
    assert float(compute_scale(jnp.float32(jnp.inf), jnp.float32(0.25), fp8_max)) == 0.25


def test_max_pool_of_integers_uses_the_integer_minimum_for_padding():
    x = hax.named(jnp.array([-5, -2, -9], dtype=jnp.int32), ("a",))
    out = hax.nn.max_pool((hax.Axis("a", 2),), x, stride=1, padding="SAME")
    assert out.array.tolist() == [-2, -2, -9]


def test_axis_indices_is_none_for_a_missing_axis_and_a_tuple_for_several():
    x = hax.zeros((A, B))
    assert x.axis_indices("b") == 1 and x.axis_indices(C) is None
    assert x.axis_indices(("b", "c", A)) == (1, None, 0)
    with pytest.raises(hax.AxisSizeMismatchError):
        x.axis_indices(A.resize(4))


def test_flatten_modules_for_export_reaches_nn_layers_with_export_hooks():
    In, Out = (hax.Axis("h", 2), hax.Axis("w", 3)), hax.Axis("d", 5)
    lin = hax.nn.Linear.init(In, Out, key=jax.random.key(0))
    flat = sd.flatten_modules_for_export({"proj": lin})
    assert sd.to_state_dict(flat)["proj.weight"].shape == (5, 6)
    back = sd.unflatten_modules_from_export(flat, {"proj": lin})
    np.testing.assert_array_equal(back["proj"].weight.array, lin.weight.array)
