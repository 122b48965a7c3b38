"""The engine's scheduler: greedy parity with `generate`, batching independence, pages,
cancellation, refusals, `n` samples, seeded sampling, logprobs, compiles, weight updates."""

import dataclasses

import jax
import model_testing as T
import numpy as np
import pytest

import meltemi.models as mm
from meltemi.models.engine import (
    PAGED_BACKENDS,
    Engine,
    EngineConfig,
    EngineError,
    QueueFullError,
    Request,
    RequestError,
    reference_paged_attention,
)

CFG = mm.get_preset("tiny-llama").replace(max_seq_len=64)
PAGE_BYTES = 2 * CFG.num_layers * 4 * CFG.num_kv_heads * CFG.head_size * 4  # k+v, page 4, f32
CONFIG = EngineConfig(
    kv_bytes=80 * PAGE_BYTES, page_size=4, max_seqs=4, prefill_chunk=8, max_logprobs=3
)
PROMPTS = [
    [3, 17, 29, 4, 41, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19],
    [5, 60],
    [7, 1, 33, 2, 9],
]
SAMPLED = mm.SamplingConfig(temperature=1.0, top_k=20, top_p=0.9)


@pytest.fixture(scope="module")
def model():
    return T.random_model(CFG, seed=1)


def _tokens(engine, ids):
    out = engine.run_until_done()
    return [out[i] for i in ids]


# -- greedy parity ----------------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3", "tiny-mistral"])
def test_greedy_tokens_equal_generate(preset):
    # qwen3: QK-norm; mistral: sliding window 5 (prompts cross it, pages and chunks).
    cfg = mm.get_preset(preset).replace(max_seq_len=64)
    model = T.random_model(cfg, seed=4)
    ref = mm.generate(model, PROMPTS, max_new_tokens=20, eos_token_id=None)
    engine = Engine(model, CONFIG)
    ids = [engine.submit(Request(p, 20, stop_ids=())) for p in PROMPTS]
    assert [s[0] for s in _tokens(engine, ids)] == ref


def test_requests_arriving_mid_flight_get_the_tokens_they_get_alone(model):
    alone = []
    for p in PROMPTS:
        engine = Engine(model, CONFIG)
        alone.append(_tokens(engine, [engine.submit(Request(p, 12, stop_ids=()))])[0])
    engine = Engine(model, CONFIG)
    ids = [engine.submit(Request(PROMPTS[0], 12, stop_ids=()))]
    out: dict[int, list[int]] = {}
    for step in range(40):
        if step in (3, 5):  # mid-prefill of nothing, mid-decode of the first
            ids.append(engine.submit(Request(PROMPTS[len(ids)], 12, stop_ids=())))
        for e in engine.step():
            out.setdefault(e.request_id, []).append(e.token)
    assert [[out[i]] for i in ids] == alone
    assert alone[0] != alone[1]


def test_long_prompt_is_prefilled_in_chunks_between_decoding_steps(model):
    engine = Engine(model, CONFIG)
    a = engine.submit(Request([5, 6], 20, stop_ids=()))
    engine.step()  # a: prefilled, first token
    b = engine.submit(Request(list(range(1, 30)), 4, stop_ids=()))  # 4 chunks of 8
    per_step = [[e.request_id for e in engine.step()] for _ in range(5)]
    assert per_step[:3] == [[a], [a], [a]]  # a decodes at every step of b's prefill
    assert per_step[3] == [a, b]


def test_a_step_runs_one_compiled_program_while_a_prompt_prefills_beside_decodes(model):
    engine = Engine(model, CONFIG)
    a = engine.submit(Request([5, 6], 20, stop_ids=()))
    engine.step()  # a: prefilled, first token
    # 29 tokens: 4 chunks of 8; 2 samples, the partial last page copied at the last chunk
    b = engine.submit(Request(list(range(1, 30)), 4, stop_ids=(), n=2))
    calls = []

    def counting(fn):
        def call(*args):
            calls.append(fn)
            return fn(*args)

        return call

    progs = engine._programs
    engine._programs = type(progs)(*[f and counting(f) for f in progs])
    for step in range(4):
        calls.clear()
        events = engine.step()
        assert len(calls) == 1, f"step {step}: {len(calls)} compiled calls"
    assert [(e.request_id, e.sample) for e in events] == [(a, 0), (b, 0), (b, 1)]


