"""tree_util, field, debug and NamedRef."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meltemi.haliax as hax
from meltemi.haliax import tree_util as htu

Batch, Pos, Embed, Layers = hax.make_axes(batch=3, pos=5, embed=7, layers=11)


def test_tree_map_sees_named_arrays_as_leaves():
    tree = {"a": hax.ones((Batch, Embed)), "b": [hax.zeros(Pos), 3]}
    seen = []
    htu.tree_map(lambda x: seen.append(type(x).__name__) or x, tree)
    assert seen == ["NamedArray", "NamedArray", "int"]
    leaves, treedef = htu.tree_flatten(tree)
    assert [type(x).__name__ for x in leaves] == ["NamedArray", "NamedArray", "int"]
    assert htu.tree_unflatten(treedef, leaves)["a"].axes == (Batch, Embed)
    assert len(htu.tree_leaves(tree, is_leaf=lambda x: isinstance(x, list))) == 2
    assert htu.tree_structure(tree).num_leaves == 3


def test_scan_aware_tree_map_applies_per_layer():
    stack = hax.nn.Stacked.init(Layers, hax.nn.Linear)(
        Embed, Embed.alias("out"), key=jax.random.split(jax.random.key(0), 11)
    )
    shapes = []

    def f(x):
        if isinstance(x, hax.NamedArray):
            shapes.append(x.axes)
        return x

    htu.scan_aware_tree_map(f, stack)
    assert all(not any(a.name == "layers" for a in axes) for axes in shapes)
    scaled = htu.scan_aware_tree_map(lambda x: x * 2 if isinstance(x, hax.NamedArray) else x, stack)
    np.testing.assert_allclose(scaled.stacked.weight.array, 2 * stack.stacked.weight.array)


def test_resize_axis_shrinks_and_grows_every_array():
    lin = hax.nn.Linear.init(Embed, Pos, key=jax.random.key(1))
    small = htu.resize_axis(lin, "embed", 3)
    assert small.weight.shape == {"pos": 5, "embed": 3}
    np.testing.assert_array_equal(small.weight.array, lin.weight.array[:, :3])
    big = htu.resize_axis(lin, "embed", 11)
    assert big.weight.shape == {"pos": 5, "embed": 11}
    mean = np.asarray(lin.weight.array).mean(axis=1, keepdims=True)
    np.testing.assert_allclose(big.weight.array[:, 7:], np.broadcast_to(mean, (5, 4)), rtol=1e-6)
    noisy = htu.resize_axis(lin, "embed", 11, key=jax.random.key(2))
    assert not np.allclose(noisy.weight.array[:, 7:], big.weight.array[:, 7:])
    np.testing.assert_array_equal(noisy.bias.array, lin.bias.array)  # no embed axis


def test_hashable_partition_round_trips():
    lin = hax.nn.Linear.init(Embed, Pos, key=jax.random.key(3))
    dyn, static = htu.hashable_partition(lin, eqx.is_array)
    hash(static)
    back = htu.hashable_combine(dyn, static)
    np.testing.assert_array_equal(back.weight.array, lin.weight.array)


def test_field_records_axis_names_and_rejects_static_arrays():
    class M(eqx.Module):
        w: hax.NamedArray = hax.field(axis_names=("out", "in"))
        n: int = hax.field(static=True, default=3)

    meta = {f.name: f.metadata for f in dataclasses.fields(M)}
    assert meta["w"]["axis_names"] == ("out", "in")
    assert meta["n"]["static"] is True
    with pytest.raises(ValueError, match="static=True fields hold no arrays"):
        hax.field(static=True, axis_names=("a",))


def test_diagnose_common_issues_finds_shared_and_static_arrays():
    w = hax.ones((Embed,))

    class Shared(eqx.Module):
        a: hax.NamedArray
        b: hax.NamedArray

    with pytest.raises(hax.debug.ModuleProblems, match=r"Reused array .* \['.a', '.b'\]"):
        hax.debug.diagnose_common_issues(Shared(w, w))

    class Static(eqx.Module):
        a: jax.Array = eqx.field(static=True)

    with pytest.warns(UserWarning, match="static"):
        bad = Static(jnp.ones(3))
    with pytest.raises(hax.debug.ModuleProblems, match="Static array at field .a"):
        hax.debug.diagnose_common_issues(bad)
    hax.debug.diagnose_common_issues(Shared(w, hax.ones((Embed,))))  # no problem: no raise


def test_visualize_shardings_prints_axis_to_mesh_mapping(capsys):
    mesh = hax.partitioning.make_mesh({"data": 8})
    x = hax.ones((hax.Axis("batch", 8), Embed))
    with jax.set_mesh(mesh):
        x = hax.shard(x, {"batch": "data"})
        hax.debug.visualize_shardings({"x": x})
    assert "batch->data, embed->unsharded" in capsys.readouterr().out


def test_named_ref_reads_and_writes_by_name():
    r = hax.new_ref(hax.zeros((Batch, Pos)))
    r[{"pos": 2}] = hax.arange(Batch, start=1.0)
    r["batch", 0, "pos", hax.ds(3, 2)] = 7.0
    ref = np.zeros((3, 5))
    ref[:, 2] = [1, 2, 3]
    ref[0, 3:5] = 7
    np.testing.assert_array_equal(hax.freeze(r).array, ref)
    np.testing.assert_array_equal(hax.get(r, {"batch": 2}).array, ref[2])
    old = hax.swap(r, {"batch": 1}, hax.full(Pos, 5.0))
    np.testing.assert_array_equal(old.array, ref[1])
    np.testing.assert_array_equal(r[{"batch": 1}].array, np.full(5, 5.0))
    assert r.axes == (Batch, Pos) and r.shape == {"batch": 3, "pos": 5}


def test_named_ref_works_inside_jit():
    @jax.jit
    def f(x):
        r = hax.new_ref(x)
        r[{"pos": 0}] = r[{"pos": 0}] + 1.0
        return hax.freeze(r)

    x = hax.random.normal(jax.random.key(4), (Batch, Pos))
    np.testing.assert_allclose(f(x).array, x.array.at[:, 0].add(1.0), rtol=1e-6)


def test_new_ref_of_plain_array_says_to_name_it():
    with pytest.raises(TypeError, match="hax.named"):
        hax.new_ref(jnp.zeros(3))
