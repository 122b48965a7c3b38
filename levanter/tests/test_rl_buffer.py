"""The rollout buffer: staleness decides used / corrected / dropped, counted; it is bounded;
the fixed-shape step batch puts each sampled token's log-prob where its target is; the `rl`
section's mistakes are one line naming the key; the shipped SFT set is its generator's."""

import importlib.util
import pathlib

import numpy as np
import pytest

from meltemi.levanter.config import ConfigError, base_config, rl_section, rl_spec, with_variant
from meltemi.levanter.envs import Prompt
from meltemi.levanter.rl import BufferFullError, Group, RolloutBuffer
from meltemi.levanter.rl._batch import step_batch
from meltemi.levanter.rl._loop import make_env


def _group(index, version, n=2, response=(5, 6, 7)):
    prompt = Prompt(f"t/train/{index}", "1+1=", "2", "t")
    return Group(
        index=index, prompt=prompt, prompt_ids=(1, 2, 3), responses=(tuple(response),) * n,
        logprobs=(tuple(-0.1 * (k + 1) for k in range(len(response))),) * n,
        rewards=(1.0,) * n, failures=(None,) * n, version=version,
    )  # fmt: skip


@pytest.mark.parametrize("max_staleness", [0, 1, 3])
def test_staleness_decides_used_corrected_dropped(max_staleness):
    buffer = RolloutBuffer(capacity=8, max_staleness=max_staleness)
    versions = [5, 4, 3, 2, 1, 0]  # lags 0..5 when taken at version 5
    for i, v in enumerate(versions):
        buffer.put(_group(i, v))
    taken = buffer.take(range(6), version=5)
    lags = [5 - v for v in versions]
    expect = {
        "used": sum(lag == 0 for lag in lags),
        "corrected": sum(0 < lag <= max_staleness for lag in lags),
        "dropped": sum(lag > max_staleness for lag in lags),
    }
    assert taken.counts == expect
    assert [g.index for g in taken.groups] == [i for i, lag in enumerate(lags)
                                               if lag <= max_staleness]  # fmt: skip
    assert taken.staleness == [lag for lag in lags if lag <= max_staleness]
    assert taken.dropped == [i for i, lag in enumerate(lags) if lag > max_staleness]
    assert buffer.totals == expect and len(buffer) == 0


def test_totals_add_up_over_steps():
    buffer = RolloutBuffer(capacity=4, max_staleness=1)
    for step in range(3):
        for i in range(2):
            buffer.put(_group(2 * step + i, version=max(step - i * 2, 0)))
        buffer.take(range(2 * step, 2 * step + 2), version=step)
    # step 0: lags 0, 0; step 1: lags 0, 1; step 2: lags 0, 2
    assert buffer.totals == {"used": 4, "corrected": 1, "dropped": 1}


def test_buffer_is_bounded():
    buffer = RolloutBuffer(capacity=2, max_staleness=1)
    buffer.put(_group(0, 0))
    buffer.put(_group(1, 0))
    buffer.put(_group(1, 0))  # the same prompt again (a resampled chunk) replaces it
    with pytest.raises(BufferFullError, match=r"full \(2 groups\) when group 2 arrived"):
        buffer.put(_group(2, 0))


def test_a_group_from_a_newer_version_is_refused():
    buffer = RolloutBuffer(capacity=2, max_staleness=1)
    buffer.put(_group(0, 3))
    with pytest.raises(ValueError, match="version 3 taken at version 2"):
        buffer.take([0], version=2)


def test_taking_a_group_that_has_not_arrived_names_it():
    buffer = RolloutBuffer(capacity=2, max_staleness=1)
    with pytest.raises(KeyError, match=r"groups \[0\] have not arrived"):
        buffer.take([0], version=0)


