"""Bad input to the server: each refusal has an HTTP status and an OpenAI error body naming the
field, and the server answers normally right after (prompt past the context, budget past it,
unknown model, malformed JSON, invalid sampling values, a client leaving mid-stream, a full
queue, a missing API key)."""

import concurrent.futures
import json
import threading
import time

import chat_testing
import httpx
import openai
import pytest

import meltemi.models as mm
from meltemi.models.engine import EngineConfig
from meltemi.models.serve import RETRY_AFTER_S, BackgroundServer, load_app

CFG = mm.get_preset("tiny-llama")
PAGE = 8
PAGE_BYTES = chat_testing.page_bytes(CFG, PAGE)
MAX_WAITING = 3
ENGINE = EngineConfig(
    kv_bytes=20 * PAGE_BYTES, page_size=PAGE, max_seqs=4, max_seq_len=64, prefill_chunk=16,
    max_logprobs=3, max_waiting=MAX_WAITING,
)  # fmt: skip
NAME = "tiny-chat"
KEY = "s3cret-key-for-tests"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return chat_testing.write_checkpoint(tmp_path_factory.mktemp("serve") / "ckpt", seed=5)


@pytest.fixture(scope="module")
def server(checkpoint):
    yield from chat_testing.serve(checkpoint, ENGINE, NAME)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=120)


def _serves(client):
    """The server still answers a normal request."""
    out = client.completions.create(model=NAME, prompt="Hello", max_tokens=4, temperature=0)
    assert out.usage.completion_tokens >= 1
    chat = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0
    )
    assert chat.choices[0].finish_reason in ("stop", "length")


def _refused(client, error, param, match, **kwargs):
    kwargs = {"model": NAME, "prompt": "Hello", "max_tokens": 4, **kwargs}
    with pytest.raises(error, match=match) as info:
        client.completions.create(**kwargs)
    assert info.value.param == param
    _serves(client)
    return info.value


def test_prompt_longer_than_the_context_is_a_400_naming_prompt(client):
    e = _refused(
        client, openai.BadRequestError, "prompt", "64 tokens leave no room", prompt=[5] * 64
    )
    assert e.status_code == 400


@pytest.mark.parametrize(
    "prompt, match",
    [
        (["Hi", ""], r"prompt\[1\]: '' must be a non-empty string"),
        (["Hi", [5, 9999]], r"prompt\[1\]: token id 9999 is outside the vocabulary"),
        (["Hi"] * 65, r"a batch of 65 prompts; at most 64"),
    ],
)
def test_a_bad_batch_of_prompts_is_a_400_naming_the_prompt(client, prompt, match):
    _refused(client, openai.BadRequestError, "prompt", match, prompt=prompt)


def test_a_streamed_batch_is_a_400_naming_stream(client):
    _refused(client, openai.BadRequestError, "stream", "stream=true takes one prompt",
             prompt=["Hi", "Ho"], stream=True)  # fmt: skip


def test_a_batch_with_one_prompt_past_the_context_runs_none_of_it(client, server):
    """The first prompt is queued before the second is refused: it is cancelled at once (59
    tokens to go), not left running."""
    url = server[0]
    before = chat_testing.metrics(url)
    _refused(client, openai.BadRequestError, "prompt", "64 tokens leave no room",
             prompt=[[5, 6], [5] * 64], max_tokens=59)  # fmt: skip
    after = chat_testing.metrics(url)
    for key in ("meltemi_requests_total", "meltemi_requests_cancelled_total"):
        assert after[key] - before[key] >= 1, key  # _refused's check adds two requests
    assert (
        after["meltemi_requests_cancelled_total"] == before["meltemi_requests_cancelled_total"] + 1
    )


def test_chat_longer_than_the_context_is_a_400_naming_messages(client):
    with pytest.raises(openai.BadRequestError, match="messages: .* leave no room") as info:
        client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "Hello! " * 60}], max_tokens=4
        )
    assert info.value.param == "messages"
    _serves(client)


def test_max_tokens_over_the_budget_is_a_400_naming_max_tokens(client):
    _refused(client, openai.BadRequestError, "max_tokens", r"max_tokens<=\d+", max_tokens=200)


def test_max_tokens_past_the_kv_pool_is_a_400_naming_max_tokens(client):
    # 4 samples of 63 tokens need 32 pages, the pool holds 19: the engine refuses it.
    _refused(
        client, openai.BadRequestError, "max_tokens", "KV pages", max_tokens=60, n=4,
        temperature=1.0,
    )  # fmt: skip


def test_unknown_model_is_a_404_naming_model(client):
    e = _refused(client, openai.NotFoundError, "model", "'gpt-9' is not served", model="gpt-9")
    assert e.code == "model_not_found"


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("temperature", -0.5, "must be a number >= 0"),
        ("temperature", "hot", "must be a number >= 0"),
        ("top_p", 0.0, r"must be in \(0, 1\]"),
        ("top_p", 1.5, r"must be in \(0, 1\]"),
        ("n", 0, r"not an integer in \[1, 4\]"),
        ("n", 5, r"not an integer in \[1, 4\]"),
        ("max_tokens", 0, "not an integer"),
        ("logprobs", 9, r"not an integer in \[0, 3\]"),
        ("seed", -1, "not an integer"),
        ("stop", ["a", "b", "c", "d", "e"], "at most 4"),
        ("top_k", -3, "integer >= 1"),
        ("echo", True, "not supported"),
    ],
)
def test_invalid_sampling_value_is_a_400_naming_the_field(client, field, value, match):
    _refused(
        client, openai.BadRequestError, field, f"{field}: .*{match}", extra_body={field: value}
    )


