"""KV-cache generation: cache == recompute, padding invariance, eos stop, sampling."""

import jax
import jax.numpy as jnp
import model_testing as T
import numpy as np
import pytest

import meltemi.models as mm
from meltemi.models._sampling import filter_logits, sample

PROMPTS = [[5, 6, 7, 9, 11, 3, 2], [8], [3, 4, 60]]  # lengths 7, 1, 3


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-gpt2", "tiny-qwen3-moe"])
def model(request):
    return T.random_model(mm.get_preset(request.param), seed=3)


@pytest.fixture(scope="module")
def greedy(model):
    return mm.generate(model, PROMPTS, max_new_tokens=6, eos_token_id=None)


def test_cached_greedy_decoding_matches_recomputing_the_full_sequence(model, greedy):
    full = mm.generate(model, PROMPTS, max_new_tokens=6, eos_token_id=None, use_cache=False)
    assert greedy == full
    assert [len(g) for g in greedy] == [6, 6, 6]


def test_a_prompt_continues_the_same_alone_or_batched_with_longer_ones(model, greedy):
    alone = mm.generate(model, [PROMPTS[1]], max_new_tokens=6, eos_token_id=None)
    assert alone[0] == greedy[1]


def test_rows_stop_after_their_eos_token(model, greedy):
    eos = greedy[0][2]  # the third token row 0 emits
    out = mm.generate(model, PROMPTS, max_new_tokens=6, eos_token_id=eos)
    for row, ref in zip(out, greedy, strict=True):
        cut = ref.index(eos) + 1 if eos in ref else len(ref)
        assert row == ref[:cut]


def test_top_k_one_sampling_is_greedy():
    model = T.random_model(mm.get_preset("tiny-llama"), seed=3)
    sampling = mm.SamplingConfig(temperature=0.8, top_k=1)
    out = mm.generate(
        model,
        PROMPTS,
        max_new_tokens=4,
        sampling=sampling,
        key=jax.random.key(1),
        eos_token_id=None,
    )
    assert out == [g[:4] for g in mm.generate(model, PROMPTS, max_new_tokens=4, eos_token_id=None)]


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = jnp.log(jnp.array([[0.05, 0.5, 0.15, 0.3], [0.25, 0.25, 0.25, 0.25]]))
    kept = np.isfinite(np.asarray(filter_logits(logits, top_k=None, top_p=0.7)))
    assert kept.tolist() == [[False, True, False, True], [True, True, True, False]]


def test_sampling_draws_only_allowed_tokens():
    logits = jnp.tile(jnp.log(jnp.array([0.05, 0.5, 0.15, 0.3])), (101, 1))
    draws = sample(logits, jax.random.key(0), mm.SamplingConfig(temperature=1.0, top_k=2))
    assert set(np.asarray(draws).tolist()) == {1, 3}


def test_sampling_without_a_key_is_an_error():
    model = T.random_model(mm.get_preset("tiny-llama"), seed=3)
    with pytest.raises(mm.ConfigError, match=r"needs key=\.\.\."):
        mm.generate(model, PROMPTS, max_new_tokens=2, sampling=mm.SamplingConfig(temperature=1.0))


def test_too_long_generation_names_max_seq_len():
    model = T.random_model(mm.get_preset("tiny-gpt2"), seed=3)
    with pytest.raises(mm.ConfigError, match="max_seq_len=64"):
        mm.generate(model, PROMPTS, max_new_tokens=60)


def test_empty_prompt_is_rejected():
    model = T.random_model(mm.get_preset("tiny-llama"), seed=3)
    with pytest.raises(mm.ConfigError, match="at least one token"):
        mm.generate(model, [[1], []], max_new_tokens=2)