def test_a_prompt_prefilled_beside_decodes_gets_what_it_gets_alone(model):
    # Several chunks, two seeded samples sharing the prompt's pages (the partial last page
    # copied), logprobs: prefilled while a greedy request and a sampled one decode.
    long = Request(list(range(3, 30)), 6, sampling=SAMPLED, stop_ids=(), n=2, logprobs=2, seed=4)
    others = [
        Request(PROMPTS[1], 12, stop_ids=()),
        Request(PROMPTS[2], 12, sampling=SAMPLED, stop_ids=(), seed=5, logprobs=1),
    ]

    def events(requests, arrivals):
        engine = Engine(model, CONFIG)
        out = []
        for step in range(40):
            for r, at in zip(requests, arrivals, strict=True):
                if at == step:
                    engine.submit(r)
            out += engine.step()
        assert not engine.has_work
        return out

    together = events([*others, long], [0, 0, 2])
    for i, r in enumerate([*others, long]):
        alone = events([r], [0])
        mine = [e for e in together if e.request_id == i]
        assert [e[1:3] + e[5:] for e in mine] == [e[1:3] + e[5:] for e in alone]
        np.testing.assert_allclose([e.logprob for e in mine], [e.logprob for e in alone], atol=1e-5)
        if r.logprobs:
            np.testing.assert_allclose(
                [[lp for _, lp in e.top_logprobs] for e in mine],
                [[lp for _, lp in e.top_logprobs] for e in alone],
                atol=1e-5,
            )


# -- pages ------------------------------------------------------------------------------------


def test_pages_are_planned_at_admission_freed_at_the_end_and_reused(model):
    engine = Engine(model, CONFIG)
    capacity = engine.pages.capacity
    assert capacity == 79  # 80 pages of the budget, one reserved
    ids = [engine.submit(Request(p, 10, stop_ids=())) for p in PROMPTS]
    engine.step()
    # ceil((prompt + 10 - 1) / 4) pages each: 17 -> 7, 2 -> 3, 5 -> 4
    assert capacity - engine.pages.num_free == 7 + 3 + 4
    held = {p for p in range(engine.num_pages) if engine.pages.refcount[p]}
    _tokens(engine, ids)
    assert engine.pages.num_free == capacity and not engine.pages.refcount.any()
    engine.submit(Request(PROMPTS[0], 10, stop_ids=()))
    engine.step()
    again = {p for p in range(engine.num_pages) if engine.pages.refcount[p]}
    assert again <= held  # freed pages are handed out again


def test_cancel_frees_pages_and_ends_the_request(model):
    engine = Engine(model, CONFIG)
    running = engine.submit(Request(PROMPTS[0], 30, stop_ids=()))
    for _ in range(3):
        engine.step()
    assert engine.pages.num_free < engine.pages.capacity
    assert engine.cancel(running)
    assert engine.pages.num_free == engine.pages.capacity and not engine.has_work
    assert engine.step() == [] and not engine.cancel(running)


def test_cancel_of_one_sample_keeps_the_others(model):
    engine = Engine(model, CONFIG)
    rid = engine.submit(Request(PROMPTS[2], 6, stop_ids=(), n=3))
    engine.step()
    assert engine.cancel(rid, sample=1)
    events = engine.step()
    assert sorted(e.sample for e in events) == [0, 2]
    engine.run_until_done()
    assert engine.pages.num_free == engine.pages.capacity


def test_cancelling_sample_0_mid_prefill_keeps_the_prompt_for_the_others(model):
    prompt = list(range(1, 30))  # 4 chunks; sample 0's pages hold the prompt for both
    alone = Engine(model, CONFIG)
    single = _tokens(alone, [alone.submit(Request(prompt, 5, stop_ids=()))])[0][0]
    engine = Engine(model, CONFIG)
    rid = engine.submit(Request(prompt, 5, stop_ids=(), n=2))
    engine.step()
    assert engine.cancel(rid, sample=0)
    events = []
    while engine.has_work:
        events += engine.step()
    assert {e.sample for e in events} == {1} and [e.token for e in events] == single
    assert engine.pages.num_free == engine.pages.capacity


