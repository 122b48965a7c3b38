"""The engine's per-step token budget (`EngineConfig.max_step_tokens`): no step exceeds it,
the tokens are those of the unbudgeted engine, prefill still moves under a full decoding
batch, every shape is compiled by `warmup`, and a bad budget is refused naming the field.
Several prompts share a step's chunk (`EngineConfig.max_prefills`) with the same tokens."""

import dataclasses

import model_testing as T
import numpy as np
import pytest

import meltemi.models as mm
from meltemi.models.engine import Engine, EngineConfig, EngineError, Request

# Context 16 in pages of 8: page buckets 1, 2; batch buckets 1, 2, 4 (a cheap warm-up).
CFG = mm.get_preset("tiny-llama").replace(max_seq_len=16)
PAGE_BYTES = 2 * CFG.num_layers * 8 * CFG.num_kv_heads * CFG.head_size * 4  # k+v, page 8, f32
FULL = EngineConfig(
    kv_bytes=40 * PAGE_BYTES, page_size=8, max_seqs=4, prefill_chunk=8, max_logprobs=2
)
BUDGET = 6  # chunks of 5, 4 and 2 tokens beside 1, 2 and 4 decoding rows
BUDGETED = dataclasses.replace(FULL, max_step_tokens=BUDGET)
SAMPLED = mm.SamplingConfig(temperature=1.0, top_k=20, top_p=0.9)
CANCELLED = 2  # the request `_scripted_load` cancels mid-flight


def _record_rows(engine) -> list[tuple[str, int]]:
    """Wraps the engine's programs; returns the list each call appends `(program, rows)` to
    (rows: the tokens of one pass through the model)."""
    calls: list[tuple[str, int]] = []
    progs = engine._programs

    def counting(name, fn):
        def call(*args):
            calls.append((name, int(np.shape(args[2])[0])))
            return fn(*args)

        return call

    engine._programs = type(progs)(
        *[f and counting(n, f) for n, f in zip(progs._fields, progs, strict=True)]
    )
    return calls


def _scripted_load(engine) -> dict[tuple[int, int], list[tuple[int, float]]]:
    """A fixed mix of arrivals (prompts of 1-10 tokens, greedy and seeded sampling, n of 1
    and 2, a cancel); `(request, sample) -> [(token, logprob)]`."""
    rng = np.random.default_rng(3)
    out: dict[tuple[int, int], list[tuple[int, float]]] = {}
    ids = []

    def take(events):
        for e in events:
            out.setdefault((e.request_id, e.sample), []).append((e.token, e.logprob))

    for step in range(24):
        if step % 2 == 0:
            ids.append(
                engine.submit(
                    Request(
                        rng.integers(1, 67, int(rng.integers(1, 11))).tolist(),
                        int(rng.integers(2, 7)),
                        sampling=SAMPLED if step % 4 else mm.SamplingConfig(),
                        n=1 + step % 3 // 2,
                        seed=step,
                        stop_ids=(),
                    )
                )
            )
        if step == 9:
            engine.cancel(ids[CANCELLED])
        take(engine.step())
    while engine.has_work:
        take(engine.step())
    return out


@pytest.fixture(scope="module")
def model():
    return T.random_model(CFG, seed=2)


@pytest.fixture(scope="module")
def runs(model):
    """The scripted load through the unbudgeted and the budgeted engine (the latter warmed
    up first, its compiles during the load counted)."""
    full = _scripted_load(Engine(model, FULL))
    engine = Engine(model, BUDGETED)
    engine.warmup()
    calls = _record_rows(engine)
    box = {}
    compiles = T.count_compiles(lambda: box.setdefault("out", _scripted_load(engine)))
    return {"full": full, "budgeted": box["out"], "calls": calls, "compiles": compiles}


def test_no_step_exceeds_the_token_budget(runs):
    rows = [r for _, r in runs["calls"]]
    assert max(rows) <= BUDGET
    # The load does fill the budget: mixed steps beside 1 and 4 decoding rows (chunks 5, 2).
    assert {("mixed", 6)} <= set(runs["calls"])
    assert sum(name == "mixed" for name, _ in runs["calls"]) >= 10


