"""The RL loop on rl_arithmetic.py: one update raises the log-prob of rewarded samples, a
SIGKILLed rollout worker (local backend) is replaced and no prompt is trained twice, every step
logs the issue's metrics, and a bad verifier is counted without stopping the run."""

import math
import os
import signal
import time

import _rl
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meltemi.levanter.envs import ArithmeticEnv
from meltemi.levanter.rl import RLTrainer
from meltemi.levanter.rl._batch import sampled_logps
from meltemi.levanter.rl._loop import _train_step
from meltemi.levanter.tracking import read_metrics
from meltemi.levanter.trainer import init_state, model_parts

STEPS, PROMPTS, KILL_AT = 5, 4, 2


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory):
    """GRPO from a fresh tiny model, 2 local workers; one is SIGKILLed after step KILL_AT."""
    run_dir = tmp_path_factory.mktemp("grpo")
    spec, rl = _rl.rl_specs(
        run_dir, checkpoint__init_from="", trainer__num_train_steps=STEPS,
        rl__prompts_per_step=PROMPTS, rl__samples_per_prompt=4, rl__eval_prompts=4,
        rl__backend="local",
    )  # fmt: skip
    killed = []

    def kill_one(step, pool):
        if step == KILL_AT:
            pid = pool.pids()[0]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            time.sleep(0.5)  # dead before the next chunk is handed out

    result = RLTrainer(spec, rl, on_step=kill_one).run()
    return result, read_metrics(run_dir / "metrics.jsonl"), killed


def test_one_update_raises_the_log_prob_of_the_rewarded_samples(tmp_path):
    """The sign of the whole chain (advantages, loss, optimizer): GRPO on a group where one
    sample is rewarded makes that sample likelier, and more so than any unrewarded one."""
    spec, rl = _rl.rl_specs(tmp_path, checkpoint__init_from="", optimizer__learning_rate=0.001,
                            rl__steps_ahead=0, rl__max_staleness=0)  # fmt: skip
    parts = model_parts(spec)
    params, static = eqx.partition(parts.init_model(jax.random.key(0)), eqx.is_array)
    state = jax.device_put(init_state(params, parts.optimizer))
    step = _train_step(spec, rl, static, parts.optimizer)
    n, length = 4, spec.data.seq_len
    tokens = np.zeros((n, length), np.int32)
    tokens[:, :5] = [256, 51, 43, 52, 61]  # <bos>3+4=
    tokens[:, 5] = [55, 56, 57, 58]  # "7" (rewarded), "8", "9", ":"
    tokens[:, 6] = 257
    mask = np.zeros((n, length - 1), np.float32)
    mask[:, 4:6] = 1.0
    logp = lambda p: np.asarray(sampled_logps(eqx.combine(p, static)(tokens).array, tokens))  # noqa: E731
    before = logp(state.params)
    batch = {"tokens": jnp.asarray(tokens), "mask": jnp.asarray(mask),
             "behaviour": jnp.asarray(before), "stale": jnp.zeros((n,)),
             "rewards": jnp.asarray([[1.0, 0.0, 0.0, 0.0]])}  # fmt: skip
    state, _ = step(state, batch, None, None)
    change = (logp(state.params) - before)[:, 4]
    assert change[0] > 0 and change[0] > change[1:].max(), change


def test_a_killed_worker_is_replaced_and_the_run_goes_on(grpo_run):
    result, records, killed = grpo_run
    assert killed and result.workers_lost >= 1
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert records[-1]["rl/workers_lost"] >= 1


def test_no_prompt_is_trained_twice_and_the_order_is_the_cursors(grpo_run):
    _, records, _ = grpo_run
    trained = [i for r in records for i in r["rl/prompts"]]
    assert len(trained) == len(set(trained))
    for r in records:  # step s trains prompts [(s-1)P, sP), less the ones dropped as stale
        expect = set(range((r["step"] - 1) * PROMPTS, r["step"] * PROMPTS))
        assert set(r["rl/prompts"]) | set(r["rl/dropped_prompts"]) == expect


def test_every_step_logs_the_metrics_the_issue_names(grpo_run):
    _, records, _ = grpo_run
    for key in (
        "rl/arithmetic/reward_mean", "rl/arithmetic/reward_p50", "rl/response_length_mean",
        "rl/clip_fraction", "rl/staleness/used", "rl/staleness/corrected",
        "rl/staleness/dropped", "throughput/rollout_tokens_per_second",
        "throughput/train_tokens_per_second", "time/generation_s", "time/scoring_s",
        "time/training_s", "rl/sync/bytes", "rl/sync/send_s",
    ):  # fmt: skip
        assert all(key in r for r in records), key
    # generating one step ahead: after step 1, groups arrive one version stale (corrected)
    assert sum(r["rl/staleness/corrected"] for r in records) > 0
    assert all(r["rl/sync/bytes"] > 0 for r in records)


class FlakyVerifier(ArithmeticEnv):
    """Arithmetic whose verifier raises, returns NaN or hangs on a third of the prompts each."""

    def reward(self, prompt, response):
        k = int(prompt.id.rsplit("/", 1)[1]) % 4
        if k == 0:
            raise RuntimeError("verifier bug")
        if k == 1:
            return math.nan
        if k == 2:
            time.sleep(3.0)
        return super().reward(prompt, response)


def test_a_bad_verifier_is_counted_and_the_run_finishes(tmp_path):
    spec, rl = _rl.rl_specs(
        tmp_path, checkpoint__init_from="", trainer__num_train_steps=2,
        rl__backend="inprocess", rl__num_workers=1, rl__eval_prompts=0,
        rl__samples_per_prompt=2, rl__verify_timeout_s=0.2,
    )  # fmt: skip
    result = RLTrainer(spec, rl, env=FlakyVerifier(max_operand=9)).run()
    assert result.run.step == 2
    records = read_metrics(tmp_path / "metrics.jsonl")
    failures = {
        reason: sum(r[f"rl/arithmetic/verifier_failures/{reason}"] for r in records)
        for reason in ("raised", "nan", "timeout")
    }
    assert all(count > 0 for count in failures.values()), failures
