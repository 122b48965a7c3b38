"""Attention backends (`ModelConfig.attention_backend`) compute the same function as `xla`.

fp32, odd sizes, grouped-query attention with one KV head, windows shorter than the sequence,
packed segments and logit soft-capping. The splash kernel runs in Pallas' interpreter here (the
CPU has no TPU); the selection logic is tested with the platform patched.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import model_testing as T
import numpy as np
import pytest

import meltemi.haliax as hax
import meltemi.models as mm
from meltemi.models import _attention as A

TOL = 1e-5


def _axes(*pairs):
    return tuple(hax.Axis(n, s) for n, s in pairs)


def _qkv(batch, seq, kv_heads, group, head, seed=0):
    rng = np.random.default_rng(seed)
    q_axes = _axes(
        ("batch", batch),
        ("position", seq),
        ("kv_heads", kv_heads),
        ("q_heads_per_group", group),
        ("head_size", head),
    )
    kv_axes = _axes(
        ("batch", batch), ("key_position", seq), ("kv_heads", kv_heads), ("head_size", head)
    )
    q = hax.named(rng.standard_normal([a.size for a in q_axes]).astype(np.float32), q_axes)
    k = hax.named(rng.standard_normal([a.size for a in kv_axes]).astype(np.float32), kv_axes)
    v = hax.named(rng.standard_normal([a.size for a in kv_axes]).astype(np.float32), kv_axes)
    return q, k, v


def _segments(batch, seq, cut):
    ids = np.repeat((np.arange(seq) >= cut)[None].astype(np.int32), batch, 0)
    ids[0] = 0  # one row is a single document
    return hax.named(ids, _axes(("batch", batch), ("position", seq)))


def _dense_reference(q, k, v, window, segments, softcap, scale):
    """Plain jax.numpy attention, independent of `_attention` (heads grouped as HF's repeat_kv)."""
    qa = q.rearrange(("batch", "kv_heads", "q_heads_per_group", "position", "head_size")).array
    ka = k.rearrange(("batch", "kv_heads", "key_position", "head_size")).array
    va = v.rearrange(("batch", "kv_heads", "key_position", "head_size")).array
    logits = jnp.einsum("bkgqd,bksd->bkgqs", qa, ka) * scale
    if softcap is not None:
        logits = softcap * jnp.tanh(logits / softcap)
    n = qa.shape[3]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    allowed = (j <= i) & ((i - j < window) if window else True)
    allowed = np.broadcast_to(allowed, (qa.shape[0], n, n))
    if segments is not None:
        s = segments.array
        allowed = allowed & (s[:, :, None] == s[:, None, :])
    logits = jnp.where(allowed[:, None, None], logits, -jnp.inf)
    out = jnp.einsum("bkgqs,bksd->bkgqd", jax.nn.softmax(logits, -1), va)
    return out


@eqx.filter_jit
def _run(backend, q, k, v, segments, window, softcap, scale):
    spec = A.MaskSpec.self_attention(q.resolve_axis("position"), segments)
    out = A.attention(q, k, v, spec, backend=backend, window=window, softcap=softcap, scale=scale)
    return out.rearrange(("batch", "kv_heads", "q_heads_per_group", "position", "head_size")).array


@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("with_segments", [False, True])
def test_xla_and_dot_product_attention_equal_a_plain_reference(window, with_segments):
    q, k, v = _qkv(3, 13, 1, 5, 6)  # one KV head for five query heads
    seg = _segments(3, 13, 6) if with_segments else None
    want = _dense_reference(q, k, v, window, seg, None, 0.37)
    for backend in ("xla", "dot_product_attention"):
        got = _run(backend, q, k, v, seg, window, None, 0.37)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=TOL, err_msg=backend)


def test_soft_capping_is_applied_by_every_cpu_backend():
    q, k, v = _qkv(2, 11, 2, 3, 4, seed=1)
    q = q * 4.0  # large logits, so the cap bites
    want = _dense_reference(q, k, v, 5, None, 2.0, 0.5)
    uncapped = _dense_reference(q, k, v, 5, None, None, 0.5)
    assert float(jnp.max(jnp.abs(want - uncapped))) > 1e-2
    for backend in ("xla", "dot_product_attention"):
        got = _run(backend, q, k, v, None, 5, 2.0, 0.5)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=TOL, err_msg=backend)


def test_dot_product_attention_gradients_equal_xla():
    q, k, v = _qkv(2, 9, 1, 3, 4, seed=2)
    seg = _segments(2, 9, 4)

    def loss(backend):
        def f(q, k, v):
            return jnp.sum(jnp.sin(_run(backend, q, k, v, seg, 3, None, 0.5)))

        return jax.jit(jax.grad(f, argnums=(0, 1, 2)))(q, k, v)

    for g, w in zip(jax.tree.leaves(loss("dot_product_attention")), jax.tree.leaves(loss("xla"))):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=TOL)


def test_splash_kernel_equals_the_reference_in_the_pallas_interpreter(monkeypatch):
    monkeypatch.setattr(A, "_platform", lambda: "tpu")
    monkeypatch.setattr(A, "_SPLASH_INTERPRET", True)
    q, k, v = _qkv(2, 128, 1, 3, 8, seed=3)  # splash works on whole blocks of 128
    seg = _segments(2, 128, 50)
    assert A.resolve_backend("auto", aligned=True, q_len=128, kv_len=128) == "splash"
    want = _dense_reference(q, k, v, 17, seg, 5.0, 0.3)
    got = _run("splash", q, k, v, seg, 17, 5.0, 0.3)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=TOL)


