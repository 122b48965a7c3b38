"""The OpenAI-compatible server, driven by the official `openai` client over real HTTP: completions
and chat, streamed and not, `n`, stop strings, logprobs, seeds, concurrent clients, metrics, and
greedy output equal to the engine's own."""

import concurrent.futures
import pathlib
import sys

import chat_testing
import httpx
import numpy as np
import openai
import pytest

import meltemi.models as mm
from meltemi.models import chat, hf
from meltemi.models.engine import Engine, EngineConfig, Request

sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent / "bin"))
CFG = mm.get_preset("tiny-llama")
PAGE = 8
PAGE_BYTES = chat_testing.page_bytes(CFG, PAGE)
ENGINE = EngineConfig(
    kv_bytes=64 * PAGE_BYTES, page_size=PAGE, max_seqs=4, max_seq_len=64, prefill_chunk=16,
    max_logprobs=3, max_waiting=8,
)  # fmt: skip
NAME = "tiny-chat"
PROMPT = "Hello! How are you today?"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return chat_testing.write_checkpoint(tmp_path_factory.mktemp("serve") / "ckpt", seed=3)


@pytest.fixture(scope="module")
def server(checkpoint):
    yield from chat_testing.serve(checkpoint, ENGINE, NAME)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def direct(checkpoint):
    """The same checkpoint run by an engine directly (no server), and its tokenizer."""
    model, _ = hf.load(checkpoint)
    return Engine(model, ENGINE), chat.load_tokenizer(checkpoint)


def _ids(tokenizer, text):
    return [int(i) for i in tokenizer.encode_with_offsets(text)[0]]


# -- greedy parity ----------------------------------------------------------------------------


def test_greedy_completion_equals_the_engines_direct_output(client, direct):
    engine, tokenizer = direct
    prompt = _ids(tokenizer, PROMPT)
    rid = engine.submit(Request(prompt, max_tokens=20, logprobs=0))
    ref = engine.run_until_done()[rid][0]
    out = client.completions.create(
        model=NAME, prompt=PROMPT, max_tokens=20, temperature=0, logprobs=0
    )
    choice = out.choices[0]
    assert choice.text == tokenizer.decode(ref)
    assert out.usage.completion_tokens == len(ref)
    assert out.usage.prompt_tokens == len(prompt)
    assert choice.logprobs.tokens == [tokenizer.decode([t]) for t in ref]
    # Token ids as the prompt give the same continuation.
    again = client.completions.create(model=NAME, prompt=prompt, max_tokens=20, temperature=0)
    assert again.choices[0].text == choice.text


def test_greedy_chat_equals_the_engine_on_the_rendered_template(client, direct, checkpoint):
    engine, tokenizer = direct
    messages = [{"role": "user", "content": "What is the capital of Greece?"}]
    talk = chat.Chat.from_directory(checkpoint)
    rid = engine.submit(Request(talk.prompt_ids(messages), max_tokens=12))
    ref = engine.run_until_done()[rid][0]
    out = client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=12, temperature=0
    )
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == tokenizer.decode(ref)
    eos = set(talk.eos_token_ids)
    expected = "stop" if ref[-1] in eos else "length"
    assert out.choices[0].finish_reason == expected


# -- streaming --------------------------------------------------------------------------------


def test_streamed_completion_joins_to_the_unstreamed_text(client):
    whole = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=16, temperature=0)
    chunks = list(
        client.completions.create(
            model=NAME, prompt=PROMPT, max_tokens=16, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[
        0
    ].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # One chunk per generated token.
    assert sum(1 for c in chunks if c.choices) == whole.usage.completion_tokens


def test_streamed_chat_joins_to_the_unstreamed_reply(client):
    messages = [{"role": "user", "content": "Hello!"}]
    whole = client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=10, temperature=0
    )
    stream = client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=10, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.choices[0].message.content


# -- stop strings, n, seeds, logprobs -----------------------------------------------------------


def _stop_of(text):
    """A 3-character piece from the middle of `text` (no split character in it)."""
    for start in range(4, len(text) - 3):
        piece = text[start : start + 3]
        if "\ufffd" not in piece and text.find(piece) == start:
            return piece
    raise AssertionError(f"no stop string to pick in {text!r}")


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_cuts_the_text_before_it(client, stream):
    full = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=30, temperature=0)
    text = full.choices[0].text
    stop = _stop_of(text)
    kwargs = dict(model=NAME, prompt=PROMPT, max_tokens=30, temperature=0, stop=[stop, "@@@"])
    if stream:
        chunks = [c for c in client.completions.create(**kwargs, stream=True) if c.choices]
        got = "".join(c.choices[0].text for c in chunks)
        reason = chunks[-1].choices[0].finish_reason
    else:
        out = client.completions.create(**kwargs)
        got, reason = out.choices[0].text, out.choices[0].finish_reason
    assert got == text[: text.find(stop)]
    assert reason == "stop"


