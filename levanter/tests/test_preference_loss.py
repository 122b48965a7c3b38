"""DPO, IPO and SimPO losses against TRL's own code on the same log-probabilities.

TRL (tests only) is called, not transcribed:
- `trl.DPOTrainer._compute_loss` (loss types "sigmoid" and "ipo", precomputed reference
  log-probs) runs on a stub trainer whose stub model returns the per-token log-probs we choose
  (the summed log-prob at the first completion position, zeros elsewhere), so its own code
  sums, splits, and computes the loss and the logged metrics;
- `trl.experimental.cpo.CPOTrainer.cpo_loss` (loss types "sigmoid" with label smoothing, i.e.
  cDPO when given log-ratios, "simpo", and "ipo" in its summed form) is called with a stub
  `self` on tensors.
Everything runs in float64 (jax x64, torch double), so 1e-6 is far above rounding.
"""

import collections
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from meltemi.levanter.optim import _preference as pref

BETAS = (0.01, 0.1, 0.5, 2.5)
TOL = 1e-6


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


def _pairs(n: int = 24, seed: int = 0) -> dict[str, np.ndarray]:
    """Log-probs of `n` pairs; about half have the policy preferring the rejected reply."""
    rng = np.random.default_rng(seed)
    len_c = rng.integers(1, 40, n).astype(np.float64)
    len_r = rng.integers(1, 40, n).astype(np.float64)
    ref_c = -len_c * rng.uniform(0.5, 3.0, n)
    ref_r = -len_r * rng.uniform(0.5, 3.0, n)
    pol_c = ref_c + rng.normal(0, 4, n)
    pol_r = ref_r + rng.normal(0, 4, n)
    return dict(pol_c=pol_c, pol_r=pol_r, ref_c=ref_c, ref_r=ref_r, len_c=len_c, len_r=len_r)


def test_pairs_cover_both_preferences():
    p = _pairs()
    margin = (p["pol_c"] - p["ref_c"]) - (p["pol_r"] - p["ref_r"])
    assert (margin < 0).sum() >= 6 and (margin > 0).sum() >= 6


class _StubModel:
    training = True

    def __init__(self, log_probs: torch.Tensor):
        self.log_probs = log_probs

    def __call__(self, **kwargs):
        shape = self.log_probs.shape
        return types.SimpleNamespace(
            log_probs=self.log_probs,
            entropy=torch.zeros(shape, dtype=torch.float64),
            mean_logits=torch.zeros(shape, dtype=torch.float64),
            is_top1=torch.zeros(shape, dtype=torch.bool),
        )


def _trl_dpo(loss_type: str, beta: float, p: dict, idx) -> tuple[float, dict]:
    """TRL DPOTrainer's loss and metrics on pairs `idx`."""
    from trl import DPOTrainer

    idx = np.atleast_1d(idx)
    b = len(idx)
    lengths = np.concatenate([p["len_c"][idx], p["len_r"][idx]]).astype(int)
    width = int(lengths.max()) + 2
    completion = torch.zeros((2 * b, width), dtype=torch.long)
    for i, n in enumerate(lengths):
        completion[i, 1 : 1 + n] = 1  # token 0 is the prompt
    log_probs = torch.zeros((2 * b, width - 1), dtype=torch.float64)
    log_probs[:, 0] = torch.tensor(np.concatenate([p["pol_c"][idx], p["pol_r"][idx]]))
    accel = types.SimpleNamespace(device="cpu", gather_for_metrics=lambda x: x, gather=lambda x: x)
    stub = types.SimpleNamespace(
        model=_StubModel(log_probs),
        accelerator=accel,
        aux_loss_enabled=False,
        ld_alpha=None,
        precompute_ref_logps=True,
        f_divergence_type="reverse_kl",
        loss_types=[loss_type],
        loss_weights=[1.0],
        beta=beta,
        label_smoothing=0.0,
        use_weighting=False,
        _metrics={"train": collections.defaultdict(list)},
        _total_train_tokens=0,
        _tp_size=1,
    )
    inputs = {
        "input_ids": torch.zeros((2 * b, width), dtype=torch.long),
        "attention_mask": torch.ones((2 * b, width), dtype=torch.long),
        "completion_mask": completion,
        "ref_chosen_logps": torch.tensor(p["ref_c"][idx]),
        "ref_rejected_logps": torch.tensor(p["ref_r"][idx]),
    }
    loss = DPOTrainer._compute_loss(stub, stub.model, inputs, return_outputs=False)
    return float(loss), {k: v[-1] for k, v in stub._metrics["train"].items()}


