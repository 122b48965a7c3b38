"""Named FFTs against `jnp.fft` on odd, distinct sizes (x 3, y 5, z 7)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meltemi.haliax as hax

X, Y, Z = hax.make_axes(x=3, y=5, z=7)


def _x(seed=0):
    return hax.random.normal(jax.random.key(seed), (X, Y, Z))


@pytest.mark.parametrize("name", ["fft", "ifft"])
def test_single_axis_transform_by_name_matches_jnp(name):
    a = _x()
    out = getattr(hax, name)(a, axis="y")
    assert out.axes == a.axes
    np.testing.assert_allclose(out.array, getattr(jnp.fft, name)(a.array, axis=1), atol=1e-5)


def test_default_axis_is_the_last_one():
    a = _x(1)
    np.testing.assert_allclose(hax.fft(a).array, jnp.fft.fft(a.array, axis=-1), atol=1e-5)


def test_axis_object_sets_length_and_output_axis():
    a = _x(2)
    out = hax.fft(a, axis=hax.Axis("y", 8))
    assert out.axes == (X, hax.Axis("y", 8), Z)
    np.testing.assert_allclose(out.array, jnp.fft.fft(a.array, n=8, axis=1), atol=1e-5)


def test_dict_axis_is_an_n_dimensional_transform_in_that_order():
    a = _x(3)
    out = hax.fft(a, axis={"z": None, "x": 4})
    assert out.shape == {"x": 4, "y": 5, "z": 7}
    ref = jnp.fft.fftn(a.array, s=(7, 4), axes=(2, 0))
    np.testing.assert_allclose(out.array, ref, atol=1e-4)


def test_sequence_axis_matches_fftn():
    a = _x(4)
    out = hax.ifft(a, axis=("x", "z"))
    np.testing.assert_allclose(out.array, jnp.fft.ifftn(a.array, axes=(0, 2)), atol=1e-5)


def test_rfft_halves_the_axis_and_irfft_inverts_it_for_even_lengths():
    a = hax.random.normal(jax.random.key(5), (X, hax.Axis("t", 10)))
    spec = hax.rfft(a, axis="t")
    assert spec.shape == {"x": 3, "t": 6}
    np.testing.assert_allclose(spec.array, jnp.fft.rfft(a.array, axis=1), atol=1e-5)
    back = hax.irfft(spec, axis="t")
    assert back.shape == {"x": 3, "t": 10}
    np.testing.assert_allclose(back.array, a.array, atol=1e-5)


def test_irfft_with_an_axis_gives_odd_lengths_back():
    a = _x(6)
    back = hax.irfft(hax.rfft(a, axis="z"), axis=Z)
    np.testing.assert_allclose(back.array, a.array, atol=1e-5)


def test_multi_axis_rfft_resizes_only_the_last_axis():
    a = _x(7)
    out = hax.rfft(a, axis=("x", "y"))
    assert out.shape == {"x": 3, "y": 3, "z": 7}
    np.testing.assert_allclose(out.array, jnp.fft.rfftn(a.array, axes=(0, 1)), atol=1e-4)


def test_hfft_and_ihfft_match_jnp():
    a = _x(8)
    h = hax.ihfft(a, axis="z")
    assert h.shape == {"x": 3, "y": 5, "z": 4}
    np.testing.assert_allclose(h.array, jnp.fft.ihfft(a.array, axis=2), atol=1e-5)
    out = hax.hfft(h, axis=Z)
    np.testing.assert_allclose(out.array, jnp.fft.hfft(h.array, n=7, axis=2), atol=1e-4)


def test_hfft_rejects_several_axes():
    with pytest.raises(hax.AxisError, match="hfft transforms one axis"):
        hax.hfft(_x(), axis={"x": None, "y": None})


def test_shifts_and_frequencies():
    a = _x(9)
    np.testing.assert_array_equal(hax.fftshift(a, "y").array, jnp.fft.fftshift(a.array, axes=(1,)))
    np.testing.assert_array_equal(
        hax.ifftshift(a, ("x", "z")).array, jnp.fft.ifftshift(a.array, axes=(0, 2))
    )
    np.testing.assert_allclose(hax.fftfreq(Z, 0.5).array, np.fft.fftfreq(7, 0.5), rtol=1e-6)
    f = hax.rfftfreq(Z)
    assert f.axes == (hax.Axis("z", 4),)
    np.testing.assert_allclose(f.array, np.fft.rfftfreq(7), rtol=1e-6)


def test_unknown_axis_names_the_axes_present():
    with pytest.raises(hax.AxisNotFoundError, match="'w' not found.*x=3, y=5, z=7"):
        hax.fft(_x(), axis="w")
