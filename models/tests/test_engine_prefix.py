"""The engine's prefix cache (`EngineConfig.prefix_cache`): a prompt that starts with pages
already computed prefills only the rest, and gets the tokens an uncached engine gives it; a
conversation's next turn reuses its earlier turns; cached pages give way when space is needed;
new weights forget them."""

import dataclasses

import jax
import jax.numpy as jnp
import model_testing as T
import numpy as np
import pytest

import meltemi.models as mm
from meltemi.models.engine import Engine, EngineConfig, EngineError, PageAllocator, Request
from meltemi.models.engine._pages import page_keys

CFG = mm.get_preset("tiny-llama").replace(max_seq_len=64)
PAGE_BYTES = 2 * CFG.num_layers * 4 * CFG.num_kv_heads * CFG.head_size * 4  # k+v, page 4, f32
CONFIG = EngineConfig(
    kv_bytes=40 * PAGE_BYTES, page_size=4, max_seqs=4, prefill_chunk=8, prefix_cache=True
)
SYSTEM = [3, 17, 29, 4, 41, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]  # 5 pages


@pytest.fixture(scope="module")
def model():
    return T.random_model(CFG, seed=1)


def _run(engine, request):
    """The request's events, and how many steps the engine took to finish it."""
    rid = engine.submit(request)
    events, steps = [], 0
    while engine.has_work:
        steps += 1
        events += [e for e in engine.step() if e.request_id == rid]
    return events, steps


def _uncached(model, request):
    engine = Engine(model, dataclasses.replace(CONFIG, prefix_cache=False))
    return _run(engine, request)[0]


def _same(got, want):
    assert [(e.sample, e.token) for e in got] == [(e.sample, e.token) for e in want]
    np.testing.assert_allclose([e.logprob for e in got], [e.logprob for e in want], atol=1e-5)


def test_a_shared_prefix_is_read_from_the_cache_with_the_uncached_tokens(model):
    engine = Engine(model, CONFIG)
    first = Request([*SYSTEM, 5, 6, 7], 6, stop_ids=())
    second = Request([*SYSTEM, 30, 31, 32, 33, 34, 35], 6, stop_ids=())
    events, steps = _run(engine, first)
    assert {e.cached_tokens for e in events} == {0} and steps == 3 + 5  # 23 tokens in chunks of 8
    events, steps = _run(engine, second)
    # 26 prompt tokens: the system prompt's 5 pages come from the cache, the 6 others are
    # prefilled in one chunk; uncached they take 4 chunks.
    assert {e.cached_tokens for e in events} == {20} and engine.num_cached_tokens == 20
    assert steps == 1 + 5
    _same(events, _uncached(model, second))
    assert engine.pages.num_free == engine.pages.capacity  # cached pages count as free


def test_a_repeated_prompt_prefills_its_last_page_again(model):
    """The page of the last prompt token is always prefilled (its logits start the samples),
    into a page of the request's own: a 5-page prompt seen before reads 4 from the cache."""
    engine = Engine(model, CONFIG)
    request = Request(SYSTEM, 4, stop_ids=())
    _run(engine, request)
    events, steps = _run(engine, request)
    assert events[0].cached_tokens == 16 and steps == 1 + 3
    _same(events, _uncached(model, request))


def test_a_prompts_pages_are_findable_as_soon_as_its_chunks_are_in(model):
    engine = Engine(model, CONFIG)
    engine.submit(Request([*SYSTEM, 5], 4, stop_ids=()))
    engine.step()  # its first chunk: 8 tokens, 2 pages
    request = Request([*SYSTEM[:8], 30, 31, 32, 33, 34, 35], 4, stop_ids=())
    rid = engine.submit(request)
    events = [e for e in engine.step() if e.request_id == rid]
    assert engine.num_running == 2  # admitted while the first prompt is still being prefilled
    while engine.has_work:
        events += [e for e in engine.step() if e.request_id == rid]
    assert events[0].cached_tokens == 8
    _same(events, _uncached(model, request))


def test_a_burst_with_one_system_prompt_prefills_it_once(model):
    """Requests that start like a prompt being prefilled wait for its pages rather than
    prefilling them beside it; later ones (behind them in the queue) wait in order."""
    engine = Engine(model, CONFIG)
    requests = [Request([*SYSTEM, 40 + i, 50 + i], 4, stop_ids=()) for i in range(3)]
    ids = [engine.submit(r) for r in requests]
    engine.step()
    assert engine.num_running == 1
    done = engine.run_until_done()
    assert engine.num_cached_tokens == 2 * len(SYSTEM)
    for rid, request in zip(ids, requests, strict=True):
        assert done[rid][0] == [e.token for e in _uncached(model, request)]