def _trl_cpo(loss_type: str, beta: float, chosen, rejected, *, smoothing=0.0, gamma=0.0):
    """TRL CPOTrainer.cpo_loss on tensors, with a stub `self`."""
    from trl.experimental.cpo import CPOTrainer

    stub = types.SimpleNamespace(
        alpha=0.0,
        loss_type=loss_type,
        beta=beta,
        label_smoothing=smoothing,
        simpo_gamma=gamma,
        accelerator=types.SimpleNamespace(device="cpu"),
    )
    losses, _, _ = CPOTrainer.cpo_loss(stub, torch.tensor(chosen), torch.tensor(rejected))
    return losses.numpy()


def _jnp(p: dict) -> dict:
    return {k: jnp.asarray(v) for k, v in p.items()}


@pytest.mark.parametrize("beta", BETAS)
def test_dpo_equals_trl_dpo_trainer(beta):
    p = _pairs()
    j = _jnp(p)
    ours = np.asarray(pref.dpo_loss(j["pol_c"], j["pol_r"], j["ref_c"], j["ref_r"], beta=beta))
    theirs = np.asarray([_trl_dpo("sigmoid", beta, p, i)[0] for i in range(len(ours))])
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=TOL)
    assert ours.max() > np.log(2) + 1e-3  # some pairs prefer the rejected reply: loss > log 2


@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("smoothing", [0.1, 0.3])
def test_dpo_label_smoothing_equals_trl_cdpo(beta, smoothing):
    p = _pairs(seed=1)
    j = _jnp(p)
    ours = pref.dpo_loss(
        j["pol_c"], j["pol_r"], j["ref_c"], j["ref_r"], beta=beta, label_smoothing=smoothing
    )
    # cpo_loss's "sigmoid" on log-ratios is cDPO: its logits are chosen - rejected.
    theirs = _trl_cpo(
        "sigmoid", beta, p["pol_c"] - p["ref_c"], p["pol_r"] - p["ref_r"], smoothing=smoothing
    )
    np.testing.assert_allclose(np.asarray(ours), theirs, rtol=0, atol=TOL)


@pytest.mark.parametrize("beta", BETAS)
def test_ipo_equals_trl_dpo_trainer(beta):
    p = _pairs(seed=2)
    j = _jnp(p)
    ours = np.asarray(
        pref.ipo_loss(
            j["pol_c"], j["pol_r"], j["ref_c"], j["ref_r"], j["len_c"], j["len_r"], beta=beta
        )
    )
    theirs = np.asarray([_trl_dpo("ipo", beta, p, i)[0] for i in range(len(ours))])
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=TOL)


@pytest.mark.parametrize("beta", BETAS)
def test_ipo_summed_equals_trl_cpo(beta):
    p = _pairs(seed=3)
    j = _jnp(p)
    ours = pref.ipo_loss(
        j["pol_c"],
        j["pol_r"],
        j["ref_c"],
        j["ref_r"],
        j["len_c"],
        j["len_r"],
        beta=beta,
        length_normalized=False,
    )
    theirs = _trl_cpo("ipo", beta, p["pol_c"] - p["ref_c"], p["pol_r"] - p["ref_r"])
    np.testing.assert_allclose(np.asarray(ours), theirs, rtol=0, atol=TOL)


@pytest.mark.parametrize("beta", (0.5, 2.0, 2.5))
@pytest.mark.parametrize("gamma", (0.0, 0.5, 1.6))
@pytest.mark.parametrize("smoothing", (0.0, 0.2))
def test_simpo_equals_trl_cpo(beta, gamma, smoothing):
    p = _pairs(seed=4)
    j = _jnp(p)
    ours = pref.simpo_loss(
        j["pol_c"],
        j["pol_r"],
        j["len_c"],
        j["len_r"],
        beta=beta,
        gamma=gamma,
        label_smoothing=smoothing,
    )
    # CPOTrainer gives cpo_loss length-averaged log-probs for SimPO (get_batch_logps average).
    theirs = _trl_cpo(
        "simpo",
        beta,
        p["pol_c"] / p["len_c"],
        p["pol_r"] / p["len_r"],
        smoothing=smoothing,
        gamma=gamma,
    )
    np.testing.assert_allclose(np.asarray(ours), theirs, rtol=0, atol=TOL)


