"""Bitwise ops by name against `jnp`, on odd sizes (a 3, b 5)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meltemi.haliax as hax

A, B = hax.make_axes(a=3, b=5)


def _ints(seed, axes, dtype=jnp.uint8):
    shape = tuple(a.size for a in axes)
    return hax.named(jax.random.randint(jax.random.key(seed), shape, 0, 200).astype(dtype), axes)


@pytest.mark.parametrize(
    "name",
    [
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
        "left_shift",
        "right_shift",
        "bitwise_left_shift",
        "bitwise_right_shift",
    ],
)
def test_binary_bitwise_ops_align_by_name(name):
    x = _ints(0, (A, B))
    y = _ints(1, (B,)) % 5  # broadcast over a; shifts stay < 8 bits
    out = getattr(hax, name)(x, y)
    assert out.axes == (A, B)
    np.testing.assert_array_equal(out.array, getattr(jnp, name)(x.array, y.array[None, :]))


@pytest.mark.parametrize("name", ["bitwise_not", "bitwise_invert", "invert", "bitwise_count"])
def test_unary_bitwise_ops(name):
    x = _ints(2, (A, B))
    np.testing.assert_array_equal(getattr(hax, name)(x).array, getattr(jnp, name)(x.array))


def test_operators_pick_bitwise_for_ints_and_logical_for_bools():
    x, y = _ints(3, (A, B)), _ints(4, (B, A))
    np.testing.assert_array_equal((x & y).array, x.array & y.array.T)
    np.testing.assert_array_equal((x ^ y).array, x.array ^ y.array.T)
    np.testing.assert_array_equal((x << 1).array, x.array << 1)
    m = x > 100
    np.testing.assert_array_equal((~m).array, ~(np.asarray(x.array) > 100))


def test_packbits_and_unpackbits_round_trip_along_a_named_axis():
    Bits = hax.Axis("bits", 11)
    bits = hax.named(jax.random.bernoulli(jax.random.key(5), 0.5, (3, 11)), (A, Bits))
    packed = hax.packbits(bits, "bits")
    assert packed.shape == {"a": 3, "bits": 2}
    np.testing.assert_array_equal(packed.array, np.packbits(np.asarray(bits.array), axis=1))
    back = hax.unpackbits(packed, "bits", count=11)
    assert back.axes == (A, Bits)
    np.testing.assert_array_equal(back.array, bits.array.astype(jnp.uint8))
    little = hax.packbits(bits, Bits, bitorder="little")
    np.testing.assert_array_equal(
        little.array, np.packbits(np.asarray(bits.array), axis=1, bitorder="little")
    )