def test_n_samples_are_reproducible_with_a_seed_and_differ_from_each_other(client):
    kwargs = dict(model=NAME, prompt=PROMPT, max_tokens=12, temperature=1.0, n=3, seed=7)
    a = client.completions.create(**kwargs)
    b = client.completions.create(**kwargs)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert len({c.text for c in a.choices}) > 1
    c = client.completions.create(**{**kwargs, "seed": 8})
    assert [x.text for x in c.choices] != [x.text for x in a.choices]


def test_streamed_n_samples_equal_the_unstreamed_ones(client):
    kwargs = dict(model=NAME, prompt=PROMPT, max_tokens=8, temperature=1.0, n=2, seed=11)
    whole = client.completions.create(**kwargs)
    texts = ["", ""]
    for c in client.completions.create(**kwargs, stream=True):
        texts[c.choices[0].index] += c.choices[0].text
    assert texts == [c.text for c in whole.choices]


def test_completion_logprobs_list_the_top_alternatives(client, direct):
    out = client.completions.create(
        model=NAME, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3
    )
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    for chosen, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert 1 <= len(top) <= 3
        # Greedy: the chosen token is the most likely one.
        assert value == pytest.approx(max(top.values()), abs=1e-6)
        assert top[chosen] == pytest.approx(value, abs=1e-6)
    assert lp.text_offset == list(np.cumsum([0] + [len(t) for t in lp.tokens[:-1]]))


def test_chat_logprobs_carry_top_logprobs(client):
    out = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
        temperature=0, logprobs=True, top_logprobs=2,
    )  # fmt: skip
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    for item in content:
        assert len(item.top_logprobs) == 2
        assert item.logprob == pytest.approx(item.top_logprobs[0].logprob, abs=1e-6)
        assert item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob


# -- concurrency, metrics, models ---------------------------------------------------------------


