"""The blockwise cross-entropy head: equal to the full computation, without the full logits."""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import model_testing as T
import numpy as np
import pytest

import meltemi.models as mm
from meltemi.models._loss import blockwise_cross_entropy

TOKENS_, D, V, BLOCK = 39, 7, 67, 16  # 67 = 4 blocks of 16 + a tail of 3
_k = jax.random.split(jax.random.key(0), 4)
H = jax.random.normal(_k[0], (TOKENS_, D))
W = jax.random.normal(_k[1], (V, D))
TARGETS = jax.random.randint(_k[2], (TOKENS_,), 0, V).at[:3].set(jnp.array([0, V - 1, V - 2]))
MASK = (jax.random.uniform(_k[3], (TOKENS_,)) > 0.3).astype(jnp.float32)
Z = 1e-2
CAP = 1.5  # logits here have std ~2.6, so tanh saturates: the cap changes loss and gradients


def _full(h, w, softcap=None):
    """Plain jax.numpy: the whole (tokens, vocab) logits at once."""
    logits = h @ w.T
    if softcap is not None:
        logits = softcap * jnp.tanh(logits / softcap)
    lse = jax.nn.logsumexp(logits, axis=-1)
    ce = lse - jnp.take_along_axis(logits, TARGETS[:, None], axis=-1)[:, 0]
    return jnp.sum(MASK * ce), jnp.sum(MASK * lse**2)


def _blockwise(h, w, block=BLOCK, softcap=None):
    return blockwise_cross_entropy(h, w, TARGETS, MASK, block=block, softcap=softcap)


@pytest.mark.parametrize("softcap", [None, CAP])
@pytest.mark.parametrize("block", [BLOCK, 1, 67, 100])
def test_blockwise_loss_equals_the_full_computation(block, softcap):
    ce, z = jax.jit(_blockwise, static_argnums=(2, 3))(H, W, block, softcap)
    ref_ce, ref_z = _full(H, W, softcap)
    np.testing.assert_allclose(float(ce), float(ref_ce), rtol=1e-5)
    np.testing.assert_allclose(float(z), float(ref_z), rtol=1e-5)


def test_soft_cap_changes_the_loss():
    # Guards the soft-cap tests against a cap too loose to matter at these logits.
    capped, plain = _full(H, W, CAP), _full(H, W)
    assert abs(float(capped[0]) - float(plain[0])) > 0.1 * abs(float(plain[0]))


@pytest.mark.parametrize("softcap", [None, CAP])
def test_blockwise_gradients_equal_the_full_computation(softcap):
    def total(fn):
        return lambda h, w: fn(h, w, softcap=softcap)[0] + Z * fn(h, w, softcap=softcap)[1]

    got = jax.jit(jax.grad(total(_blockwise), argnums=(0, 1)))(H, W)
    ref = jax.grad(total(_full), argnums=(0, 1))(H, W)
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)
    # Masked tokens get no gradient.
    masked = np.asarray(MASK) == 0
    assert masked.any() and np.all(np.asarray(got[0])[masked] == 0)


def _model_loss(model, tokens, loss_mask, segment_ids):
    return model.loss_and_metrics(tokens, loss_mask=loss_mask, segment_ids=segment_ids, z_loss=Z)


# untied and tied heads; Gemma 2 adds the final-logit soft cap (4.0)
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-gemma", "tiny-gemma2"])
def test_model_loss_and_gradients_equal_the_full_logits_path(preset):
    cfg = mm.get_preset(preset)
    assert not cfg.blockwise_loss  # vocab 67 is below the default block
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, cfg.vocab_size, (3, 13)).astype(np.int32)
    loss_mask = (rng.random((3, 13)) > 0.2).astype(np.float32)
    segments = np.repeat(np.array([[0] * 7 + [1] * 6]), 3, axis=0).astype(np.int32)
    grad = eqx.filter_jit(eqx.filter_value_and_grad(_model_loss, has_aux=True))
    results = {}
    for block in (None, BLOCK):
        model = T.random_model(cfg.replace(loss_vocab_block=block), seed=2)
        assert model.config.blockwise_loss == (block is not None)
        results[block] = grad(model, tokens, loss_mask, segments)
    (full, full_metrics), full_grads = results[None]
    (blk, blk_metrics), blk_grads = results[BLOCK]
    np.testing.assert_allclose(float(blk), float(full), rtol=1e-5)
    for key in ("cross_entropy", "z_loss"):
        np.testing.assert_allclose(float(blk_metrics[key]), float(full_metrics[key]), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(blk_grads), jax.tree.leaves(full_grads), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)


def test_blockwise_loss_is_on_by_default_above_the_block_size():
    cfg = mm.get_preset("tiny-llama")
    assert cfg.loss_vocab_block == 8192
    assert cfg.replace(vocab_size=8193).blockwise_loss
    assert not cfg.replace(vocab_size=8192).blockwise_loss
    assert mm.get_preset("marin-32b").blockwise_loss


def test_gemma2_uses_the_blockwise_loss_above_the_block_size():
    cfg = mm.get_preset("tiny-gemma2")
    assert cfg.final_logit_softcap == 4.0
    assert cfg.replace(loss_vocab_block=16).blockwise_loss


def test_non_positive_soft_cap_is_rejected():
    with pytest.raises(ValueError, match=r"softcap=0.0: must be a positive float or None"):
        _blockwise(H, W, softcap=0.0)


def test_non_positive_block_is_rejected_with_the_fix():
    with pytest.raises(mm.ConfigError, match=r"ModelConfig.loss_vocab_block=0: must be a positive"):
        mm.get_preset("tiny-llama").replace(loss_vocab_block=0)


def test_compiled_gradient_never_holds_the_full_logits_and_needs_less_memory():
    # vocab 4001 = 7 blocks of 512 + 417; 4 x 64 tokens: the f32 logits are 4.1 MB.
    cfg = mm.get_preset("tiny-llama").replace(vocab_size=4001, max_seq_len=64)
    tokens = np.random.default_rng(0).integers(0, 4001, (4, 64)).astype(np.int32)
    compiled = {}
    for block in (None, 512):
        model = T.random_model(cfg.replace(loss_vocab_block=block), seed=0)
        step = eqx.filter_jit(eqx.filter_grad(lambda m, t: m.loss(t, z_loss=Z)))
        compiled[block] = step.lower(model, tokens).lowered.compile()
    full_hlo, blk_hlo = compiled[None].as_text(), compiled[512].as_text()
    logits_shape = re.compile(r"f32\[(4,64|256),4001\]")
    assert logits_shape.search(full_hlo)  # the full path does build them ...
    assert not logits_shape.search(blk_hlo)  # ... the blockwise one never does
    full_tmp = compiled[None].memory_analysis().temp_size_in_bytes
    blk_tmp = compiled[512].memory_analysis().temp_size_in_bytes
    assert blk_tmp < 0.35 * full_tmp, (blk_tmp, full_tmp)