def test_the_cached_pages_are_what_the_request_reads(model):
    """The check above can fail: zeroing the cached pages' keys and values changes the output."""
    engine = Engine(model, CONFIG)
    _run(engine, Request([*SYSTEM, 5], 2, stop_ids=()))
    cached = engine.pages.match(page_keys(np.asarray(SYSTEM, np.int32), 4))
    assert len(cached) == 5
    engine._pools = jax.tree.map(lambda pool: pool.at[:, jnp.asarray(cached)].set(0), engine._pools)
    request = Request([*SYSTEM, 30, 31], 4, stop_ids=())
    events, _ = _run(engine, request)
    assert events[0].cached_tokens == 20
    want = _uncached(model, request)
    assert not np.allclose([e.logprob for e in events], [e.logprob for e in want], atol=1e-3)


def test_a_conversations_next_turn_reuses_its_earlier_turns(model):
    engine = Engine(model, CONFIG)
    prompt = [*SYSTEM[:13], 60]  # 14 tokens: 3 full pages, half of a fourth
    events, _ = _run(engine, Request(prompt, 10, stop_ids=()))
    reply = [e.token for e in events]
    # The reply's tokens but the last were fed back, so positions 0..22 hold keys and values:
    # 5 full pages are cached, the prompt's 3 and 2 made of the prompt's end and the reply
    # (the page of positions 20..23 is not: its last token was never fed).
    assert engine.pages.num_cached == 5
    turn = Request([*prompt, *reply, 7, 8, 9], 5, stop_ids=())
    events, _ = _run(engine, turn)
    assert events[0].cached_tokens == 20
    _same(events, _uncached(model, turn))


def test_n_samples_on_a_cached_prefix_get_the_uncached_tokens(model):
    engine = Engine(model, CONFIG)
    _run(engine, Request([*SYSTEM, 1], 2, stop_ids=()))
    sampled = mm.SamplingConfig(temperature=1.0, top_k=20)
    request = Request([*SYSTEM, 2, 3, 4, 5, 6], 6, stop_ids=(), n=3, sampling=sampled, seed=7)
    events, _ = _run(engine, request)
    assert events[0].cached_tokens == 20
    key = lambda e: (e.sample, e.token)  # noqa: E731
    want = _uncached(model, request)
    assert sorted(map(key, events)) == sorted(map(key, want))


def test_cached_pages_give_way_when_the_pool_needs_them(model):
    """40 pages: each finished request leaves up to 6 cached pages behind; later requests
    take their space (least recently released first) and every request runs."""
    engine = Engine(model, CONFIG)
    rng = np.random.default_rng(0)
    for _ in range(12):
        prompt = rng.integers(1, CFG.vocab_size, 17).tolist()
        engine.submit(Request(prompt, 8, stop_ids=()))
    done = engine.run_until_done()
    assert len(done) == 12 and all(len(s[0]) == 8 for s in done.values())
    assert engine.pages.num_free == engine.pages.capacity
    assert 0 < engine.pages.num_cached <= engine.pages.capacity


def test_new_weights_forget_the_cache(model):
    engine = Engine(model, CONFIG)
    _run(engine, Request([*SYSTEM, 5], 2, stop_ids=()))
    assert engine.pages.num_cached == 5
    other = T.random_model(CFG, seed=2)
    engine.update_weights(other)
    assert engine.pages.num_cached == 0
    request = Request([*SYSTEM, 30, 31], 4, stop_ids=())
    events, _ = _run(engine, request)
    assert events[0].cached_tokens == 0
    _same(events, _uncached(other, request))


def test_a_request_admitted_before_new_weights_caches_nothing(model):
    engine = Engine(model, CONFIG)
    rid = engine.submit(Request([*SYSTEM, 5], 6, stop_ids=()))
    engine.step()  # the first chunk is in under the old weights
    engine.update_weights(T.random_model(CFG, seed=2))
    while engine.has_work:
        engine.step()
    assert rid not in engine._live and engine.pages.num_cached == 0


def test_allocator_keeps_released_cached_pages_findable_until_needed():
    pages = PageAllocator(4)  # 3 pages
    a = pages.alloc(2)
    pages.register(a[0], b"x")
    pages.register(a[1], b"y")
    pages.release(a)
    assert pages.num_free == 3 and pages.match([b"x", b"y", b"z"]) == a
    assert pages.num_unheld(a) == 2
    pages.claim(a[:1])
    assert pages.num_free == 2 and pages.refcount[a[0]] == 1
    pages.release(a[:1])
    b = pages.alloc(2)  # the uncached page first, then the least recently released: a[1]
    assert a[1] in b and a[0] not in b
    assert pages.match([b"x"]) == a[:1] and pages.match([b"y"]) == []
    pages.clear_cache()
    assert pages.match([b"x"]) == [] and pages.num_free == 1 and pages.num_cached == 0


def test_prefix_cache_must_be_a_bool():
    with pytest.raises(EngineError, match=r"EngineConfig.prefix_cache='yes': must be a bool"):
        EngineConfig(kv_bytes=1 << 20, prefix_cache="yes")
