"""Mixture of experts: routing, the dropless and capacity paths, auxiliary losses."""

import equinox as eqx
import jax
import jax.numpy as jnp
import model_testing as T
import numpy as np

import meltemi.models as mm
from meltemi.models import _moe_kernels as K

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
    dispatch, combine, kept = K.capacity_dispatch(w, e, E, 3)
    counts = np.asarray(dispatch).sum(axis=1)  # [G, E, C]: each slot holds at most one token
    assert counts.max() == 1
    for g in range(G):
        assigned = np.bincount(np.asarray(e[g]).ravel(), minlength=E)
        np.testing.assert_array_equal(np.asarray(dispatch[g]).sum((0, 2)), np.minimum(assigned, 3))
    assert 0 < float(np.mean(np.asarray(kept))) < 1
    np.testing.assert_allclose(
        np.asarray(combine).sum((2, 3)), np.asarray((w * kept).sum(-1)), rtol=1e-6
    )


def test_uniform_routing_gives_load_balancing_loss_top_k():
    logits = jnp.zeros((S, E))
    experts = jnp.stack([jnp.arange(S) % E, (jnp.arange(S) + 1) % E], -1)[: (S // E) * E]
    logits = logits[: len(experts)]
    lb, z = K.aux_losses(logits, jax.nn.softmax(logits), experts, None)
    np.testing.assert_allclose(float(lb), TOPK, rtol=1e-6)
    np.testing.assert_allclose(float(z), np.log(E) ** 2, rtol=1e-6)


def test_aux_losses_ignore_masked_tokens():
    flat = LOGITS.reshape(-1, E)
    probs, _, e = K.route(flat, TOPK, normalize=True)
    mask = jnp.arange(flat.shape[0]) < 10
    masked = K.aux_losses(flat, probs, e, mask)
    subset = K.aux_losses(flat[:10], probs[:10], e[:10], None)
    np.testing.assert_allclose(np.asarray(masked), np.asarray(subset), rtol=1e-6)


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
