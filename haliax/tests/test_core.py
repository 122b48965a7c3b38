import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meltemi.haliax as hax

Batch, Pos, Embed = hax.Axis("batch", 3), hax.Axis("pos", 5), hax.Axis("embed", 7)


def _x():
    return hax.named(jnp.arange(3 * 5 * 7, dtype=jnp.float32).reshape(3, 5, 7), (Batch, Pos, Embed))


def test_named_takes_sizes_from_array_for_string_axes():
    x = hax.named(jnp.zeros((3, 5)), ("batch", "pos"))
    assert x.axes == (Batch, Pos)
    assert x.shape == {"batch": 3, "pos": 5}


def test_named_array_is_a_pytree_with_one_leaf():
    leaves, treedef = __import__("jax").tree.flatten(_x())
    assert len(leaves) == 1
    assert treedef.unflatten(leaves).axes == (Batch, Pos, Embed)


def test_resolve_axis_returns_axis_by_name():
    assert _x().resolve_axis("pos") == Pos
    assert _x().resolve_axis(("embed", "batch")) == (Embed, Batch)


def test_unknown_axis_error_lists_axes_present():
    with pytest.raises(hax.AxisNotFoundError, match=r"'heads' not found.*batch=3, pos=5, embed=7"):
        _x().resolve_axis("heads")


def test_size_clash_error_shows_both_sizes():
    other = hax.ones((Batch, Pos.resize(4)))
    with pytest.raises(hax.AxisSizeMismatchError, match=r"'pos' has size 5 .* and 4"):
        _x() + other


def test_named_size_clash_shows_both_sizes():
    with pytest.raises(hax.AxisSizeMismatchError, match=r"'pos' has size 5 .* size 4"):
        hax.named(jnp.zeros((3, 4)), (Batch, Pos))


def test_duplicate_axis_error_names_the_axis():
    with pytest.raises(hax.DuplicateAxisError, match=r"duplicate axis name 'pos'"):
        hax.zeros((Pos, Batch, Pos))


def test_axis_rejects_non_int_size():
    with pytest.raises(TypeError, match=r"Axis 'pos': size must be an int, got 5.0"):
        hax.Axis("pos", 5.0)


def test_rename_changes_name_keeps_data():
    y = _x().rename({"pos": "key_pos"})
    assert [a.name for a in y.axes] == ["batch", "key_pos", "embed"]
    np.testing.assert_array_equal(y.array, _x().array)


def test_rearrange_with_ellipsis_transposes():
    y = _x().rearrange(("embed", ..., "batch"))
    assert [a.name for a in y.axes] == ["embed", "pos", "batch"]
    np.testing.assert_array_equal(y.array, np.transpose(_x().array, (2, 1, 0)))


def test_rearrange_missing_axis_is_an_error():
    with pytest.raises(hax.AxisError, match=r"axes \['embed'\].*not placed"):
        _x().rearrange(("batch", "pos"))


def test_binary_op_aligns_by_name_not_position():
    x = _x()
    bias = hax.named(jnp.arange(7.0), Embed)
    tr = x.rearrange(("embed", "pos", "batch"))
    np.testing.assert_allclose(
        (tr + bias).rearrange(("batch", "pos", "embed")).array, x.array + np.arange(7.0)
    )


def test_binary_op_needs_one_operand_with_all_axes():
    # Haliax's rule: no outer product by accident; the error names both axis sets and the fix
    with pytest.raises(
        hax.AxisError,
        match=r"multiply: cannot broadcast operands with axes \(batch=3\), \(pos=5\).*"
        r"hax\.broadcast_axis\(x, hax\.Axis\('pos', 5\)\)",
    ):
        hax.arange(Batch) * hax.arange(Pos)


def test_not_subset_error_is_a_value_error_as_in_haliax():
    with pytest.raises(ValueError):
        hax.ones((Batch, Embed)) + hax.ones((Pos, Embed))


def test_explicit_broadcast_axis_gives_the_outer_product():
    out = hax.arange(Batch).broadcast_axis(Pos) * hax.arange(Pos)
    out = out.rearrange(("batch", "pos"))
    np.testing.assert_array_equal(out.array, np.outer(np.arange(3), np.arange(5)))


def test_subset_operand_broadcasts_in_the_superset_order():
    bias = hax.named(jnp.arange(7.0), Embed)
    x = _x().rearrange(("embed", "batch", "pos"))
    for out in (bias + x, x + bias):
        assert out.axes == x.axes
        np.testing.assert_array_equal(out.array, x.array + np.arange(7.0)[:, None, None])


def test_broadcast_arrays_takes_the_union_only_when_asked():
    a, b = hax.arange(Batch), hax.arange(Pos)
    with pytest.raises(hax.AxisError, match=r"broadcast_arrays: cannot broadcast"):
        hax.broadcast_arrays(a, b)
    ua, ub = hax.broadcast_arrays(a, b, require_subset=False)
    assert ua.axes == ub.axes == (Batch, Pos)
    np.testing.assert_array_equal((ua * ub).array, np.outer(np.arange(3), np.arange(5)))


def test_unnamed_scalar_plus_named_scalar_stays_named():
    # Haliax has no `__jax_array__`: a traced scalar defers to NamedArray's operator
    s = hax.named(jnp.float32(2.0), ())
    out = jax.jit(lambda t: t + s)(jnp.float32(1.0))
    assert isinstance(out, hax.NamedArray) and out.axes == ()
    assert float(out) == 3.0


def test_unnamed_array_plus_named_scalar_is_unnamed():
    s = hax.named(jnp.float32(2.0), ())
    for t in (jnp.arange(4.0), np.arange(4.0)):
        out = jax.jit(lambda t: t * s)(t)
        assert not isinstance(out, hax.NamedArray)
        np.testing.assert_array_equal(out, np.arange(4.0) * 2)
    out = np.arange(4.0) * s  # numpy defers to NamedArray.__rmul__
    assert not isinstance(out, hax.NamedArray)
    np.testing.assert_array_equal(out, np.arange(4.0) * 2)


def test_named_array_in_a_jnp_function_is_an_error():
    with pytest.raises(TypeError, match=r"NamedArray"):
        jnp.exp(hax.named(jnp.float32(1.0), ()))


def test_unnamed_array_operand_is_rejected():
    with pytest.raises(TypeError, match=r"wrap it with hax.named"):
        _x() + jnp.ones(7)


def test_broadcast_axis_adds_leading_axis():
    y = hax.arange(Pos).broadcast_axis(Batch)
    assert y.axes == (Batch, Pos)


def test_flatten_then_unflatten_roundtrips():
    x = _x()
    flat = x.flatten_axes(("batch", "embed"), "be")
    assert flat.axes == (hax.Axis("be", 21), Pos)
    back = flat.unflatten_axis("be", (Batch, Embed)).rearrange(("batch", "pos", "embed"))
    np.testing.assert_array_equal(back.array, x.array)


def test_split_cuts_axis_into_pieces():
    a, b = _x().split("embed", (hax.Axis("e1", 2), hax.Axis("e2", 5)))
    np.testing.assert_array_equal(a.array, _x().array[..., :2])
    np.testing.assert_array_equal(b.array, _x().array[..., 2:])


def test_split_with_wrong_total_is_an_error():
    with pytest.raises(hax.AxisSizeMismatchError, match=r"add up to 6"):
        _x().split("embed", (hax.Axis("e1", 2), hax.Axis("e2", 4)))


def test_astype_changes_dtype():
    assert _x().astype(jnp.bfloat16).dtype == jnp.bfloat16
