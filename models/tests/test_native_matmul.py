"""The native CPU decoding product (`meltemi.models._native`): equal to XLA's product, used by
decoding copies, and off cleanly when it cannot be built."""

import logging
import os

import jax
import jax.numpy as jnp
import model_testing as T
import numpy as np
import pytest

import meltemi.haliax as hax
import meltemi.haliax.nn as hnn
import meltemi.models as mm
from meltemi.haliax.nn.mup import OutputLinearMup
from meltemi.models import _generate, _native


def test_builds_here():
    """CI machines have a C++ compiler, so the kernel must build (else every other test here
    would silently test XLA's product)."""
    assert _native.available()


@pytest.mark.parametrize("rows", [1, 3, 8, 9, 25])
@pytest.mark.parametrize("n, k", [(48, 64), (40, 37), (100, 16)])
def test_kernel_equals_xla_product(rows, n, k):
    rng = np.random.default_rng(rows * 1000 + n + k)
    x = jnp.asarray(rng.standard_normal((rows, k), dtype=np.float32))
    w = jnp.asarray(rng.standard_normal((n, k), dtype=np.float32))
    got = jax.jit(_native.small_matmul, static_argnums=2)(x, _native.pack(w), n)
    assert got.shape == (rows, n)
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-5, atol=1e-5)


def test_packed_linear_equals_linear_over_named_axes():
    """Several `In` and `Out` axes, a bias, a muP output scale, inputs in another order."""
    heads, size, embed = hax.Axis("heads", 3), hax.Axis("size", 5), hax.Axis("embed", 24)
    batch, pos = hax.Axis("batch", 2), hax.Axis("position", 3)
    key = jax.random.key(0)
    for ins, outs in [((heads, size), embed), (embed, (heads, size))]:
        layer = hnn.Linear.init(ins, outs, key=key, reparam_cls=OutputLinearMup)
        layer = jax.tree.map(lambda a: a + 0.1, layer)  # a nonzero bias
        in_axes = ins if isinstance(ins, tuple) else (ins,)
        x = hax.random.normal(jax.random.key(1), (*in_axes[::-1], pos, batch))
        want = layer(x)
        got = _native.PackedLinear.from_linear(layer)(x)
        assert set(a.name for a in got.axes) == set(a.name for a in want.axes)
        np.testing.assert_allclose(got.rearrange(want.axes).array, want.array, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-gpt2"])
def test_decoding_copy_multiplies_natively_with_the_same_tokens(preset, monkeypatch):
    """A decoding copy holds `PackedLinear`s (a tied head too) and its compiled step calls the
    kernel; greedy tokens and the logits equal XLA's product's."""
    model = T.random_model(mm.get_preset(preset), seed=2)
    native = _generate._for_decoding(model)
    assert isinstance(native.blocks.blocks[0].mlp.up_proj, _native.PackedLinear)
    assert isinstance(native.lm_head, _native.PackedLinear)
    tokens = hax.named(jnp.asarray([[3, 5, 7, 2]]), ("batch", "position"))
    hlo = jax.jit(lambda m, t: m(t)).lower(native, tokens).as_text()
    assert _native.TARGET in hlo
    monkeypatch.setattr(_generate, "_native_products", lambda: False)
    plain = _generate._for_decoding(model)
    assert isinstance(plain.blocks.blocks[0].mlp.up_proj, hnn.Linear)
    np.testing.assert_allclose(native(tokens).array, plain(tokens).array, rtol=1e-5, atol=1e-5)
    prompts = [[5, 6, 7, 9], [8]]
    want = mm.generate(model, prompts, max_new_tokens=5, eos_token_id=None)
    monkeypatch.undo()
    _generate._PREPARED.clear()
    assert mm.generate(model, prompts, max_new_tokens=5, eos_token_id=None) == want


def test_off_by_environment_and_without_a_compiler(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("MELTEMI_NATIVE_MATMUL", "0")
    assert _native.available.__wrapped__() is False
    monkeypatch.setenv("MELTEMI_NATIVE_MATMUL", "1")
    monkeypatch.setenv("MELTEMI_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a "compiler" that fails
    with caplog.at_level(logging.WARNING, logger=_native.__name__):
        assert _native.available.__wrapped__() is False
    assert "building the native decoding kernels with false failed" in caplog.text
    assert "keeps XLA's product" in caplog.text
    assert not list(tmp_path.iterdir())  # no half-written library left behind


def test_built_once_per_machine_and_source(monkeypatch, tmp_path):
    monkeypatch.setenv("MELTEMI_KERNEL_CACHE", str(tmp_path))
    compiler = os.environ.get("CXX") or "g++"
    first = _native._compile(compiler)
    stamp = first.stat().st_mtime_ns
    assert _native._compile(compiler) == first and first.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]


def test_a_cache_others_can_write_is_refused(monkeypatch, tmp_path, caplog):
    # Loading a library runs its code: a cache another user could write into is not used.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("MELTEMI_KERNEL_CACHE", str(shared))
    with caplog.at_level(logging.WARNING, logger=_native.__name__):
        assert _native.available.__wrapped__() is False
    assert "not group- or world-writable" in caplog.text
    assert "chmod go-w" in caplog.text
    assert not list(shared.iterdir())
