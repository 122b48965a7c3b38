"""Rollout workers: the log-probs they return are the trainer's log-probs of the same tokens,
and a weight sync (all arrays, or LoRA adapters only) changes what they sample in place."""

import jax
import numpy as np
import pytest

import meltemi.models as mm
from meltemi.levanter.checkpoint import unflatten_state
from meltemi.levanter.envs import ArithmeticEnv
from meltemi.levanter.rl import Group, RolloutWorker, WorkerSpec, payload_bytes, weight_payload
from meltemi.levanter.rl._batch import sampled_logps, step_batch
from meltemi.models.engine import EngineConfig

CONFIG = mm.get_preset("tiny-llama").replace(
    vocab_size=259, hidden_dim=32, intermediate_dim=48, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=8, max_seq_len=24, bos_token_id=256, eos_token_id=257,
)  # fmt: skip
LORA = mm.lora.LoraConfig(rank=2, alpha=4.0, targets=("q_proj", "v_proj"))
ENV = ArithmeticEnv(max_operand=5)
LENGTH = 16


def _spec(lora=None, n=3):
    engine = EngineConfig(kv_bytes=1 << 20, page_size=8, max_seqs=12, max_seq_len=LENGTH)
    return WorkerSpec(model=CONFIG, lora=lora, engine=engine, tokenizer="byte", env=ENV,
                      samples=n, max_tokens=5, temperature=1.0, seed=3)  # fmt: skip


def _model(seed, lora=None):
    key = jax.random.key(seed)
    model = mm.Transformer.init(CONFIG, key=key)
    # larger weights than the init's, so that samples differ between weights
    model = jax.tree.map(lambda x: x * 8 if x.ndim == 2 else x, model)
    return model if lora is None else mm.lora.apply(model, lora, key=key)


def _prompts(count=3):
    return [(i, ENV.prompt("train", i)) for i in range(count)]


@pytest.fixture(scope="module")
def full_worker():
    model = _model(0)
    return model, RolloutWorker(_spec(), weight_payload(model, adapters_only=False), version=0)


def _trainer_logps(model, groups: list[Group], n: int):
    batch = step_batch(groups, [0] * len(groups), prompts=len(groups), n=n, length=LENGTH)
    logps = np.asarray(sampled_logps(model(batch.tokens).array, batch.tokens))
    return batch, logps


def test_worker_log_probs_are_the_policys_log_probs_of_the_sampled_tokens(full_worker):
    model, worker = full_worker
    groups = worker.generate(_prompts(), version=0)
    assert [g.index for g in groups] == [0, 1, 2] and all(len(g.responses) == 3 for g in groups)
    batch, logps = _trainer_logps(model, groups, 3)
    on = batch.mask > 0
    assert on.sum() > 9  # several tokens a sample
    np.testing.assert_allclose(batch.behaviour[on], logps[on], atol=1e-4)
    # each prompt's reward is the verifier's on the decoded text
    for g in groups:
        texts = [bytes(t for t in r if t < 256).decode(errors="replace") for r in g.responses]
        assert list(g.rewards) == [ENV.reward(g.prompt, t) for t in texts]


def test_generate_refuses_a_version_the_worker_does_not_hold(full_worker):
    _, worker = full_worker
    with pytest.raises(ValueError, match="holds weights version 0; call set_weights first"):
        worker.generate(_prompts(1), version=1)


def test_full_sync_changes_the_samples_in_place(full_worker):
    _, worker = full_worker
    before = worker.generate(_prompts(), version=0)
    new = _model(1)
    worker.set_weights(weight_payload(new, adapters_only=False), version=1)
    after = worker.generate(_prompts(), version=1)
    assert all(g.version == 1 for g in after)
    assert [g.responses for g in after] != [g.responses for g in before]
    batch, logps = _trainer_logps(new, after, 3)
    np.testing.assert_allclose(batch.behaviour[batch.mask > 0], logps[batch.mask > 0], atol=1e-4)