def test_step_batch_aligns_log_probs_with_their_targets():
    g = _group(0, 0, n=2, response=(5, 6, 7))
    batch = step_batch([g], [1], prompts=2, n=2, length=9)
    # position t predicts token t + 1: the response (tokens 3..5) is predicted at 2..4
    np.testing.assert_array_equal(batch.tokens[0], [1, 2, 3, 5, 6, 7, 0, 0, 0])
    np.testing.assert_array_equal(batch.mask[0], [0, 0, 1, 1, 1, 0, 0, 0])
    np.testing.assert_allclose(batch.behaviour[0, 2:5], [-0.1, -0.2, -0.3], rtol=1e-6)
    for t in np.flatnonzero(batch.mask[0]):
        assert batch.tokens[0, t + 1] == g.responses[0][t - 2]
    assert batch.stale.tolist() == [1.0, 1.0, 0.0, 0.0]  # the missing group's rows: padding
    assert batch.present.tolist() == [1.0, 0.0] and batch.mask[2:].sum() == 0


def test_step_batch_refuses_a_sequence_longer_than_seq_len():
    with pytest.raises(ValueError, match=r"3 prompt \+ 3 response tokens > data.seq_len=5"):
        step_batch([_group(0, 0)], [0], prompts=1, n=2, length=5)


def _rl_config(**values):
    config = base_config()
    config.rl = rl_section()
    for k, v in values.items():
        config.rl[k] = v
    return with_variant(config, None, {})


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"objective": "distill"}, r"rl.objective='distill' needs rl.teacher"),
        ({"teacher": "runs/t"}, r"rl.teacher='runs/t' has no effect with rl.objective='grpo'"),
        ({"objective": "rloo", "samples_per_prompt": 1}, r"rl.samples_per_prompt=1: RLOO"),
        ({"steps_ahead": 2}, r"rl.max_staleness=1 < rl.steps_ahead=2"),
        ({"env": "math"}, r"rl.env='math' needs rl.problems"),
        ({"backend": "threads"}, r"rl.backend='threads': must be one of"),
        ({"carries": False, "ops": "+*"}, r"rl.carries=False with rl.ops='\+\*': '\*' has no"),
    ],
)
def test_rl_section_mistakes_are_one_line_naming_the_key(values, match):
    with pytest.raises(ConfigError, match=match):
        rl_spec(_rl_config(**values))


def test_rl_carries_false_gives_the_carry_free_environment():
    rl = rl_spec(_rl_config(max_operand=99, ops="+", carries=False))
    env = make_env(rl)
    assert (env.size("train"), env.size("test")) == (2723, 302)


def test_rl_max_turns_makes_the_arithmetic_environment_multi_turn():
    """`rl.max_turns=3`: the environment answers a wrong turn twice (the rollout side of
    multi-turn episodes is tests/test_rl_rollout.py)."""
    env = make_env(rl_spec(_rl_config(max_turns=3)))
    p = env.prompt("train", 0)
    assert env.retries == 2 and env.step(p, ["x", "y"]) and env.step(p, ["x", "y", "z"]) is None
    assert make_env(rl_spec(_rl_config())).step(p, ["x"]) is None  # the default: one turn


def test_a_config_without_the_rl_section_is_told_how_to_add_it():
    with pytest.raises(ConfigError, match=r"config.rl = rl_section\(\)"):
        rl_spec(base_config())


def test_the_shipped_sft_set_is_its_generators_output():
    data = pathlib.Path(__file__).parent.parent / "configs" / "rl_data"
    spec = importlib.util.spec_from_file_location("make_sft", data / "make_arithmetic_sft.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for split in ("train", "test"):
        shipped = (data / f"arithmetic_{split}.jsonl").read_text().splitlines()
        assert shipped == module.lines(split)
    # the SFT set never shows a held-out problem
    assert not set(module.lines("train")) & set(module.lines("test"))
    # two in three training answers are in the format the reward refuses (`46.0`)
    suffixed = [line.endswith('.0"}') for line in module.lines("train")]
    assert sum(suffixed) == 1815 and not any(t.endswith('.0"}') for t in module.lines("test"))


@pytest.mark.parametrize("on", [False, True])
def test_rl_prefix_cache_reaches_the_workers_engines(on):
    from meltemi.levanter.config import resolve
    from meltemi.levanter.rl import RLTrainer

    config = _rl_config(prefix_cache=on)
    trainer = RLTrainer(resolve(config), rl_spec(config))
    assert trainer._worker_spec().engine.prefix_cache is on