def test_requests_wait_for_pages_instead_of_running_out(model):
    config = EngineConfig(
        kv_bytes=20 * PAGE_BYTES, page_size=4, max_seqs=4, prefill_chunk=8, max_logprobs=3
    )
    engine = Engine(model, config)
    ids = [engine.submit(Request(PROMPTS[0], 40, stop_ids=())) for _ in range(2)]  # 14 pages each
    engine.step()
    assert engine.num_running == 1 and engine.num_waiting == 1
    out = _tokens(engine, ids)
    assert out[0] == out[1] and len(out[0][0]) == 40


def test_n_samples_share_the_prompt_pages(model):
    engine = Engine(model, CONFIG)
    prompt = PROMPTS[0]  # 17 tokens: 4 full pages and one partial
    rid = engine.submit(Request(prompt, 6, stop_ids=(), n=3))
    engine.step()
    per_sample = -(-(17 + 6 - 1) // 4)  # 6
    assert engine.pages.capacity - engine.pages.num_free == per_sample + 2 * (per_sample - 4)
    # 4 prompt pages held by all 3 samples; 2 own pages each (the partial one copied)
    assert np.bincount(engine.pages.refcount, minlength=4)[1:].tolist() == [6, 0, 4]
    greedy = engine.run_until_done()[rid]
    alone = Engine(model, CONFIG)
    single = _tokens(alone, [alone.submit(Request(prompt, 6, stop_ids=()))])[0][0]
    assert greedy == [single] * 3  # the copied partial page holds the prompt's tail


# -- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_, match",
    [
        (Request([1] * 60, 5), r"max_tokens=5 \+ 60 prompt tokens = 65 exceeds max_seq_len=64"),
        (Request([1, 2], 40, n=4), r"needs 44 KV pages .* holds 19 \(EngineConfig.kv_bytes"),
        (Request([1, 2], 4, n=5), r"Request.n=5: must be in \[1, max_seqs=4\]"),
        (Request([1, 2], 4, logprobs=4), r"Request.logprobs=4: must be in \[0, max_logprobs=3\]"),
        (Request([], 4), r"Request.prompt_ids is empty"),
        (Request([1, 67], 4), r"Request.prompt_ids holds 67, outside the vocabulary \[0, 67\)"),
        (Request([1], 0), r"Request.max_tokens=0: must be an int >= 1"),
    ],
)
def test_requests_that_can_never_run_are_refused_at_submit(model, request_, match):
    config = EngineConfig(
        kv_bytes=20 * PAGE_BYTES, page_size=4, max_seqs=4, prefill_chunk=8, max_logprobs=3
    )
    engine = Engine(model, config)
    with pytest.raises(RequestError, match=match):
        engine.submit(request_)
    assert not engine.has_work


def test_engine_config_errors_name_the_field(model):
    with pytest.raises(
        EngineError, match=r"kv_bytes=15360: holds 10 pages .* Fix: kv_bytes>=26112"
    ):
        Engine(model, EngineConfig(kv_bytes=10 * PAGE_BYTES, page_size=4))
    with pytest.raises(EngineError, match=r"max_seq_len=65 exceeds the model's max_seq_len=64"):
        Engine(model, EngineConfig(kv_bytes=1 << 20, max_seq_len=65))
    with pytest.raises(EngineError, match=r"attention_backend='pallas': no such paged"):
        Engine(model, EngineConfig(kv_bytes=1 << 20, attention_backend="pallas"))
    with pytest.raises(EngineError, match=r"EngineConfig.page_size=0: must be an int >= 1"):
        EngineConfig(kv_bytes=1 << 20, page_size=0)


def test_queue_bound_refuses_with_queue_full(model):
    engine = Engine(model, EngineConfig(kv_bytes=1 << 20, page_size=4, max_waiting=1))
    engine.submit(Request([1, 2], 3))
    with pytest.raises(QueueFullError, match="max_waiting=1: 1 requests already wait"):
        engine.submit(Request([1, 2], 3))


# -- sampling, stops, logprobs ----------------------------------------------------------------