def test_lora_sync_sends_only_the_adapters():
    model = _model(2, LORA)
    worker = RolloutWorker(_spec(LORA), weight_payload(model, adapters_only=False), version=0)
    # the trainer changes only the adapters (B starts at 0: give it values)
    trained = jax.tree.map(lambda x: x, model)
    payload = weight_payload(trained, adapters_only=True)
    payload = {k: (v + 0.5 if "lora_b" in k.split(".") else v) for k, v in payload.items()}
    assert payload and all({"lora_a", "lora_b"} & set(k.split(".")) for k in payload)
    assert payload_bytes(payload) == mm.lora.adapter_bytes(model)
    assert payload_bytes(payload) < payload_bytes(weight_payload(model, adapters_only=False)) / 5
    worker.set_weights(payload, version=1)
    groups = worker.generate(_prompts(), version=1)
    merged = mm.lora.merge(unflatten_state(model, payload))
    batch, logps = _trainer_logps(merged, groups, 3)
    np.testing.assert_allclose(batch.behaviour[batch.mask > 0], logps[batch.mask > 0], atol=1e-4)
    # and the old adapters' policy gives other log-probs: the adapters did arrive
    _, old = _trainer_logps(mm.lora.merge(model), groups, 3)
    assert np.abs(old - logps)[batch.mask > 0].max() > 1e-2


def test_a_payload_for_another_model_is_refused(full_worker):
    _, worker = full_worker
    with pytest.raises(ValueError, match=r"\['nope'\] are not arrays of the worker's model"):
        worker.set_weights({"nope": np.zeros(3)}, version=5)


# -- multi-turn episodes -------------------------------------------------------------------------

RETRY_ENV = ArithmeticEnv(max_operand=5, retries=1)
LONG = 48  # prompt, a first answer, the environment's "no, try again: 3+1=" and a second one


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_a_multi_turn_episode_continues_after_the_environments_message(prefix_cache):
    """`max_turns=2` with an environment that answers a wrong first turn: the policy samples a
    second turn after the message; the message's tokens are in the response but not trained
    (log-prob 0, mask 0), the second turn's log-probs are the policy's with the message in
    context, and the reward scores the last turn. With `rl.prefix_cache` the second turn reads
    the first turn's pages (the prompt's) from the cache, with the same guarantees."""
    config = CONFIG.replace(max_seq_len=LONG)
    model = mm.Transformer.init(config, key=jax.random.key(0))
    model = jax.tree.map(lambda x: x * 8 if x.ndim == 2 else x, model)
    engine = EngineConfig(
        kv_bytes=1 << 20, page_size=8, max_seqs=12, max_seq_len=LONG, prefix_cache=prefix_cache
    )
    spec = WorkerSpec(model=config, lora=None, engine=engine, tokenizer="byte", env=RETRY_ENV,
                      samples=2, max_tokens=5, seed=3, max_turns=2)  # fmt: skip
    worker = RolloutWorker(spec, weight_payload(model, adapters_only=False), version=0)
    prompts = [(i, RETRY_ENV.prompt("train", i)) for i in range(3)]
    groups = worker.generate(prompts, version=0)

    retried = 0
    for g in groups:
        for s, (resp, lps) in enumerate(zip(g.responses, g.logprobs, strict=True)):
            flags = g.trained[s] if g.trained else (1,) * len(resp)
            first = list(resp[: flags.index(0)]) if 0 in flags else list(resp)
            text = bytes(t for t in first if t < 256).decode(errors="replace")
            if RETRY_ENV.reward(g.prompt, text):
                assert 0 not in flags  # a right first answer ends the episode
                continue
            retried += 1
            message = list((RETRY_ENV.step(g.prompt, [text]) or "").encode())
            at = flags.index(0)
            assert list(resp[at : at + len(message)]) == message
            assert flags[at : at + len(message)] == (0,) * len(message)
            assert all(lp == 0.0 for lp in lps[at : at + len(message)])
            second = resp[at + len(message) :]
            assert second and all(f == 1 for f in flags[at + len(message) :])
            last = bytes(t for t in second if t < 256).decode(errors="replace")
            assert g.rewards[s] == RETRY_ENV.reward(g.prompt, last)
    assert retried >= 3  # random weights: most first answers are wrong
    assert (worker.engine.num_cached_tokens > 0) == prefix_cache

    batch = step_batch(groups, [0] * 3, prompts=3, n=2, length=LONG)
    logps = np.asarray(sampled_logps(model(batch.tokens).array, batch.tokens))
    on = batch.mask > 0
    np.testing.assert_allclose(batch.behaviour[on], logps[on], atol=1e-4)
    for g_i, g in enumerate(groups):  # the mask is the trained flags, after the prompt
        p = len(g.prompt_ids)
        for s, flags in enumerate(g.trained or ()):
            row = batch.mask[g_i * 2 + s, p - 1 : p - 1 + len(flags)]
            np.testing.assert_array_equal(row, np.asarray(flags, np.float32))