@pytest.mark.parametrize("objective", ["dpo", "ipo"])
def test_loss_and_metrics_equal_trl_batch_means(objective):
    p = _pairs(seed=5)
    j = _jnp(p)
    beta = 0.1
    policy = pref.PairLogps(j["pol_c"], j["pol_r"], j["len_c"], j["len_r"])
    reference = pref.PairLogps(j["ref_c"], j["ref_r"], j["len_c"], j["len_r"])
    loss, metrics = pref.preference_loss(objective, policy, reference, beta=beta)
    trl_type = "sigmoid" if objective == "dpo" else "ipo"
    trl_loss, trl_metrics = _trl_dpo(trl_type, beta, p, np.arange(len(p["pol_c"])))
    assert abs(float(loss) - trl_loss) < TOL
    for key in (
        "rewards/chosen",
        "rewards/rejected",
        "rewards/margins",
        "rewards/accuracies",
        "logps/chosen",
        "logps/rejected",
    ):
        assert abs(float(metrics[key]) - trl_metrics[key]) < TOL, key
    assert 0.2 < float(metrics["rewards/accuracies"]) < 0.8  # both kinds of pairs present
    ratio = p["pol_c"] - p["ref_c"]
    assert abs(float(metrics["logratios/chosen"]) - ratio.mean()) < TOL


def test_invalid_pairs_do_not_count():
    p = _pairs(seed=6, n=6)
    j = _jnp(p)
    valid = jnp.asarray([True, True, False, True, False, True])
    policy = pref.PairLogps(j["pol_c"], j["pol_r"], j["len_c"], j["len_r"], valid)
    reference = pref.PairLogps(j["ref_c"], j["ref_r"], j["len_c"], j["len_r"])
    loss, _ = pref.preference_loss("dpo", policy, reference, beta=0.1)
    keep = np.asarray(valid)
    sub = {k: v[keep] for k, v in p.items()}
    expected = np.mean([_trl_dpo("sigmoid", 0.1, sub, i)[0] for i in range(keep.sum())])
    assert abs(float(loss) - expected) < TOL


def test_sequence_logps_sums_replies_per_pair():
    # Two rows of 9; row 0: pair 1 (chosen 3 tokens, rejected 2), pair 2 (chosen 1, rejected 1);
    # row 1: pair 1 only, then padding. Masked-out positions (prompt tokens) must not count.
    rng = np.random.default_rng(7)
    logps = rng.normal(-2, 1, (2, 9))
    pair_ids = np.array([[1, 1, 1, 1, 1, 1, 2, 2, 2], [1, 1, 1, 1, 1, 0, 0, 0, 0]])
    chosen = np.array([[1, 1, 1, 0, 0, 0, 1, 1, 0], [1, 1, 0, 0, 0, 0, 0, 0, 0]])
    mask = np.array([[0, 1, 1, 1, 1, 1, 1, 0, 1], [0, 1, 0, 1, 1, 1, 0, 0, 0]])
    got = pref.sequence_logps(
        jnp.asarray(logps),
        jnp.asarray(mask),
        jnp.asarray(pair_ids),
        jnp.asarray(chosen),
        max_pairs=3,
    )
    expect_c = np.zeros(6)
    expect_r = np.zeros(6)
    n_c = np.zeros(6)
    n_r = np.zeros(6)
    for r in range(2):
        for i in range(9):
            if mask[r, i] and pair_ids[r, i]:
                slot = r * 3 + pair_ids[r, i] - 1
                if chosen[r, i]:
                    expect_c[slot] += logps[r, i]
                    n_c[slot] += 1
                else:
                    expect_r[slot] += logps[r, i]
                    n_r[slot] += 1
    np.testing.assert_allclose(np.asarray(got.chosen), expect_c, atol=1e-12)
    np.testing.assert_allclose(np.asarray(got.rejected), expect_r, atol=1e-12)
    assert np.asarray(got.chosen_tokens).tolist() == n_c.tolist() == [2, 1, 0, 1, 0, 0]
    assert np.asarray(got.rejected_tokens).tolist() == n_r.tolist() == [3, 1, 0, 2, 0, 0]
    assert np.asarray(got.valid).tolist() == [True, True, False, True, False, False]


