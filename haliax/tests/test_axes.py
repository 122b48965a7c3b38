"""Axis-spec helpers: make_axes, resolve_axis, replace_axis, eliminate_axes, dblock, typing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meltemi.haliax as hax

Batch, Pos, Embed = hax.make_axes(batch=3, pos=5, embed=7)


def test_make_axes_keeps_keyword_order():
    assert hax.make_axes(z=3, a=5) == (hax.Axis("z", 3), hax.Axis("a", 5))


def test_resolve_axis_by_name_axis_or_tuple():
    spec = (Batch, Pos, Embed)
    assert hax.resolve_axis(spec, "pos") == Pos
    assert hax.resolve_axis(spec, ("embed", Batch)) == (Embed, Batch)
    assert hax.resolve_axis({"pos": 5, "embed": 7}, ("embed",)) == (Embed,)


def test_resolve_axis_errors_name_the_axis():
    with pytest.raises(hax.AxisNotFoundError, match="'heads' not found"):
        hax.resolve_axis((Batch, Pos), "heads")
    with pytest.raises(hax.AxisSizeMismatchError, match="'pos' has size 5"):
        hax.resolve_axis((Batch, Pos), Pos.resize(4))


def test_replace_axis_in_place_with_one_or_several():
    Kv, Heads = hax.make_axes(kv=11, heads=2)
    assert hax.replace_axis((Batch, Pos, Embed), "pos", Kv) == (Batch, Kv, Embed)
    assert hax.replace_axis((Batch, Embed), Embed, (Heads, Kv)) == (Batch, Heads, Kv)
    assert hax.replace_axis({"batch": 3, "pos": 5}, "pos", Kv) == {"batch": 3, "kv": 11}
    with pytest.raises(hax.DuplicateAxisError, match="'batch' is already in"):
        hax.replace_axis((Batch, Pos), "pos", Batch)
    with pytest.raises(hax.AxisNotFoundError, match="'kv' not found"):
        hax.replace_axis((Batch, Pos), "kv", Pos)


def test_eliminate_axes_requires_presence_unlike_without_axes():
    assert hax.eliminate_axes((Batch, Pos, Embed), ("pos", Batch)) == (Embed,)
    assert hax.without_axes((Batch, Pos), "heads") == (Batch, Pos)
    with pytest.raises(hax.AxisNotFoundError, match="'heads' not found"):
        hax.eliminate_axes((Batch, Pos), "heads")


def test_concat_axis_specs_is_concat_axes():
    assert hax.concat_axis_specs((Batch,), (Pos, Embed)) == (Batch, Pos, Embed)


def test_dblock_and_dslice_with_an_axis_length():
    x = hax.arange(hax.Axis("pos", 12))
    np.testing.assert_array_equal(x[{"pos": hax.dblock(2, 3)}].array, [6, 7, 8])
    np.testing.assert_array_equal(x[{"pos": hax.ds(1, hax.Axis("w", 4))}].array, [1, 2, 3, 4])
    assert hax.dslice.block(1, 5) == hax.ds(5, 5)


def test_named_array_annotations_check_axis_names():
    x = hax.ones((Batch, Pos, Embed))
    assert x.matches_axes(hax.NamedArray["batch ... embed"])
    assert x.matches_axes(("batch", "pos", "embed"))
    assert not x.matches_axes("batch embed")
    assert x.matches_axes({"embed", "batch", ...})
    assert not x.matches_axes({"embed", "heads", ...})
    ann = hax.Named[hax.NamedArray, "batch pos embed"]
    assert x.matches_axes(ann)
    with pytest.raises(TypeError, match="only one `...`"):
        hax.NamedArray["a ... b ..."]


def test_shape_checks_can_be_switched_off_for_a_block():
    with pytest.raises(hax.AxisSizeMismatchError, match="does not match axes"):
        hax.NamedArray(jnp.ones((3, 4)), (Batch, Pos))
    with hax.enable_shape_checks(False) as old:
        assert old is True and not hax.are_shape_checks_enabled()
        hax.NamedArray(jnp.ones((3, 4)), (Batch, Pos))
    assert hax.are_shape_checks_enabled()


def test_tree_checkpoint_name_tags_every_array_leaf():
    def f(x):
        y = hax.tree_checkpoint_name({"h": hax.sin(x) * 2}, "mine")["h"]
        return hax.sum(hax.cos(y)).scalar()

    x = hax.random.normal(jax.random.key(0), (Batch, Embed))
    policy = jax.checkpoint_policies.save_only_these_names("mine")
    g = jax.grad(jax.checkpoint(f, policy=policy))(x)
    np.testing.assert_allclose(g.array, jax.grad(f)(x).array, rtol=1e-6)
    jaxpr = str(jax.make_jaxpr(jax.grad(jax.checkpoint(f, policy=policy)))(x))
    assert "name=mine" in jaxpr


def test_specialized_fns_top_k_is_hax_top_k():
    from meltemi.haliax.specialized_fns import top_k

    assert top_k is hax.top_k