def test_seeded_samples_do_not_depend_on_their_batch_companions(model):
    def run(companions):
        engine = Engine(model, CONFIG)
        for p in companions[:1]:
            engine.submit(Request(p, 9, sampling=SAMPLED, seed=99))
        rid = engine.submit(Request(PROMPTS[0], 10, sampling=SAMPLED, stop_ids=(), seed=7, n=2))
        for p in companions[1:]:
            engine.submit(Request(p, 5, sampling=mm.SamplingConfig(temperature=0.5)))
        return engine.run_until_done()[rid]

    alone = run([])
    assert run([PROMPTS[1], PROMPTS[2]]) == alone
    assert alone[0] != alone[1]  # samples draw with their own keys
    engine = Engine(model, CONFIG)
    other = engine.submit(Request(PROMPTS[0], 10, sampling=SAMPLED, stop_ids=(), seed=8))
    assert engine.run_until_done()[other][0] != alone[0]


def test_stop_ids_and_length_end_samples(model):
    engine = Engine(model, CONFIG)
    free = _tokens(engine, [engine.submit(Request(PROMPTS[1], 8, stop_ids=()))])[0][0]
    rid = engine.submit(Request(PROMPTS[1], 8, stop_ids=[free[3], 66]))
    events = []
    while engine.has_work:
        events += engine.step()
    stop_at = free.index(free[3])
    assert [e.token for e in events] == free[: stop_at + 1]
    assert [e.finish_reason for e in events] == [None] * stop_at + ["stop"]
    assert all(e.request_id == rid for e in events)
    rid = engine.submit(Request(PROMPTS[1], 3, stop_ids=()))
    assert engine.run_until_done()[rid] == [free[:3]]


def test_logprobs_are_the_models_log_softmax(model):
    engine = Engine(model, CONFIG)
    rid = engine.submit(Request(PROMPTS[2], 4, sampling=SAMPLED, stop_ids=(), logprobs=3, seed=3))
    events = []
    while engine.has_work:
        events += engine.step()
    tokens = [e.token for e in events]
    full = np.asarray(PROMPTS[2] + tokens[:-1], np.int32)[None]
    logits = model(full).rearrange(("batch", "position", "vocab")).array[0, len(PROMPTS[2]) - 1 :]
    ref = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    for t, e in enumerate(events):
        assert e.request_id == rid
        np.testing.assert_allclose(e.logprob, ref[t, e.token], atol=1e-5)
        top = np.argsort(-ref[t])[:3]
        assert [i for i, _ in e.top_logprobs] == top.tolist()
        np.testing.assert_allclose([lp for _, lp in e.top_logprobs], ref[t, top], atol=1e-5)


def test_several_decoding_steps_per_call_give_the_same_events(model):
    def run(decode_steps):
        engine = Engine(model, dataclasses.replace(CONFIG, decode_steps=decode_steps))
        engine.submit(Request(PROMPTS[0], 7, stop_ids=(), logprobs=2))
        engine.submit(Request(PROMPTS[1], 11, sampling=SAMPLED, stop_ids=(), n=2, seed=5))
        events = []
        for step in range(60):
            if step == 4:  # arrives while the others decode several steps per call
                engine.submit(Request(PROMPTS[2], 9, stop_ids=[13, 40, 52]))
            events += engine.step()
        assert not engine.has_work
        return sorted(events, key=lambda e: (e.request_id, e.sample))

    one, four = run(1), run(4)
    assert [e[:3] + e[5:] for e in four] == [e[:3] + e[5:] for e in one]
    np.testing.assert_allclose([e.logprob for e in four], [e.logprob for e in one], atol=1e-5)


# -- shapes, compiles and weights --------------------------------------------------------------