@pytest.mark.parametrize(
    "platform, aligned, length, want",
    [
        ("cpu", True, 256, "xla"),
        ("gpu", True, 13, "dot_product_attention"),
        ("gpu", False, 256, "dot_product_attention"),
        ("tpu", True, 256, "splash"),
        ("tpu", True, 100, "xla"),  # not a multiple of the splash block
        ("tpu", False, 256, "xla"),  # a decoding step against a KV cache
    ],
)
def test_auto_picks_the_best_backend_of_the_platform(monkeypatch, platform, aligned, length, want):
    monkeypatch.setattr(A, "_platform", lambda: platform)
    got = A.resolve_backend("auto", aligned=aligned, q_len=length, kv_len=length)
    assert got == want


def test_explicit_backends_are_kept(monkeypatch):
    monkeypatch.setattr(A, "_platform", lambda: "cpu")
    for backend in ("xla", "dot_product_attention"):
        assert A.resolve_backend(backend, aligned=True, q_len=13, kv_len=13) == backend


def test_splash_without_a_tpu_is_an_error_naming_the_key_the_value_and_the_fix(monkeypatch):
    monkeypatch.setattr(A, "_platform", lambda: "cpu")
    cfg = mm.get_preset("tiny-mistral").replace(attention_backend="splash")
    model = T.random_model(cfg, seed=1)
    with pytest.raises(
        mm.ConfigError,
        match=r"attention_backend='splash'.*needs a TPU.*'cpu'.*Fix: attention_backend='auto'",
    ):
        model(np.zeros((1, 7), np.int32))


def test_an_unknown_backend_suggests_the_closest():
    with pytest.raises(mm.ConfigError, match=r"attention_backend='dot_product'.*"):
        mm.get_preset("tiny-llama").replace(attention_backend="dot_product")


# -- whole models: training forward/backward and the KV-cache decode path ----------------------

TOKENS = np.random.default_rng(4).integers(0, 67, (3, 13)).astype(np.int32)
SEGMENTS = np.repeat(np.array([[0] * 6 + [1] * 7]), 3, axis=0).astype(np.int32)


# Two layers, one local and one global: the per-layer window is a traced flag in the scan.
LOCAL_GLOBAL = dict(num_layers=2, layer_types=("sliding_attention", "full_attention"))


def _model(preset, backend, **changes):
    return T.random_model(
        mm.get_preset(preset).replace(attention_backend=backend, **changes), seed=8
    )


def test_model_logits_and_gradients_equal_across_backends():
    @eqx.filter_jit
    def run(m):
        logits = m(TOKENS, segment_ids=SEGMENTS).array
        grads = eqx.filter_grad(lambda mm_: mm_.loss(TOKENS, segment_ids=SEGMENTS))(m)
        return logits, grads

    want_logits, want_grads = run(_model("tiny-gemma3", "xla", **LOCAL_GLOBAL))
    got_logits, got_grads = run(_model("tiny-gemma3", "dot_product_attention", **LOCAL_GLOBAL))
    np.testing.assert_allclose(np.asarray(got_logits), np.asarray(want_logits), atol=TOL)
    for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=TOL)


def test_query_blocks_with_a_window_equal_the_whole_attention():
    whole = _model("tiny-gemma3", "xla", attention_query_block=None, **LOCAL_GLOBAL)
    blocked = _model("tiny-gemma3", "xla", attention_query_block=4, **LOCAL_GLOBAL)
    tokens = np.random.default_rng(5).integers(0, 67, (2, 16)).astype(np.int32)
    f = eqx.filter_jit(lambda m: m(tokens).array)
    np.testing.assert_allclose(np.asarray(f(blocked)), np.asarray(f(whole)), atol=TOL)


def test_cached_generation_is_the_same_with_dot_product_attention():
    prompts = [[3, 17, 29, 4, 41, 8, 9, 10], [5, 60]]
    outs = [
        mm.generate(
            _model("tiny-gemma3", b, **LOCAL_GLOBAL), prompts, max_new_tokens=9, eos_token_id=None
        )
        for b in ("xla", "dot_product_attention")
    ]
    assert outs[0] == outs[1]
    assert [len(o) for o in outs[0]] == [9, 9]


# -- config validation of the attention fields --------------------------------------------------


@pytest.mark.parametrize(
    "change, match",
    [
        ({"sliding_window": 0}, r"sliding_window=0: must be a positive int"),
        ({"layer_types": ("sliding_attention",)}, r"layer_types=.*per layer \(3 layers\)"),
        ({"layer_types": ("local",) * 3}, r"layer_types=.*needs one of"),
        ({"attn_logit_softcap": -1.0}, r"attn_logit_softcap=-1.0: must be > 0"),
        ({"query_pre_attn_scalar": 0.0}, r"query_pre_attn_scalar=0.0: must be > 0"),
    ],
)
def test_bad_attention_fields_name_the_field_and_the_value(change, match):
    with pytest.raises(mm.ConfigError, match=match):
        mm.get_preset("tiny-gemma2").replace(**change)


def test_a_window_on_a_family_without_one_is_refused():
    with pytest.raises(mm.ConfigError, match=r"sliding_window=4: family 'llama' has no"):
        mm.get_preset("tiny-llama").replace(sliding_window=4)


def test_gemma_layer_pattern_follows_the_number_of_layers():
    cfg = mm.get_preset("tiny-gemma2")
    assert cfg.sliding_layers == (True, False, True)
    assert cfg.replace(num_layers=4).sliding_layers == (True, False, True, False)
    six = mm.get_preset("tiny-gemma3").sliding_layers
    assert six == (True,) * 5 + (False,)