def test_a_budget_gives_the_unbudgeted_engines_tokens_and_logprobs(runs):
    full, budgeted = runs["full"], runs["budgeted"]
    assert budgeted.keys() == full.keys()
    for key, events in full.items():
        mine = budgeted[key]
        if key[0] == CANCELLED:  # cut at a different token: its steps are not the same
            n = min(len(mine), len(events))
            mine, events = mine[:n], events[:n]
        assert [t for t, _ in mine] == [t for t, _ in events], key
        np.testing.assert_allclose(
            [lp for _, lp in mine], [lp for _, lp in events], atol=1e-5, rtol=0
        )


def test_warmup_compiles_every_budgeted_chunk_shape(runs):
    assert runs["compiles"] == 0


def test_prefill_moves_under_a_full_decoding_batch(model):
    # 3 sequences decode (batch bucket 4): a budget of 5 leaves a 1-token chunk per step.
    engine = Engine(model, dataclasses.replace(FULL, max_step_tokens=5))
    calls = _record_rows(engine)
    running = [engine.submit(Request([5, 6, 7], 12, stop_ids=())) for _ in range(3)]
    while len(engine._generating()) < 3:
        engine.step()
    late = engine.submit(Request(list(range(1, 8)), 2, stop_ids=()))  # 7 prompt tokens
    steps = [[e.request_id for e in engine.step()] for _ in range(7)]
    assert steps == [running] * 6 + [[*running, late]]  # one token per step, none stalled
    assert calls[-7:] == [("mixed", 5)] * 7


def test_one_prompt_per_chunk_gives_the_same_tokens_and_logprobs(model, runs):
    single = _scripted_load(Engine(model, dataclasses.replace(FULL, max_prefills=1)))
    assert single.keys() == runs["full"].keys()
    for key, events in runs["full"].items():
        mine = single[key]
        if key[0] == CANCELLED:
            n = min(len(mine), len(events))
            mine, events = mine[:n], events[:n]
        assert [t for t, _ in mine] == [t for t, _ in events], key
        np.testing.assert_allclose([lp for _, lp in mine], [lp for _, lp in events], atol=1e-5)


@pytest.mark.parametrize("max_prefills, first_step", [(4, [0, 1, 1, 2]), (2, [0, 1, 1]), (1, [0])])
def test_a_burst_of_prompts_is_prefilled_in_one_step(model, max_prefills, first_step):
    """The chunk (8 tokens) takes the queued prompts in order, up to `max_prefills`: with 4,
    all three prompts (3 + 4 + 1 tokens, the second with 2 samples sharing its partial page)
    draw their first tokens in the first step. Tokens equal `generate`'s for every sample."""
    prompts, ns = [[3, 17, 29], [5, 60, 7, 9], [8]], [1, 2, 1]
    engine = Engine(model, dataclasses.replace(FULL, max_prefills=max_prefills))
    ids = [engine.submit(Request(p, 6, n=n, stop_ids=())) for p, n in zip(prompts, ns)]
    first = engine.step()
    assert [e.request_id for e in first] == [ids[i] for i in first_step]
    out = engine.run_until_done()
    for e in first:
        out[e.request_id][e.sample].insert(0, e.token)
    want = mm.generate(model, prompts, max_new_tokens=6, eos_token_id=None)
    for rid, n, tokens in zip(ids, ns, want, strict=True):
        assert out[rid] == [tokens] * n


def test_invalid_budget_is_refused_naming_the_field():
    with pytest.raises(
        EngineError,
        match=r"EngineConfig.max_step_tokens=4: must be an int >= max_seqs \+ 1 = 5 .* "
        r"Fix: max_step_tokens>=5, or None",
    ):
        EngineConfig(kv_bytes=1 << 20, max_seqs=4, max_step_tokens=4)
