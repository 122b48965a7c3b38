"""The LM interface: named or plain tokens, packed segments, loss, remat, unrolled layers."""

import equinox as eqx
import jax
import jax.numpy as jnp
import model_testing as T
import numpy as np
import pytest

import meltemi.haliax as hax
import meltemi.models as mm

CFG = mm.get_preset("tiny-llama")  # vocab 67, hidden 30, 3 layers, 6 heads / 2 kv heads
RNG = np.random.default_rng(0)
TOKENS = RNG.integers(0, 67, (3, 13)).astype(np.int32)  # batch 3, seq 13


@pytest.fixture(scope="module")
def model():
    return T.random_model(CFG, seed=1)


@eqx.filter_jit
def _logits(model, tokens, segment_ids):
    return model(tokens, segment_ids=segment_ids).array


@eqx.filter_jit
def _loss(model, tokens, loss_mask, z_loss):
    return model.loss_and_metrics(tokens, loss_mask=loss_mask, z_loss=z_loss)


def _shape(model, tokens, **kw):
    out = eqx.filter_eval_shape(lambda m, t: m(t, **kw), model, tokens)
    return [(a.name, a.size) for a in out.axes]


def test_plain_tokens_give_logits_over_batch_position_vocab(model):
    assert _shape(model, TOKENS) == [("batch", 3), ("position", 13), ("vocab", 67)]


def test_named_tokens_in_any_axis_order_give_the_same_axes(model):
    named = hax.named(TOKENS.T, ("position", "batch"))
    assert _shape(model, named) == [("batch", 3), ("position", 13), ("vocab", 67)]


def test_one_dimensional_tokens_give_logits_without_a_batch_axis(model):
    assert _shape(model, TOKENS[0]) == [("position", 13), ("vocab", 67)]


def test_tokens_of_rank_three_are_rejected(model):
    with pytest.raises(mm.ConfigError, match=r"\(batch, seq\) or \(seq,\) integer array"):
        model(TOKENS[None])


def test_tokens_with_unknown_axis_names_are_rejected(model):
    with pytest.raises(mm.ConfigError, match="rename them"):
        model(hax.named(TOKENS, ("batch", "seq")))


def test_packed_segments_do_not_see_each_other(model):
    a, b = TOKENS[0, :5], TOKENS[1, :8]
    tokens = np.stack([np.concatenate([a, b]), np.concatenate([b, a])])
    segs = np.array([[0] * 5 + [1] * 8, [0] * 8 + [1] * 5])
    out = np.asarray(_logits(model, tokens, segs))
    np.testing.assert_allclose(out[0, :5], out[1, 8:], atol=1e-5)  # a, first vs second
    np.testing.assert_allclose(out[0, 5:], out[1, :8], atol=1e-5)  # b, second vs first


def test_loss_is_the_masked_mean_next_token_cross_entropy_plus_z_loss(model):
    mask = np.ones((3, 13), np.float32)
    mask[1, 4:] = 0.0
    z = jnp.float32(0.3)
    total, metrics = _loss(model, TOKENS, mask, z)
    logits = np.asarray(_logits(model, TOKENS, np.zeros_like(TOKENS))).astype(np.float64)
    log_z = np.log(np.exp(logits).sum(-1))
    picked = np.take_along_axis(logits[:, :-1], TOKENS[:, 1:, None], -1)[..., 0]
    w = mask[:, :-1]
    ce = ((log_z[:, :-1] - picked) * w).sum() / w.sum()
    zl = (log_z[:, :-1] ** 2 * w).sum() / w.sum()
    np.testing.assert_allclose(float(metrics["cross_entropy"]), ce, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["z_loss"]), zl, rtol=1e-5)
    np.testing.assert_allclose(float(total), ce + 0.3 * zl, rtol=1e-5)


def test_jitted_loss_does_not_recompile_on_new_data(model):
    traces = []

    @eqx.filter_jit
    def step(m, tokens):
        traces.append(1)
        return m.loss(tokens)

    step(model, TOKENS)
    step(model, (TOKENS + 1) % 67)
    assert len(traces) == 1


def test_remat_policies_give_the_same_gradients():
    cfg = CFG.replace(num_layers=2)
    grads = []
    for remat in ("none", "full"):
        m = T.random_model(cfg.replace(remat=remat), seed=2)
        g = eqx.filter_jit(eqx.filter_grad(lambda m, t: m.loss(t)))(m, TOKENS)
        grads.append(jax.tree.leaves(g))
    for a, b in zip(*grads, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_unrolled_layers_match_the_scan(model):
    unrolled = T.random_model(CFG.replace(scan_layers=False), seed=1)
    assert type(unrolled.blocks).__name__ == "BlockSeq"
    np.testing.assert_allclose(
        np.asarray(_logits(unrolled, TOKENS, np.zeros_like(TOKENS))),
        np.asarray(_logits(model, TOKENS, np.zeros_like(TOKENS))),
        atol=1e-5,
    )


def test_init_is_deterministic_and_norms_start_at_identity():
    cfg = mm.get_preset("tiny-qwen3-moe")
    a, b = mm.init(cfg, key=jax.random.key(7)), mm.init(cfg, key=jax.random.key(7))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    np.testing.assert_array_equal(np.asarray(a.blocks.stacked.attn.q_norm.weight.array), 1.0)
    assert a.param_count == mm.param_count(cfg)
    assert a.blocks.stacked.mlp.gate_proj.axes[0].name == "layers"