def test_chat_top_logprobs_without_logprobs_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="needs logprobs=true") as info:
        client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "Hi"}], top_logprobs=2
        )
    assert info.value.param == "top_logprobs"


def test_bad_messages_are_a_400_naming_the_message(client):
    with pytest.raises(openai.BadRequestError, match=r"messages\[1\]") as info:
        client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "Hi"}, {"content": "x"}]
        )
    assert info.value.param == "messages[1]"
    _serves(client)


@pytest.mark.parametrize("body", [b"{not json", b"\xff\xfe", b"[1, 2]"])
def test_malformed_json_is_a_400(server, client, body):
    r = httpx.post(
        server[0] + "/v1/completions", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "JSON" in error["message"]
    _serves(client)


def test_client_leaving_mid_stream_cancels_its_request_and_frees_its_pages(server, client):
    url, runner = server
    start = chat_testing.metrics(url)
    before = start["meltemi_requests_cancelled_total"]
    body = {"model": NAME, "prompt": [7] * 4, "max_tokens": 59, "temperature": 0, "stream": True,
            "stop": ["@@never@@"]}  # fmt: skip
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data:")
                if seen == 3:
                    break  # leave mid-stream: the connection closes here
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = chat_testing.metrics(url)
        if m["meltemi_requests_cancelled_total"] > before and m["meltemi_kv_pages_in_use"] == 0:
            break
        time.sleep(0.05)
    assert m["meltemi_requests_cancelled_total"] == before + 1
    assert m["meltemi_kv_pages_in_use"] == 0
    # The request stopped early: fewer than its 59 tokens were generated.
    assert m["meltemi_generated_tokens_total"] - start["meltemi_generated_tokens_total"] < 59
    assert runner.engine.pages.num_free == runner.engine.pages.capacity
    _serves(client)


def test_requests_past_the_queue_bound_get_429_with_retry_after(server, client):
    url, runner = server
    gate = threading.Event()
    held = runner.call(lambda engine: gate.wait(60))  # the engine thread waits: nothing admitted
    count = MAX_WAITING + 2

    def ask(i):
        body = {"model": NAME, "prompt": [3 + i] * 3, "max_tokens": 4, "temperature": 0}
        return httpx.post(url + "/v1/completions", json=body, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(ask, i) for i in range(count)]
        deadline = time.monotonic() + 30
        while runner.pending_commands < count and time.monotonic() < deadline:
            time.sleep(0.01)
        gate.set()
        responses = [f.result() for f in futures]
    held.result(10)
    codes = sorted(r.status_code for r in responses)
    assert codes == [200] * MAX_WAITING + [429] * (count - MAX_WAITING)
    for r in responses:
        if r.status_code == 429:
            assert r.headers["retry-after"] == str(RETRY_AFTER_S)
            assert r.json()["error"]["code"] == "queue_full"
            assert "max_waiting=3" in r.json()["error"]["message"]
    _serves(client)


def test_api_key_is_required_on_every_route_but_health(checkpoint, capfd):
    app, runner = load_app(checkpoint, ENGINE, model_name=NAME, api_key=KEY, warmup=False)
    try:
        with BackgroundServer(app) as url:
            assert httpx.get(url + "/health").status_code == 200
            for path in ("/v1/models", "/metrics"):
                assert httpx.get(url + path).status_code == 401
            wrong = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
            with pytest.raises(openai.AuthenticationError, match="API key") as info:
                wrong.models.list()
            assert info.value.code == "invalid_api_key"
            right = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
            assert [m.id for m in right.models.list().data] == [NAME]
            out = right.completions.create(model=NAME, prompt="Hi", max_tokens=2, temperature=0)
            assert out.usage.completion_tokens >= 1
    finally:
        runner.stop()
    out, err = capfd.readouterr()
    assert KEY not in out + err


def test_binary_never_prints_the_api_key(checkpoint, monkeypatch, capfd):
    import pathlib
    import sys

    sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent / "bin"))
    import serve
    import uvicorn

    monkeypatch.setenv(serve.API_KEY_ENV, KEY)
    seen = {}

    def fake_run(app, host, port, log_level):
        seen.update(host=host, port=port)

    monkeypatch.setattr(uvicorn, "run", fake_run)
    # One slot, a context of 16: the binary's warm-up compiles 4 programs, not 32.
    argv = [f"--checkpoint={checkpoint}", "--port=8123", f"--kv_bytes={20 * PAGE_BYTES}",
            "--max_seq_len=16", "--page_size=8", "--max_seqs=1", "--prefill_chunk=8"]  # fmt: skip
    assert serve.main(argv) == 0
    assert seen == {"host": "127.0.0.1", "port": 8123}
    out, err = capfd.readouterr()
    assert "API key required" in err
    assert KEY not in out + err
    assert json.dumps(KEY) not in out + err


def test_unstreamed_client_that_leaves_has_its_request_cancelled(server, client):
    url, runner = server
    start = chat_testing.metrics(url)
    gate = threading.Event()
    held = runner.call(lambda engine: gate.wait(60))  # nothing runs until the client is gone
    body = {"model": NAME, "prompt": [9] * 4, "max_tokens": 59, "temperature": 0,
            "stop": ["@@never@@"]}  # fmt: skip
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/v1/completions", json=body, timeout=1.0)
    gate.set()
    held.result(10)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = chat_testing.metrics(url)
        if m["meltemi_requests_cancelled_total"] > start["meltemi_requests_cancelled_total"]:
            break
        time.sleep(0.05)
    assert m["meltemi_requests_cancelled_total"] == start["meltemi_requests_cancelled_total"] + 1
    assert m["meltemi_generated_tokens_total"] - start["meltemi_generated_tokens_total"] < 59
    assert runner.engine.pages.num_free == runner.engine.pages.capacity
    _serves(client)
