"""Blockwise attention (`ModelConfig.attention_query_block`): exact, and lighter in memory."""

import jax
import model_testing as T
import numpy as np
import pytest

import meltemi.models as mm

SEQ = 15
BASE = mm.get_preset("tiny-qwen3").replace(attention_query_block=None)
TOKENS = np.random.default_rng(4).integers(0, BASE.vocab_size, (3, SEQ)).astype(np.int32)
SEGMENTS = np.repeat(np.array([[0] * 6 + [1] * 9]), 3, axis=0).astype(np.int32)


def _model(block):
    # The same seed gives the same weights whatever the (static) query block.
    return T.random_model(BASE.replace(attention_query_block=block), seed=8)


def _loss(model):
    return model.loss(TOKENS, segment_ids=SEGMENTS, z_loss=1e-4)


def test_blockwise_attention_gives_the_whole_attention_logits():
    model, blocked = _model(None), _model(5)  # 3 blocks of 5 queries
    assert blocked.blocks.stacked.attn_options.query_block == 5
    want = np.asarray(jax.jit(lambda m: m(TOKENS, segment_ids=SEGMENTS).array)(model))
    got = np.asarray(jax.jit(lambda m: m(TOKENS, segment_ids=SEGMENTS).array)(blocked))
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_blockwise_attention_gives_the_whole_attention_gradients():
    want = jax.jit(jax.grad(_loss))(_model(None))
    got = jax.jit(jax.grad(_loss))(_model(5))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5)


def test_a_block_that_does_not_divide_the_sequence_runs_whole():
    def jaxpr(block):  # layer remat off: a `remat2` (jax.checkpoint) can only be a query block
        cfg = BASE.replace(attention_query_block=block, remat="none")
        return str(jax.make_jaxpr(lambda m: m(TOKENS))(T.random_model(cfg, seed=8)))

    assert "remat2" in jaxpr(5)
    assert "remat2" not in jaxpr(4)  # 15 % 4 != 0


def test_blockwise_attention_keeps_one_block_of_scores_for_the_backward_pass():
    cfg = BASE.replace(max_seq_len=256, scan_layers=False, remat="none", num_layers=1)
    tokens = np.random.default_rng(5).integers(0, cfg.vocab_size, (3, 256)).astype(np.int32)

    def temp_bytes(block):
        model = T.random_model(cfg.replace(attention_query_block=block), seed=1)
        grad = jax.jit(jax.grad(lambda m, t: m.loss(t)))
        return grad.lower(model, tokens).compile().memory_analysis().temp_size_in_bytes

    # One layer's scores: 3 x 6 heads x 256^2 x 4 B = 4.5 MiB per copy; blocks of 32
    # queries keep 1/8 of a copy alive at a time.
    whole, blocked = temp_bytes(None), temp_bytes(32)
    assert blocked < whole / 2, (blocked, whole)


@pytest.mark.parametrize("bad", [0, -4, 2.5])
def test_a_non_positive_query_block_is_rejected(bad):
    with pytest.raises(mm.ConfigError, match=f"attention_query_block={bad}"):
        BASE.replace(attention_query_block=bad)
