"""Mixture of experts: routing, the dropless and capacity paths, auxiliary losses."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import model_testing as T
import numpy as np
import pytest

import meltemi.models as mm
from meltemi.models.moe import _kernels as K

G, S, D, E, I, TOPK = 3, 13, 7, 5, 11, 2  # groups, seq, embed, experts, expert mlp, top-k
_k = jax.random.split(jax.random.key(0), 5)
X = jax.random.normal(_k[0], (G, S, D))
LOGITS = jax.random.normal(_k[1], (G, S, E))
W_GATE, W_UP = jax.random.normal(_k[2], (E, D, I)), jax.random.normal(_k[3], (E, D, I))
W_DOWN = jax.random.normal(_k[4], (E, I, D)) / 3


def _reference(x, weights, experts):
    """Per token, per slot: the plain definition of a top-k MoE layer."""
    x, w, e = map(np.asarray, (x, weights, experts))
    wg, wu, wd = map(np.asarray, (W_GATE, W_UP, W_DOWN))
    out = np.zeros(x.shape[:-1] + (D,))
    for idx in np.ndindex(*x.shape[:-1]):
        for j in range(TOPK):
            ex = e[idx + (j,)]
            h = np.asarray(jax.nn.silu(x[idx] @ wg[ex])) * (x[idx] @ wu[ex])
            out[idx] += w[idx + (j,)] * (h @ wd[ex])
    return out


def test_router_renormalises_the_top_k_only_when_asked():
    _, w_norm, e1 = K.route(LOGITS, TOPK, normalize=True)
    probs, w_raw, e2 = K.route(LOGITS, TOPK, normalize=False)
    np.testing.assert_allclose(np.asarray(w_norm.sum(-1)), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(e1), np.asarray(e2))
    top = np.sort(np.asarray(probs), -1)[..., ::-1][..., :TOPK]
    np.testing.assert_allclose(np.asarray(w_raw), top, rtol=1e-6)


def test_dropless_path_matches_the_per_token_definition():
    _, w, e = K.route(LOGITS, TOPK, normalize=True)
    out = jax.jit(K.dropless, static_argnums=6)(
        X.reshape(-1, D),
        w.reshape(-1, TOPK),
        e.reshape(-1, TOPK),
        W_GATE,
        W_UP,
        W_DOWN,
        jax.nn.silu,
    )
    np.testing.assert_allclose(np.asarray(out).reshape(G, S, D), _reference(X, w, e), atol=1e-4)


def test_capacity_dispatch_drops_only_assignments_past_capacity():
    _, w, e = K.route(LOGITS, TOPK, normalize=True)
    dispatch, combine, kept = jax.jit(K.capacity_dispatch, static_argnums=(2, 3))(w, e, E, 3)
    counts = np.asarray(dispatch).sum(axis=1)  # [G, E, C]: each slot holds at most one token
    assert counts.max() == 1
    for g in range(G):
        assigned = np.bincount(np.asarray(e[g]).ravel(), minlength=E)
        np.testing.assert_array_equal(np.asarray(dispatch[g]).sum((0, 2)), np.minimum(assigned, 3))
    assert 0 < float(np.mean(np.asarray(kept))) < 1
    np.testing.assert_allclose(
        np.asarray(combine).sum((2, 3)), np.asarray((w * kept).sum(-1)), rtol=1e-6
    )


# The kernels are composed under one jit per test: run eagerly, every op compiles on its own.
@jax.jit
def _uniform_routing_losses():
    logits = jnp.zeros((S, E))
    experts = jnp.stack([jnp.arange(S) % E, (jnp.arange(S) + 1) % E], -1)[: (S // E) * E]
    logits = logits[: len(experts)]
    f, p, z = K.router_statistics(logits, jax.nn.softmax(logits), experts, None)
    scopes = ("all_layers", "per_layer")
    return [K.load_balancing_loss(f[None], p[None], scope=s) for s in scopes], z


def test_uniform_routing_gives_load_balancing_loss_top_k():
    losses, z = _uniform_routing_losses()
    for lb in losses:
        np.testing.assert_allclose(float(lb), TOPK, rtol=1e-6)
    np.testing.assert_allclose(float(z), np.log(E) ** 2, rtol=1e-6)


@jax.jit
def _masked_and_subset_statistics(logits):
    flat = logits.reshape(-1, E)
    probs, _, e = K.route(flat, TOPK, normalize=True)
    mask = jnp.arange(flat.shape[0]) < 10
    masked = K.router_statistics(flat, probs, e, mask)
    subset = K.router_statistics(flat[:10], probs[:10], e[:10], None)
    return masked, subset


def test_router_statistics_ignore_masked_tokens():
    masked, subset = _masked_and_subset_statistics(LOGITS)
    for a, b in zip(masked, subset, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


def _layer_logits(num_layers=4, tokens=39, seed=7):
    # Layers routed very differently (a per-layer bias), where pooling and averaging disagree.
    rng = np.random.default_rng(seed)
    bias = 2.0 * rng.standard_normal((num_layers, 1, E))
    return (rng.standard_normal((num_layers, tokens, E)) + bias).astype(np.float32)


@functools.partial(jax.jit, static_argnames="scope")
def _ours_loss(logits, mask, scope):
    stats = [K.router_statistics(x, *K.route(x, TOPK, normalize=False)[::2], mask) for x in logits]
    f, p = jnp.stack([s[0] for s in stats]), jnp.stack([s[1] for s in stats])
    return K.load_balancing_loss(f, p, scope=scope)


def _ours(logits, mask, scope):
    return float(_ours_loss(logits, mask, scope=scope))


def test_load_balancing_loss_equals_transformers_load_balancing_loss_func():
    import torch
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    logits = _layer_logits()
    mask = np.arange(39) % 13 < 10  # (batch 3, seq 13) flattened, last 3 of each row padded
    gate = tuple(torch.tensor(x) for x in logits)
    for m in (None, mask):
        theirs = float(
            load_balancing_loss_func(
                gate, E, TOPK, None if m is None else torch.tensor(m.reshape(3, 13), dtype=int)
            )
        )
        assert _ours(jnp.asarray(logits), None if m is None else jnp.asarray(m), "all_layers") == (
            pytest.approx(theirs, rel=1e-5)
        )
    # The mean of per-layer losses is a different objective on these inputs.
    assert abs(_ours(jnp.asarray(logits), None, "per_layer") - theirs) > 0.05


def test_model_load_balancing_metric_equals_transformers_aux_loss(tmp_path):
    import hf_harness as H
    import torch

    from meltemi.models import hf

    torch_model = H.random_hf_model("tiny-mixtral", seed=3)
    model, _ = hf.load(H.save_hf(torch_model, tmp_path))
    valid = np.arange(13) < np.array([[13], [10], [7]])  # right padding
    with torch.no_grad():
        out = torch_model(
            torch.tensor(TOKENS, dtype=torch.long),
            attention_mask=torch.tensor(valid, dtype=torch.long),
            output_router_logits=True,
        )
    segments = np.where(valid, 0, -1).astype(np.int32)
    _, metrics = eqx.filter_jit(lambda m, t, s: m.loss_and_metrics(t, segment_ids=s))(
        model, TOKENS, segments
    )
    np.testing.assert_allclose(float(metrics["load_balancing"]), float(out.aux_loss), rtol=1e-5)


def test_unknown_load_balancing_scope_is_rejected():
    with pytest.raises(mm.ConfigError, match=r"load_balancing_scope='layer'.*all_layers"):
        mm.MoeConfig(num_experts=5, top_k=2, expert_dim=4, load_balancing_scope="layer")


TOKENS = np.random.default_rng(0).integers(0, 67, (3, 13)).astype(np.int32)


@eqx.filter_jit
def _run(model, tokens):
    return model(tokens).array, model.loss_and_metrics(tokens)[1]


def test_capacity_and_dropless_paths_agree_when_nothing_overflows():
    cfg = mm.get_preset("tiny-mixtral")
    roomy = cfg.replace(moe=cfg.moe.replace(dispatch="capacity", capacity_factor=E / TOPK))
    dropless, capacity = T.random_model(cfg, seed=4), T.random_model(roomy, seed=4)
    (a, ma), (b, mb) = _run(dropless, TOKENS), _run(capacity, TOKENS)
    assert float(mb["dropped_fraction"]) == 0.0
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    np.testing.assert_allclose(float(ma["load_balancing"]), float(mb["load_balancing"]), rtol=1e-6)


def test_tight_capacity_drops_tokens_and_reports_it():
    cfg = mm.get_preset("tiny-qwen3-moe")
    tight = cfg.replace(moe=cfg.moe.replace(dispatch="capacity", capacity_factor=0.5))
    _, metrics = _run(T.random_model(tight, seed=4), TOKENS)
    # capacity = ceil(0.5 * 13 * 2 / 5) = 3 slots for 26 assignments over 5 experts.
    assert 0.4 < float(metrics["dropped_fraction"]) < 0.9
