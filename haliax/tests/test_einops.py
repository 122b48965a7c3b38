"""einops-style `rearrange` patterns, `repeat`, `tile`, `unflatten`: checked against plain
`jax.numpy` reshapes and transposes on arrays with odd, distinct axis sizes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meltemi.haliax as hax

B, H, D, W = 3, 5, 7, 2  # odd, distinct sizes


def _x():
    data = jnp.arange(B * H * D * W, dtype=jnp.float32).reshape(B, H * D, W)
    return hax.named(data, ("batch", "hd", "w")), data


def test_split_matches_jnp_reshape():
    x, data = _x()
    y = hax.rearrange(x, "b (h d) w -> b h d w", h=H)
    assert [(a.name, a.size) for a in y.axes] == [("batch", B), ("h", H), ("d", D), ("w", W)]
    np.testing.assert_array_equal(y.array, data.reshape(B, H, D, W))


def test_split_then_reorder_and_merge_matches_jnp():
    x, data = _x()
    y = hax.rearrange(x, "b (h d) w -> d (bw: b w) h", d=D)
    ref = data.reshape(B, H, D, W).transpose(2, 0, 3, 1).reshape(D, B * W, H)
    assert [(a.name, a.size) for a in y.axes] == [("d", D), ("bw", B * W), ("h", H)]
    np.testing.assert_array_equal(y.array, ref)


def test_positional_identifiers_keep_the_input_names():
    x, data = _x()
    y = hax.rearrange(x, "p q r -> r p q")
    assert [a.name for a in y.axes] == ["w", "batch", "hd"]
    np.testing.assert_array_equal(y.array, data.transpose(2, 0, 1))


def test_ellipsis_keeps_the_unnamed_axes_in_order():
    x, data = _x()
    y = hax.rearrange(x, "b ... -> ... b")
    assert [a.name for a in y.axes] == ["hd", "w", "batch"]
    np.testing.assert_array_equal(y.array, data.transpose(1, 2, 0))


def test_unordered_side_selects_and_splits_by_name():
    x, data = _x()
    y = hax.rearrange(x, "{(hd: h d) batch} -> batch ... d h", h=H)
    ref = data.reshape(B, H, D, W).transpose(0, 3, 2, 1)
    assert [a.name for a in y.axes] == ["batch", "w", "d", "h"]
    np.testing.assert_array_equal(y.array, ref)


def test_bindings_rename_new_axes():
    x, _ = _x()
    y = hax.rearrange(x, "b (h d) w -> b h d w", h=hax.Axis("heads", H), d="head_size")
    assert [(a.name, a.size) for a in y.axes] == [
        ("batch", B),
        ("heads", H),
        ("head_size", D),
        ("w", W),
    ]


def test_round_trip_is_the_identity_under_jit():
    x, _ = _x()

    @jax.jit
    def there_and_back(a):
        y = hax.rearrange(a, "b (h d) w -> w d b h", h=H)
        return hax.rearrange(y, "w d b h -> b (hd: h d) w")

    np.testing.assert_array_equal(there_and_back(x).array, x.array)
    assert there_and_back(x).axes == x.axes


@pytest.mark.parametrize(
    "pattern, kwargs, message",
    [
        ("b (h d) w -> b h d w", {}, r"into \('h', 'd'\) are ambiguous: give all but one"),
        ("b (h d) w -> b h d w", {"h": 4}, "do not divide evenly into axis 'hd' of size 35"),
        ("b hd w -> b (hd w)", {}, r"All rhs axes must have a name: use \(hd_w: hd w\)"),
        ("b hd w -> b hd", {}, r"Not all intermediate axes are used: \['w'\]; use \.\.\."),
        ("b hd w -> b hd w z", {}, "Axis z is not bound on the lhs"),
        ("b hd -> b hd", {}, "Not all axes are bound, use ... to skip missing axes: 2 names"),
        ("b hd w", {}, "needs exactly one '->'"),
    ],
)
def test_pattern_errors_say_what_is_wrong(pattern, kwargs, message):
    x, _ = _x()
    with pytest.raises(hax.AxisError, match=message):
        hax.rearrange(x, pattern, **kwargs)


def test_sequence_form_still_reorders_and_refuses_bindings():
    x, data = _x()
    np.testing.assert_array_equal(hax.rearrange(x, ("w", ...)).array, data.transpose(2, 0, 1))
    with pytest.raises(hax.AxisError, match="need a pattern string"):
        hax.rearrange(x, ("w", ...), h=3)


def test_repeat_and_tile_match_jnp():
    x, data = _x()
    r = hax.repeat(x, 3, "w")
    assert r.resolve_axis("w").size == 3 * W
    np.testing.assert_array_equal(r.array, jnp.repeat(data, 3, axis=2))
    t = hax.tile(x, {"batch": 2, "w": 3})
    assert [a.size for a in t.axes] == [2 * B, H * D, 3 * W]
    np.testing.assert_array_equal(t.array, jnp.tile(data, (2, 1, 3)))


def test_unflatten_inverts_flatten_axes():
    x, data = _x()
    y = hax.unflatten(x, "hd", (hax.Axis("h", H), hax.Axis("d", D)))
    np.testing.assert_array_equal(y.array, data.reshape(B, H, D, W))
    back = hax.flatten_axes(y, ("h", "d"), "hd")
    assert back.axes == x.axes