def test_decoding_attends_only_over_the_live_samples_and_their_pages(model, monkeypatch):
    seen = set()  # (batch, query length, pages) of each traced attention call

    def recording(q, k_pool, v_pool, page_table, q_positions, **kwargs):
        seen.add((*q_positions.shape, page_table.shape[1]))
        return reference_paged_attention(q, k_pool, v_pool, page_table, q_positions, **kwargs)

    monkeypatch.setitem(PAGED_BACKENDS, "recording_e3", recording)
    engine = Engine(model, dataclasses.replace(CONFIG, attention_backend="recording_e3"))
    rid = engine.submit(Request([5, 60], 3, stop_ids=()))  # positions 0..3: one page of 4
    assert len(engine.run_until_done()[rid][0]) == 3
    assert seen == {(1, 8, 1), (1, 1, 1)}  # prefill chunk of 8, then batch 1 over 1 page
    seen.clear()
    ids = [engine.submit(Request(p, 10, stop_ids=())) for p in PROMPTS]
    out = engine.run_until_done()
    # 17 + 10 - 1 positions need 7 pages (bucket 8); 3 samples decode as a batch of 4; the
    # first to be admitted decodes alone while the others prefill, the last ones in pairs.
    assert {s for s in seen if s[1] == 1} <= {(b, 1, p) for b in (1, 2, 4) for p in (1, 2, 4, 8)}
    assert (4, 1, 8) in seen and max(s[2] for s in seen) == 8
    engine = Engine(model, CONFIG)
    assert [out[i] for i in ids] == _tokens(engine, [engine.submit(Request(p, 10, stop_ids=()))
                                                     for p in PROMPTS])  # fmt: skip


@pytest.fixture(scope="module")
def fresh_model():
    """A model of a structure no other test compiles programs for (engines of one structure
    share their compiled programs)."""
    return T.random_model(CFG.replace(max_seq_len=63), seed=1)


# A context of 16 at 2 slots: fewer buckets to compile than CONFIG (18 programs against 45).
SERVING = dataclasses.replace(CONFIG, max_seq_len=16, max_seqs=2)


def test_warmup_compiles_every_bucket_once(fresh_model):
    engine = Engine(fresh_model, dataclasses.replace(SERVING, decode_steps=4))
    # batch buckets 1, 2 x page buckets 1, 2, 4, three times: the decoding step of 1 and of 4
    # steps, the mixed step (decoding rows and a prompt chunk).
    assert engine.num_programs == 3 * 2 * 3
    assert T.count_compiles(engine.warmup) == engine.num_programs
    assert T.count_compiles(engine.warmup) == 0


def _mixed_load(engine, rng):
    ids = []
    for step in range(30):
        if step % 3 == 0:
            length = int(rng.integers(1, 10))
            sampling = SAMPLED if step % 2 else mm.SamplingConfig()
            ids.append(
                engine.submit(
                    Request(
                        rng.integers(1, 67, length).tolist(),
                        int(rng.integers(1, 7)),
                        sampling=sampling,
                        n=1 + step % 2,
                        logprobs=step % 4 or None,
                        seed=step,
                    )
                )
            )
        if step == 10:
            engine.cancel(ids[1])
        engine.step()
    engine.run_until_done()


@pytest.mark.parametrize("decode_steps", [1, 4])
def test_steady_serving_compiles_nothing(fresh_model, decode_steps):
    # Shares the programs the warm-up test compiled (when it ran first).
    engine = Engine(fresh_model, dataclasses.replace(SERVING, decode_steps=decode_steps))
    engine.warmup()
    rng = np.random.default_rng(0)
    assert T.count_compiles(lambda: _mixed_load(engine, rng)) == 0


def test_update_weights_changes_outputs_without_recompiling(model):
    engine = Engine(model, CONFIG)
    before = _tokens(engine, [engine.submit(Request(PROMPTS[0], 10, stop_ids=()))])[0]
    new = T.random_model(CFG, seed=9)

    def update_and_run():
        engine.update_weights(new)
        return _tokens(engine, [engine.submit(Request(PROMPTS[0], 10, stop_ids=()))])[0]

    after = []
    assert T.count_compiles(lambda: after.append(update_and_run())) == 0
    assert after[0] != before
    assert after[0][0] == mm.generate(new, [PROMPTS[0]], max_new_tokens=10, eos_token_id=None)[0]


def test_update_weights_refuses_other_shapes(model):
    engine = Engine(model, CONFIG)
    with pytest.raises(EngineError, match=r"config differs .*num_layers: 3 -> 2"):
        engine.update_weights(T.random_model(CFG.replace(num_layers=2)))
    bf16 = jax.tree.map(lambda x: x.astype("bfloat16"), model)
    with pytest.raises(
        EngineError, match=r"parameter .*embed.* is bfloat16\[67, 30\], the engine's is float32"
    ):
        engine.update_weights(bf16)
