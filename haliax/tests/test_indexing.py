import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meltemi.haliax as hax

Batch, Pos, Embed = hax.Axis("batch", 3), hax.Axis("pos", 5), hax.Axis("embed", 7)


def _x():
    return hax.named(jnp.arange(105.0).reshape(3, 5, 7), (Batch, Pos, Embed))


def test_dict_index_with_int_and_slice():
    y = _x()[{"pos": 2, "embed": slice(1, 4)}]
    assert y.axes == (Batch, Embed.resize(3))
    np.testing.assert_array_equal(y.array, _x().array[:, 2, 1:4])


def test_tuple_index_alternating_names():
    np.testing.assert_array_equal(_x()["batch", 1, "pos", 0].array, _x().array[1, 0])


def test_gather_with_named_indices_replaces_axis():
    Sel = hax.Axis("sel", 4)
    ids = hax.named(jnp.array([4, 0, 2, 2]), Sel)
    y = _x()[{"pos": ids}]
    assert y.axes == (Batch, Sel, Embed)
    np.testing.assert_array_equal(y.array, _x().array[:, [4, 0, 2, 2]])


def test_gather_with_two_named_indices_broadcasts():
    Sel = hax.Axis("sel", 2)
    b = hax.named(jnp.array([0, 2]), Sel)
    p = hax.named(jnp.array([1, 3]), Sel)
    y = _x()[{"batch": b, "pos": p}]
    assert y.axes == (Sel, Embed)
    np.testing.assert_array_equal(y.array, _x().array[[0, 2], [1, 3]])


def test_dynamic_slice_under_jit():
    f = jax.jit(lambda x, s: x[{"pos": hax.ds(s, 2)}])
    np.testing.assert_array_equal(f(_x(), 3).array, _x().array[:, 3:5])


def test_at_set_and_add():
    y = _x().at[{"pos": 1}].set(0.0)
    np.testing.assert_array_equal(y.array[:, 1], 0.0)
    z = _x().at[{"embed": 2}].add(hax.ones(Batch))
    np.testing.assert_array_equal(z.array[:, :, 2], _x().array[:, :, 2] + 1)


def test_at_with_dynamic_slice():
    upd = hax.full((Batch, Pos.resize(2), Embed), -1.0)
    y = jax.jit(lambda x, s: x.at[{"pos": hax.ds(s, 2)}].set(upd))(_x(), 1)
    np.testing.assert_array_equal(y.array[:, 1:3], -1.0)
    np.testing.assert_array_equal(y.array[:, 3:], _x().array[:, 3:])


def test_updated_slice_writes_block():
    upd = hax.zeros((Pos.resize(2),))
    y = hax.updated_slice(_x(), {"pos": 3}, upd)
    np.testing.assert_array_equal(y.array[:, 3:5], 0.0)
    np.testing.assert_array_equal(y.array[:, :3], _x().array[:, :3])


def test_slice_with_start_and_length():
    y = hax.slice(_x(), "embed", start=2, length=3)
    np.testing.assert_array_equal(y.array, _x().array[..., 2:5])


def test_index_unknown_axis_lists_axes():
    with pytest.raises(hax.AxisNotFoundError, match=r"'heads' not found.*batch=3, pos=5, embed=7"):
        _x()[{"heads": 0}]


def test_unnamed_1d_index_batches_over_the_axis_of_its_length():
    # Haliax's sugar: a 1-d unnamed index takes the name of a kept axis of the same length
    y = _x()[{"pos": jnp.array([4, 0, 2])}]
    assert y.axes == (Batch, Embed)
    np.testing.assert_array_equal(y.array, _x().array[jnp.arange(3), jnp.array([4, 0, 2])])


def test_unnamed_2d_index_is_rejected():
    with pytest.raises(TypeError, match=r"must be 0-d or 1-d, got shape \(2, 2\); name its axes"):
        _x()[{"pos": jnp.zeros((2, 2), int)}]
