"""RL advantages and losses (meltemi.levanter.rl) against literal numpy transcriptions.

Each `_np_*` function below is the formula of docs/design/levanter.md ("RL objectives") written
out with Python loops over sequences and tokens, independent of the JAX code. Everything runs in
float64 (jax x64), so 1e-6 is far above rounding. Gradients are checked the same way (the
derivative written out by hand), and the sampled-token distillation gradient is checked against
the exact full-vocabulary KL gradient by enumerating the vocabulary.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meltemi.levanter import rl

TOL = 1e-6


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


# --- literal transcriptions -------------------------------------------------------------------


def _np_grpo(rewards, scale_by_std, eps):
    out = np.zeros_like(rewards)
    for p, group in enumerate(rewards):
        n = len(group)
        mean = sum(group) / n
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / n)
        for i, r in enumerate(group):
            out[p, i] = (r - mean) / (std + eps) if scale_by_std else r - mean
    return out


def _np_rloo(rewards):
    out = np.zeros_like(rewards)
    for p, group in enumerate(rewards):
        n = len(group)
        for i, r in enumerate(group):
            out[p, i] = r - sum(group[j] for j in range(n) if j != i) / (n - 1)
    return out


def _np_aggregate(values, mask, aggregation):
    b_count, t_count = mask.shape
    if aggregation == "token":
        total = sum(values[b][t] for b in range(b_count) for t in range(t_count) if mask[b][t])
        return total / max(sum(1 for b in range(b_count) for t in range(t_count) if mask[b][t]), 1)
    means = []
    for b in range(b_count):
        tokens = [values[b][t] for t in range(t_count) if mask[b][t]]
        if tokens:
            means.append(sum(tokens) / len(tokens))
    return sum(means) / max(len(means), 1)


def _np_policy(logp, old, adv, mask, clip_low, clip_high, ref, beta, aggregation, w):
    b_count, t_count = mask.shape
    loss_t = np.zeros((b_count, t_count))
    pg_t = np.zeros((b_count, t_count))
    k3_t = np.zeros((b_count, t_count))
    clipped = np.zeros((b_count, t_count))
    grad = np.zeros((b_count, t_count))  # d loss_t / d logp_t
    for b in range(b_count):
        for t in range(t_count):
            if not mask[b][t]:
                continue
            a = adv[b][t] if adv.ndim == 2 else adv[b]
            rho = math.exp(logp[b][t] - old[b][t])
            clipped_rho = min(max(rho, 1 - clip_low), 1 + clip_high)
            weight = 1.0 if w is None else w[b][t]
            pg_t[b][t] = -min(rho * a, clipped_rho * a) * weight
            unclipped_branch = rho * a <= clipped_rho * a
            grad[b][t] = -rho * a * weight if unclipped_branch else 0.0
            clipped[b][t] = (a > 0 and rho > 1 + clip_high) or (a < 0 and rho < 1 - clip_low)
            loss_t[b][t] = pg_t[b][t]
            if ref is not None:
                d = ref[b][t] - logp[b][t]
                k3_t[b][t] = math.exp(d) - d - 1
                loss_t[b][t] += beta * k3_t[b][t]
                grad[b][t] += beta * (1 - math.exp(d))
    return loss_t, pg_t, k3_t, clipped, grad


def _np_is_weights(prox, behav, mask, cap, level):
    w = np.zeros(mask.shape)
    for b in range(mask.shape[0]):
        seq = sum(prox[b][t] - behav[b][t] for t in range(mask.shape[1]) if mask[b][t])
        for t in range(mask.shape[1]):
            if mask[b][t]:
                log_w = prox[b][t] - behav[b][t] if level == "token" else seq
                w[b][t] = min(math.exp(log_w), cap)
    return w


def _np_full_kl(student_logits, teacher_logits):
    def log_softmax(z):
        top = max(z)
        log_total = math.log(sum(math.exp(v - top) for v in z)) + top
        return [v - log_total for v in z]

    b_count, t_count, _ = student_logits.shape
    kl = np.zeros((b_count, t_count))
    for b in range(b_count):
        for t in range(t_count):
            ls = log_softmax(student_logits[b][t])
            lt = log_softmax(teacher_logits[b][t])
            kl[b][t] = sum(math.exp(s) * (s - q) for s, q in zip(ls, lt))
    return kl


# --- data -------------------------------------------------------------------------------------


def _batch(seed=0, b=7, t=11):
    """Per-token log-probs with ratios spread enough to clip both ways; ragged masks, one empty
    sequence, NaN where the mask is 0 (which must not leak into anything)."""
    rng = np.random.default_rng(seed)
    old = np.log(rng.uniform(0.05, 0.95, (b, t)))
    logp = old + rng.normal(0, 0.35, (b, t))
    ref = old + rng.normal(0, 0.2, (b, t))
    lengths = rng.integers(1, t + 1, b)
    lengths[3] = 0
    mask = np.arange(t)[None, :] < lengths[:, None]
    adv_seq = rng.normal(0, 1, b)
    adv_tok = rng.normal(0, 1, (b, t))
    w = rng.uniform(0.2, 2.0, (b, t)) * mask
    for a in (logp, old, ref):
        a[~mask] = np.nan
    return dict(logp=logp, old=old, ref=ref, mask=mask, adv_seq=adv_seq, adv_tok=adv_tok, w=w)


# --- advantages -------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 8])
@pytest.mark.parametrize(("scale_by_std", "eps"), [(True, 1e-4), (True, 0.5), (False, 1e-4)])
def test_grpo_advantages_equal_the_formula(n, scale_by_std, eps):
    rewards = np.random.default_rng(n).uniform(-1, 2, (5, n))
    rewards[1] = rewards[1].round()  # a 0/1-like group
    got = rl.grpo_advantages(jnp.asarray(rewards), scale_by_std=scale_by_std, eps=eps)
    np.testing.assert_allclose(np.asarray(got), _np_grpo(rewards, scale_by_std, eps), atol=TOL)


@pytest.mark.parametrize("n", [2, 3, 8])
def test_rloo_advantages_equal_the_formula(n):
    rewards = np.random.default_rng(n).uniform(-1, 2, (5, n))
    got = rl.rloo_advantages(jnp.asarray(rewards))
    np.testing.assert_allclose(np.asarray(got), _np_rloo(rewards), atol=TOL)


@pytest.mark.parametrize("estimator", rl.ADVANTAGE_ESTIMATORS)
def test_a_group_of_equal_rewards_gets_zero_advantage_without_nan(estimator):
    rewards = jnp.array([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0]])
    got = np.asarray(rl.advantages(estimator, rewards))
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got[:2], 0.0)
    assert np.abs(got[2]).min() > 0.1


def test_grpo_group_of_one_is_zero():
    np.testing.assert_array_equal(np.asarray(rl.grpo_advantages(jnp.array([[0.7], [0.1]]))), 0.0)


def test_rloo_group_of_one_is_an_error():
    with pytest.raises(ValueError, match=r"n=1 sample has no other sample.*estimator='grpo'"):
        rl.rloo_advantages(jnp.array([[1.0], [0.0]]))


def test_flat_rewards_with_group_size_equal_the_grouped_form():
    rewards = np.random.default_rng(1).uniform(0, 1, 12)
    for estimator, reference in (
        ("grpo", _np_grpo(rewards.reshape(3, 4), True, 1e-4)),
        ("rloo", _np_rloo(rewards.reshape(3, 4))),
    ):
        got = rl.advantages(estimator, jnp.asarray(rewards), group_size=4)
        assert got.shape == (12,)
        np.testing.assert_allclose(np.asarray(got), reference.reshape(-1), atol=TOL)


def test_advantage_input_errors_name_the_fix():
    with pytest.raises(
        ValueError, match=r"estimator='ppo': unknown; use one of \('grpo', 'rloo'\)"
    ):
        rl.advantages("ppo", jnp.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"group_size=5 with rewards of shape \(12,\)"):
        rl.advantages("grpo", jnp.zeros(12), group_size=5)
    with pytest.raises(ValueError, match=r"shape \(12,\); expected \[prompts, n\].*reshape"):
        rl.grpo_advantages(jnp.zeros(12))
    with pytest.raises(ValueError, match=r"eps=0.0: must be > 0"):
        rl.grpo_advantages(jnp.zeros((2, 2)), eps=0.0)


# --- policy loss ------------------------------------------------------------------------------

SETTINGS = [
    # (aggregation, clip_low, clip_high, beta, per-token advantages, importance weights)
    ("token", 0.2, 0.2, 0.0, False, False),
    ("sequence", 0.2, 0.2, 0.0, False, False),
    ("token", 0.2, 0.28, 0.04, False, False),
    ("sequence", 0.1, 0.3, 0.5, True, False),
    ("token", 0.2, 0.2, 0.1, True, True),
    ("sequence", 0.2, 0.28, 0.0, False, True),
]


@pytest.mark.parametrize(
    ("aggregation", "clip_low", "clip_high", "beta", "per_token", "weighted"), SETTINGS
)
def test_policy_loss_and_metrics_equal_the_formula(
    aggregation, clip_low, clip_high, beta, per_token, weighted
):
    d = _batch(seed=len(aggregation) + int(beta * 100))
    adv = d["adv_tok"] if per_token else d["adv_seq"]
    w = d["w"] if weighted else None
    loss, m = rl.policy_loss(
        jnp.asarray(d["logp"]),
        jnp.asarray(d["old"]),
        jnp.asarray(adv),
        jnp.asarray(d["mask"]),
        clip_low=clip_low,
        clip_high=clip_high,
        ref_logps=jnp.asarray(d["ref"]),
        beta=beta,
        aggregation=aggregation,
        is_weights=None if w is None else jnp.asarray(w),
    )
    loss_t, pg_t, k3_t, clipped, _ = _np_policy(
        d["logp"], d["old"], adv, d["mask"], clip_low, clip_high, d["ref"], beta, aggregation, w
    )
    mask = d["mask"]
    assert abs(float(loss) - _np_aggregate(loss_t, mask, aggregation)) < TOL
    assert abs(float(m["pg_loss"]) - _np_aggregate(pg_t, mask, aggregation)) < TOL
    assert abs(float(m["kl"]) - _np_aggregate(k3_t, mask, "token")) < TOL
    assert abs(float(m["clip_fraction"]) - _np_aggregate(clipped, mask, "token")) < TOL
    assert 0.05 < float(m["clip_fraction"]) < 0.6  # the data really exercises clipping
    assert float(m["tokens"]) == mask.sum()
    if weighted:
        assert abs(float(m["is_weight_mean"]) - _np_aggregate(w, mask, "token")) < TOL


@pytest.mark.parametrize("aggregation", rl.AGGREGATIONS)
def test_policy_loss_gradient_equals_the_derivative(aggregation):
    d = _batch(seed=3)
    w = d["w"]
    grad = jax.grad(
        lambda lp: rl.policy_loss(
            lp,
            jnp.asarray(d["old"]),
            jnp.asarray(d["adv_seq"]),
            jnp.asarray(d["mask"]),
            clip_low=0.2,
            clip_high=0.28,
            ref_logps=jnp.asarray(d["ref"]),
            beta=0.1,
            aggregation=aggregation,
            is_weights=jnp.asarray(w),
        )[0]
    )(jnp.asarray(d["logp"]))
    *_, grad_t = _np_policy(
        d["logp"], d["old"], d["adv_seq"], d["mask"], 0.2, 0.28, d["ref"], 0.1, aggregation, w
    )
    mask = d["mask"]
    if aggregation == "token":
        expect = grad_t / mask.sum()
    else:
        lengths = mask.sum(axis=1, keepdims=True)
        expect = grad_t / np.maximum(lengths, 1) / (lengths > 0).sum()
    np.testing.assert_allclose(np.asarray(grad), expect * mask, atol=TOL)


def test_aggregations_differ_and_ignore_masked_values():
    x = np.array([[1.0, 1.0, 1.0, np.nan], [4.0, np.nan, np.nan, np.nan], [np.nan] * 4])
    mask = np.isfinite(x)
    tok = float(rl.aggregate(jnp.asarray(x), jnp.asarray(mask), "token"))
    seq = float(rl.aggregate(jnp.asarray(x), jnp.asarray(mask), "sequence"))
    assert (tok, seq) == (7.0 / 4.0, 5.0 / 2.0)


def test_policy_loss_on_policy_equals_minus_mean_advantage():
    # ratio 1 everywhere: the loss is -A averaged as the aggregation says; nothing is clipped.
    d = _batch(seed=5)
    loss, m = rl.policy_loss(
        jnp.asarray(d["old"]),
        jnp.asarray(d["old"]),
        jnp.asarray(d["adv_seq"]),
        jnp.asarray(d["mask"]),
        aggregation="sequence",
    )
    per_seq = [-d["adv_seq"][b] for b in range(7) if d["mask"][b].any()]
    assert abs(float(loss) - sum(per_seq) / len(per_seq)) < TOL
    assert float(m["clip_fraction"]) == 0.0 and "kl" not in m


def test_policy_loss_errors_name_the_fix():
    z = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match=r"beta=0.1 needs ref_logps.*or set beta=0.0"):
        rl.policy_loss(z, z, jnp.zeros(2), z, beta=0.1)
    with pytest.raises(ValueError, match=r"aggregation='mean': unknown; use one of"):
        rl.policy_loss(z, z, jnp.zeros(2), z, aggregation="mean")
    with pytest.raises(
        ValueError, match=r"advantages has shape \(3,\): one per sequence needs \[2\]"
    ):
        rl.policy_loss(z, z, jnp.zeros(3), z)
    with pytest.raises(ValueError, match=r"old_logps has shape \(2, 4\), mask has \(2, 3\)"):
        rl.policy_loss(z, jnp.zeros((2, 4)), jnp.zeros(2), z)
    with pytest.raises(ValueError, match=r"beta=-1.0: the KL weight must be >= 0"):
        rl.policy_loss(z, z, jnp.zeros(2), z, beta=-1.0)


def test_jitted_policy_loss_matches_eager_and_compiles_once():
    d = _batch(seed=7)
    args = [jnp.asarray(d[k]) for k in ("logp", "old", "adv_seq", "mask", "ref")]
    kwargs = dict(clip_high=0.28, beta=0.04, aggregation="sequence")
    traces = []

    @jax.jit
    def step(logp, old, adv, mask, ref):
        traces.append(1)
        return rl.policy_loss(logp, old, adv, mask, ref_logps=ref, **kwargs)[0]

    eager = rl.policy_loss(*args[:4], ref_logps=args[4], **kwargs)[0]
    assert abs(float(step(*args)) - float(eager)) < TOL
    step(args[0] + 0.01, *args[1:])  # new values, same shapes and dtypes
    assert len(traces) == 1


# --- importance weights -----------------------------------------------------------------------


@pytest.mark.parametrize(("level", "cap"), [("token", 2.0), ("token", 1.2), ("sequence", 1.1)])
def test_truncated_is_weights_equal_the_formula(level, cap):
    d = _batch(seed=11)
    prox = d["logp"] + 0.6 * d["adv_tok"]  # log-ratios spread past log(cap) both ways
    behav = d["old"]
    got = rl.truncated_is_weights(
        jnp.asarray(prox), jnp.asarray(behav), jnp.asarray(d["mask"]), cap=cap, level=level
    )
    expect = _np_is_weights(prox, behav, d["mask"], cap, level)
    np.testing.assert_allclose(np.asarray(got), expect, atol=TOL)
    assert (expect == cap).any() and ((expect < cap) & d["mask"]).any()


def test_is_weights_carry_no_gradient_and_errors_name_the_fix():
    d = _batch(seed=2)
    g = jax.grad(
        lambda p: rl.truncated_is_weights(p, jnp.asarray(d["old"]), jnp.asarray(d["mask"])).sum()
    )
    np.testing.assert_array_equal(np.asarray(g(jnp.asarray(d["logp"]))), 0.0)
    z = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match=r"cap=0.0: the weight truncation must be > 0"):
        rl.truncated_is_weights(z, z, z, cap=0.0)
    with pytest.raises(ValueError, match=r"level='batch': use 'token' or 'sequence'"):
        rl.truncated_is_weights(z, z, z, level="batch")


# --- on-policy distillation -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("aggregation", "weighted"), [("token", False), ("sequence", False), ("token", True)]
)
def test_distill_loss_value_and_gradient_equal_the_formula(aggregation, weighted):
    d = _batch(seed=13)
    student, teacher, mask = d["logp"], d["ref"], d["mask"]
    w = d["w"] if weighted else None
    fn = functools.partial(
        rl.distill_loss,
        teacher_logps=jnp.asarray(teacher),
        mask=jnp.asarray(mask),
        aggregation=aggregation,
        is_weights=None if w is None else jnp.asarray(w),
    )
    (loss, m), grad = jax.value_and_grad(fn, has_aux=True)(jnp.asarray(student))
    k1 = np.where(mask, student - teacher, 0.0)
    weight = np.ones(mask.shape) if w is None else w
    assert abs(float(m["reverse_kl"]) - _np_aggregate(k1, mask, aggregation)) < TOL
    assert abs(float(loss) - _np_aggregate(k1 * weight, mask, aggregation)) < TOL
    if aggregation == "token":
        expect = k1 * weight / mask.sum()
    else:
        lengths = mask.sum(axis=1, keepdims=True)
        expect = k1 * weight / np.maximum(lengths, 1) / (lengths > 0).sum()
    np.testing.assert_allclose(np.asarray(grad), expect * mask, atol=TOL)


def test_sampled_distillation_gradient_is_the_exact_reverse_kl_gradient_in_expectation():
    # One position, vocabulary of 5: average the sampled-token surrogate's gradient in the
    # student's logits over every token, weighted by the student's probability; it equals the
    # gradient of the exact KL(student || teacher).
    rng = np.random.default_rng(0)
    z_s, z_t = jnp.asarray(rng.normal(0, 1.5, 5)), jnp.asarray(rng.normal(0, 1.5, 5))
    one = jnp.ones((1, 1))

    def sampled(z, y):
        s = jax.nn.log_softmax(z)[y].reshape(1, 1)
        t = jax.nn.log_softmax(z_t)[y].reshape(1, 1)
        return rl.distill_loss(s, t, one)[0]

    p = np.exp(np.asarray(jax.nn.log_softmax(z_s)))
    per_token = np.asarray(jax.vmap(jax.grad(sampled), in_axes=(None, 0))(z_s, jnp.arange(5)))
    expected_grad = sum(p[y] * per_token[y] for y in range(5))
    exact = jax.grad(
        lambda z: rl.full_vocab_reverse_kl(z.reshape(1, 1, 5), z_t.reshape(1, 1, 5), one)[0]
    )(z_s)
    np.testing.assert_allclose(expected_grad, np.asarray(exact), atol=TOL)
    assert np.abs(np.asarray(exact)).max() > 0.05


@pytest.mark.parametrize("aggregation", rl.AGGREGATIONS)
def test_full_vocab_reverse_kl_equals_the_formula(aggregation):
    rng = np.random.default_rng(17)
    s, t = rng.normal(0, 2, (3, 5, 11)), rng.normal(0, 2, (3, 5, 11))
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], bool)
    loss, m = rl.full_vocab_reverse_kl(
        jnp.asarray(s), jnp.asarray(t), jnp.asarray(mask), aggregation=aggregation
    )
    expect = _np_aggregate(_np_full_kl(s, t), mask, aggregation)
    assert abs(float(loss) - expect) < TOL and float(m["reverse_kl"]) == float(loss)
    same, _ = rl.full_vocab_reverse_kl(jnp.asarray(s), jnp.asarray(s), jnp.asarray(mask))
    assert abs(float(same)) < TOL


def test_distillation_errors_name_the_fix():
    with pytest.raises(ValueError, match=r"differ: full-vocab KL needs one vocabulary"):
        rl.full_vocab_reverse_kl(jnp.zeros((1, 2, 5)), jnp.zeros((1, 2, 7)), jnp.ones((1, 2)))
    with pytest.raises(ValueError, match=r"teacher_logps has shape \(1, 3\), mask has \(1, 2\)"):
        rl.distill_loss(jnp.zeros((1, 2)), jnp.zeros((1, 3)), jnp.ones((1, 2)))