def test_simpo_needs_no_reference_and_dpo_does():
    p = _jnp(_pairs(n=4))
    policy = pref.PairLogps(p["pol_c"], p["pol_r"], p["len_c"], p["len_r"])
    loss, metrics = pref.preference_loss("simpo", policy, beta=2.0, gamma=0.5)
    assert np.isfinite(float(loss)) and "logratios/chosen" not in metrics
    with pytest.raises(ValueError, match="objective='dpo' needs the reference"):
        pref.preference_loss("dpo", policy, beta=0.1)
    with pytest.raises(ValueError, match=r"objective='orpo': use one of \['dpo', 'ipo', 'simpo'\]"):
        pref.preference_loss("orpo", policy, policy, beta=0.1)


def test_bad_hyperparameters_name_the_field():
    x = jnp.zeros(2)
    with pytest.raises(ValueError, match=r"label_smoothing=0\.5: must be in \[0, 0\.5\)"):
        pref.dpo_loss(x, x, x, x, beta=0.1, label_smoothing=0.5)
    with pytest.raises(ValueError, match=r"beta=0\.0: must be > 0, e\.g\. beta=2\.0"):
        pref.simpo_loss(x, x, x, x, beta=0.0, gamma=0.5)
    with pytest.raises(ValueError, match="beta=0: IPO needs beta > 0"):
        pref.ipo_loss(x, x, x, x, x, x, beta=0)


def test_loss_is_jittable_without_recompiling():
    p = _jnp(_pairs(n=8))
    policy = pref.PairLogps(p["pol_c"], p["pol_r"], p["len_c"], p["len_r"])

    @jax.jit
    def f(pol):
        return pref.preference_loss("dpo", pol, policy, beta=0.1)[0]

    f(policy)
    shifted = policy._replace(chosen=policy.chosen + 1.0)
    f(shifted)
    assert f._cache_size() == 1
    grads = jax.grad(lambda c: f(policy._replace(chosen=c)))(policy.chosen)
    assert (np.asarray(grads) < 0).all()  # raising a chosen log-prob lowers the DPO loss


def test_sequence_logps_on_a_packed_preference_batch(tmp_path):
    """The data's `pair_ids`/`is_chosen`/`loss_mask` and `sequence_logps` agree: each pair's
    sums are those of its replies' tokens, found from the pair's own encoding."""
    import json

    from meltemi.data import ByteTokenizer, PackedDataset, build_store
    from meltemi.data.chat import ChatTemplate, PreferenceFiles, encode_preference

    tok = ByteTokenizer()
    template = ChatTemplate(
        "{% for m in messages %}{{ m.role[0] }}:{{ m.content }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}a:{% endif %}"
    )
    rows = [
        {"prompt": f"q{i}", "chosen": "yes" * (i % 4 + 1), "rejected": f"no {i}"} for i in range(13)
    ]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = build_store(
        [PreferenceFiles("p", [str(tmp_path)], template=template)],
        tok,
        tmp_path / "s",
        min_shards=1,
    )
    ds = PackedDataset(store, seq_len=61, batch_size=3, mode="document", packing="ffd")
    batch = ds.batch(0)
    # A fixed log-prob per target id, so each reply's sum is known from its ids alone.
    table = -np.linspace(0.1, 3.0, tok.vocab_size)
    logps = table[batch["targets"]]
    got = pref.sequence_logps(
        jnp.asarray(logps),
        jnp.asarray(batch["loss_mask"]),
        jnp.asarray(batch["pair_ids"]),
        jnp.asarray(batch["is_chosen"]),
        max_pairs=61 // 2,
    )
    by_ids = {}
    for r in rows:
        p = encode_preference(r["prompt"], r["chosen"], r["rejected"], tok, template)
        by_ids[tuple(p.chosen.ids.tolist())] = p
    slots = 0
    for row in range(3):
        for k in range(1, int(batch["pair_ids"][row].max()) + 1):
            chosen_ids = batch["tokens"][row][batch["segment_ids"][row] == 2 * k - 1]
            p = by_ids[tuple(chosen_ids.tolist())]
            slot = row * (61 // 2) + k - 1
            for enc, total, count in (
                (p.chosen, got.chosen, got.chosen_tokens),
                (p.rejected, got.rejected, got.rejected_tokens),
            ):
                trained = enc.ids[enc.loss_mask == 1]
                assert abs(float(total[slot]) - table[trained].sum()) < 1e-9
                assert int(count[slot]) == len(trained)
            slots += 1
    assert int(np.asarray(got.valid).sum()) == slots >= 6