def test_concurrent_clients_get_their_sequential_answers(client):
    prompts = [PROMPT, "What is the capital", "Καλημέρα", "system user", "thank you", "Athens"]

    def ask(prompt):
        out = client.completions.create(model=NAME, prompt=prompt, max_tokens=14, temperature=0)
        return out.choices[0].text

    sequential = [ask(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(ask, prompts))
    assert together == sequential


def test_models_lists_the_served_name(client):
    assert [m.id for m in client.models.list().data] == [NAME]


def test_metrics_count_requests_and_tokens_and_steady_serving_compiles_nothing(server, client):
    url, runner = server
    client.completions.create(model=NAME, prompt=PROMPT, max_tokens=3, temperature=0)
    before = chat_testing.metrics(url)
    out = client.completions.create(model=NAME, prompt="Athens is", max_tokens=5, temperature=0)
    after = chat_testing.metrics(url)
    assert after["meltemi_requests_total"] == before["meltemi_requests_total"] + 1
    assert after["meltemi_generated_tokens_total"] == (
        before["meltemi_generated_tokens_total"] + out.usage.completion_tokens
    )
    assert after["meltemi_compiles_total"] == before["meltemi_compiles_total"]
    assert after["meltemi_kv_pages_in_use"] == 0
    assert after["meltemi_kv_pages_capacity"] == runner.engine.pages.capacity
    assert after["meltemi_queue_depth"] == 0


def test_health_is_ok(server):
    assert httpx.get(server[0] + "/health").json() == {"status": "ok"}


# -- the binary -------------------------------------------------------------------------------


def test_binary_refuses_a_missing_checkpoint_with_one_error_line(tmp_path, capsys):
    import serve

    assert serve.main([f"--checkpoint={tmp_path / 'nothing'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: checkpoint=") and err.count("\n") == 1


def test_binary_passes_the_step_budget_and_refuses_a_bad_one_in_one_line(capsys):
    import serve

    assert serve.main(["--checkpoint=unused", "--max_seqs=4", "--max_step_tokens=4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: EngineConfig.max_step_tokens=4") and err.count("\n") == 1
    assert serve.main(["--checkpoint=unused", "--max_prefills=0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: EngineConfig.max_prefills=0") and err.count("\n") == 1


def test_ignore_eos_generates_exactly_max_tokens(client, direct):
    engine, tokenizer = direct
    prompt = _ids(tokenizer, "Athens")
    rid = engine.submit(Request(prompt, max_tokens=40, stop_ids=()))
    ref = engine.run_until_done()[rid][0]
    out = client.completions.create(
        model=NAME, prompt=prompt, max_tokens=40, temperature=0, extra_body={"ignore_eos": True}
    )
    assert out.usage.completion_tokens == 40
    assert out.choices[0].text == tokenizer.decode(ref)
    assert out.choices[0].finish_reason == "length"


def test_weights_updated_through_the_runner_are_served_without_restart(server, client, checkpoint):
    import model_testing

    _, runner = server
    model, config = hf.load(checkpoint)

    def ask():
        out = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=8, temperature=0)
        return out.choices[0].text

    before = ask()
    other = model_testing.random_model(config, seed=99)
    runner.call(lambda engine: engine.update_weights(other)).result(60)
    try:
        assert ask() != before
    finally:
        runner.call(lambda engine: engine.update_weights(model)).result(60)
    assert ask() == before


def test_runner_lowers_the_switch_interval_while_it_runs_and_restores_it(direct):
    import sys

    from meltemi.models.serve import EngineRunner

    engine, _ = direct
    before = sys.getswitchinterval()
    runner = EngineRunner(engine, switch_interval_s=1e-4)
    runner.start(warmup=False)
    try:
        assert sys.getswitchinterval() == pytest.approx(1e-4)
    finally:
        runner.stop()
    assert sys.getswitchinterval() == before
    untouched = EngineRunner(engine, switch_interval_s=None)
    untouched.start(warmup=False)
    untouched.stop()
    assert sys.getswitchinterval() == before


def test_prefix_cache_reads_a_shared_prompt_start_and_reports_it(checkpoint, direct):
    """`--prefix_cache`: the second request's shared start comes from the cache (OpenAI's
    `usage.prompt_tokens_details.cached_tokens`, and `/metrics`), with the uncached tokens."""
    import dataclasses

    engine, tokenizer = direct
    start = _ids(tokenizer, "You are a helpful assistant. Answer in one word. Question:")
    prompts = [start + _ids(tokenizer, " Athens?"), start + _ids(tokenizer, " Rome?")]
    cached = dataclasses.replace(ENGINE, prefix_cache=True)
    for url, _ in chat_testing.serve(checkpoint, cached, NAME):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        outs = [
            client.completions.create(model=NAME, prompt=p, max_tokens=6, temperature=0)
            for p in prompts
        ]
        total = chat_testing.metrics(url)["meltemi_prompt_cached_tokens_total"]
    assert outs[0].usage.prompt_tokens_details.cached_tokens == 0
    assert outs[1].usage.prompt_tokens_details.cached_tokens == len(start) // PAGE * PAGE > 0
    assert total == outs[1].usage.prompt_tokens_details.cached_tokens
    rid = engine.submit(Request(prompts[1], max_tokens=6))
    assert outs[1].choices[0].text == tokenizer.decode(engine.run_until_done()[rid][0])


def test_binary_passes_prefix_cache_to_the_engine(monkeypatch, capsys):
    import serve

    import meltemi.models.serve as ms

    seen = []

    def load_app(checkpoint, config, **kw):
        seen.append(config)
        raise mm.ConfigError("stop here")

    monkeypatch.setattr(ms, "load_app", load_app)
    for flags, want in (([], False), (["--prefix_cache"], True)):
        assert serve.main(["--checkpoint=unused", *flags]) == 2
        assert seen.pop().prefix_cache is want
    assert capsys.readouterr().err == "error: stop here\n" * 2


def test_a_batch_of_prompts_gets_each_prompts_own_answers(client):
    """OpenAI's batched completions: a list of prompts (strings or token ids); the choices come
    prompt by prompt, `n` each, and equal what each prompt gets alone."""
    prompts = ["Athens is", [5, 6, 7, 8], "Hello"]
    out = client.completions.create(
        model=NAME, prompt=prompts, max_tokens=5, temperature=1.0, seed=4, n=2
    )
    assert [c.index for c in out.choices] == list(range(6))
    alone = [
        client.completions.create(model=NAME, prompt=p, max_tokens=5, temperature=1.0, seed=4, n=2)
        for p in prompts
    ]
    assert [c.text for c in out.choices] == [c.text for a in alone for c in a.choices]
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert getattr(out.usage, key) == sum(getattr(a.usage, key) for a in alone)
