"""`create_app`: the OpenAI-compatible FastAPI application over an `EngineRunner`.

Routes: `POST /v1/completions`, `POST /v1/chat/completions` (streamed as server-sent events
with `stream=true`), `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text). Every
refusal is an HTTP status with OpenAI's JSON error body naming the field; none stops the engine.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, PlainTextResponse
from sse_starlette.sse import EventSourceResponse

from meltemi.models.engine import QueueFullError, Request, RequestError
from meltemi.models.serve import _protocol as P
from meltemi.models.serve._runner import EngineRunner, Handle

# Seconds a 429 asks the client to wait before retrying.
RETRY_AFTER_S = 1
# How often a non-streamed request checks whether its client is still there.
_DISCONNECT_POLL_S = 0.5


class _Sample:
    """One sample's output: tokens, text (cut at a stop string), what was sent so far."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.tokens: list[tuple[int, float, tuple | None]] = []
        self.text = ""
        self.sent = 0
        self.finish: str | None = None


class _Generation:
    """Turns one request's engine events into text per sample (stop strings applied)."""

    def __init__(self, tokenizer: Any, params: P.Params, handle: Handle, runner: EngineRunner):
        self.tokenizer = tokenizer
        self.params = params
        self.handle = handle
        self.runner = runner
        self.samples = [_Sample() for _ in range(params.n)]
        self.cached = 0  # prompt tokens the engine read from its prefix cache
        self.hold = max((len(s) for s in params.stop), default=1) - 1

    @property
    def done(self) -> bool:
        return all(s.finish is not None for s in self.samples)

    def accept(self, event: Any) -> tuple[int, str, tuple | None] | None:
        """Applies one event; returns `(sample, new text, token record)` to send, or None when
        the sample had already ended (a stop string matched before the engine knew)."""
        s = self.samples[event.sample]
        self.cached = event.cached_tokens
        if s.finish is not None:
            return None
        s.ids.append(event.token)
        record = (event.token, event.logprob, event.top_logprobs)
        s.tokens.append(record)
        text = self.tokenizer.decode(s.ids)
        cut = _first_stop(text, self.params.stop, max(s.sent - self.hold, 0))
        if cut is not None:
            text, s.finish = text[:cut], "stop"
            if event.finish_reason is None:
                self.runner.cancel(self.handle, sample=event.sample)
        elif event.finish_reason is not None:
            s.finish = event.finish_reason
        s.text = text
        if s.finish is not None:
            end = len(text)
        else:  # hold back what could start a stop string, and a split UTF-8 character
            end = len(text) - self.hold if self.params.stop else len(text)
            while end > s.sent and text[end - 1] == "\ufffd":
                end -= 1
        new = text[s.sent : end] if end > s.sent else ""
        s.sent = max(s.sent, end)
        return event.sample, new, record

    def usage(self, prompt_len: int) -> dict:
        completion = sum(len(s.ids) for s in self.samples)
        return {
            "prompt_tokens": prompt_len,
            "completion_tokens": completion,
            "total_tokens": prompt_len + completion,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        }


def _batch_usage(gens: list[_Generation], prompts: list[list[int]]) -> dict:
    """The usage of a batch of prompts: each count summed over them."""
    parts = [g.usage(len(p)) for g, p in zip(gens, prompts, strict=True)]
    total = {k: sum(u[k] for u in parts) for k in ("prompt_tokens", "completion_tokens")}
    total["total_tokens"] = total["prompt_tokens"] + total["completion_tokens"]
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in parts)
    return {**total, "prompt_tokens_details": {"cached_tokens": cached}}


def _first_stop(text: str, stops: tuple[str, ...], start: int) -> int | None:
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(hits) if hits else None


def create_app(
    runner: EngineRunner,
    tokenizer: Any,
    *,
    model_name: str,
    template: Any | None = None,
    api_key: str | None = None,
    completion_max_tokens: int = 16,
) -> FastAPI:
    """The FastAPI application serving `runner`'s engine under the name `model_name`.

    Args:
        runner: the engine thread (started by the caller; `stop()` it after serving).
        tokenizer: a `meltemi.data` tokenizer (`encode_with_offsets`, `decode`).
        model_name: the only name `model` may take (`GET /v1/models` lists it).
        template: a `meltemi.data.chat.ChatTemplate` for `/v1/chat/completions` (`None`: that
            route answers 400 saying how to give one).
        api_key: when set, every route but `/health` needs `Authorization: Bearer <api_key>`.
        completion_max_tokens: `/v1/completions`' `max_tokens` default (OpenAI's is 16); chat
            defaults to what is left of the context.
    """
    engine = runner.engine
    max_seq_len = engine.max_seq_len
    vocab_size = engine.model_config.vocab_size
    max_logprobs = engine.config.max_logprobs
    created = int(time.time())
    app = FastAPI(title="meltemi.models.serve", docs_url=None, redoc_url=None)

    def error_response(e: P.ApiError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(P.ApiError)
    async def _api_error(request: HttpRequest, e: P.ApiError) -> JSONResponse:
        return error_response(e)

    @app.exception_handler(Exception)
    async def _internal(request: HttpRequest, e: Exception) -> JSONResponse:
        return error_response(
            P.ApiError(500, f"internal error: {type(e).__name__}", type="server_error")
        )

    if api_key:
        expected = f"Bearer {api_key}".encode()

        @app.middleware("http")
        async def _auth(request: HttpRequest, call_next: Callable) -> Any:
            if request.url.path != "/health":
                given = request.headers.get("authorization", "").encode()
                if not hmac.compare_digest(given, expected):
                    return error_response(
                        P.ApiError(
                            401,
                            "missing or wrong API key: send the header 'Authorization: Bearer "
                            "<key>' with the server's --api_key",
                            param="authorization",
                            code="invalid_api_key",
                        )
                    )
            return await call_next(request)

    async def read_json(request: HttpRequest) -> Any:
        raw = await request.body()
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise P.ApiError(
                400, f"body: not valid JSON ({e}). Fix: send one JSON object", param="body"
            ) from e

    def check_model(params: P.Params) -> None:
        if params.model != model_name:
            raise P.ApiError(
                404,
                f"model: {params.model!r} is not served here; this server serves "
                f"{model_name!r} (GET /v1/models)",
                param="model",
                code="model_not_found",
            )

    async def submit(params: P.Params, prompt: list[int], max_tokens: int, field: str) -> Handle:
        request = Request(
            prompt_ids=prompt,
            max_tokens=max_tokens,
            sampling=params.sampling,
            n=params.n,
            logprobs=params.logprobs,
            seed=params.seed,
            stop_ids=() if params.ignore_eos else None,
        )
        handle = runner.submit(request)
        try:
            await handle.submitted
        except QueueFullError as e:
            raise P.ApiError(
                429,
                f"the server's queue is full ({e}). Retry after {RETRY_AFTER_S} s",
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            ) from e
        except RequestError as e:
            raise P.ApiError(400, str(e), param=_engine_field(str(e), field)) from e
        except asyncio.CancelledError:
            runner.cancel(handle)
            raise
        return handle

    async def events(gen: _Generation, request: HttpRequest, poll: bool) -> AsyncIterator:
        """The request's events one by one until every sample ended; cancels the request in
        the engine when the consumer stops early (client gone)."""
        getter: asyncio.Future | None = None
        checked = -math.inf
        try:
            while not gen.done:
                # A non-streamed request checks now and then that its client is still there.
                if poll and time.monotonic() - checked >= _DISCONNECT_POLL_S:
                    if await request.is_disconnected():
                        return
                    checked = time.monotonic()
                if getter is None:
                    getter = asyncio.ensure_future(gen.handle.events.get())
                if poll:
                    ready, _ = await asyncio.wait({getter}, timeout=_DISCONNECT_POLL_S)
                    if not ready:
                        continue
                batch = await getter
                getter = None
                if batch is None:
                    raise P.ApiError(503, "the engine stopped", type="server_error")
                for event in batch:
                    out = gen.accept(event)
                    if out is not None:
                        yield out
        finally:
            if getter is not None:
                getter.cancel()
            if not gen.done:
                runner.cancel(gen.handle)

    async def run(params: P.Params, prompt: list[int], default: int | None, field: str, request):
        check_model(params)
        max_tokens = P.token_budget(params, len(prompt), max_seq_len, default)
        P.check_budget(len(prompt), max_tokens, max_seq_len=max_seq_len, prompt_field=field)
        handle = await submit(params, prompt, max_tokens, field)
        return _Generation(tokenizer, params, handle, runner)

    # -- routes -----------------------------------------------------------------------------------
    @app.get("/health")
    async def health() -> Any:
        if not runner.alive:
            reason = repr(runner.error) if runner.error else "engine thread not running"
            return JSONResponse({"status": "error", "reason": reason}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> Any:
        return PlainTextResponse(_prometheus(runner))

    @app.get("/v1/models")
    async def models() -> Any:
        card = {"id": model_name, "object": "model", "created": created, "owned_by": "meltemi"}
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(request: HttpRequest) -> Any:
        body = await read_json(request)
        params = P.parse_common(
            body, chat=False, max_seqs=engine.config.max_seqs, max_logprobs=max_logprobs
        )
        prompts = []
        for i, prompt in enumerate(P.parse_prompts(body, vocab_size)):
            if isinstance(prompt, str):
                prompt = [int(t) for t in tokenizer.encode_with_offsets(prompt)[0]]
                if not prompt:
                    where = "prompt" if len(prompts) == i == 0 else f"prompt[{i}]"
                    raise P.bad("prompt", f"{where} encodes to no tokens")
            prompts.append(prompt)
        if params.stream and len(prompts) > 1:
            raise P.bad(
                "stream",
                f"stream=true takes one prompt, not a batch of {len(prompts)}. Fix: send the "
                "batch unstreamed, or one streamed request per prompt",
            )
        gens: list[_Generation] = []
        try:
            for prompt in prompts:
                gens.append(await run(params, prompt, completion_max_tokens, "prompt", request))
        except BaseException:
            for gen in gens:  # a batch runs whole or not at all
                runner.cancel(gen.handle)
            raise
        rid = f"cmpl-{uuid.uuid4().hex}"
        head = {"id": rid, "object": "text_completion", "created": int(time.time()),
                "model": model_name}  # fmt: skip
        if params.stream:
            return EventSourceResponse(
                _stream(
                    gens[0],
                    events(gens[0], request, False),
                    head,
                    len(prompts[0]),
                    chat=False,
                    tok=tokenizer,
                )
            )

        async def drain(gen: _Generation) -> None:
            async for _ in events(gen, request, True):
                pass

        await asyncio.gather(*(drain(g) for g in gens))
        choices = [
            {
                "index": p * params.n + i,
                "text": s.text,
                "logprobs": _completion_logprobs(tokenizer, s.tokens, params.logprobs),
                "finish_reason": s.finish,
            }
            for p, gen in enumerate(gens)
            for i, s in enumerate(gen.samples)
        ]
        return {**head, "choices": choices, "usage": _batch_usage(gens, prompts)}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: HttpRequest) -> Any:
        body = await read_json(request)
        params = P.parse_common(
            body, chat=True, max_seqs=engine.config.max_seqs, max_logprobs=max_logprobs
        )
        messages = P.parse_messages(body)
        if template is None:
            raise P.bad(
                "messages",
                "the checkpoint has no chat template; restart the server with "
                "--chat_template=FILE (a Jinja chat template), or use /v1/completions",
            )
        prompt = _render(template, tokenizer, messages)
        gen = await run(params, prompt, None, "messages", request)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        head = {"id": rid, "object": "chat.completion", "created": int(time.time()),
                "model": model_name}  # fmt: skip
        if params.stream:
            head = {**head, "object": "chat.completion.chunk"}
            return EventSourceResponse(
                _stream(
                    gen, events(gen, request, False), head, len(prompt), chat=True, tok=tokenizer
                )
            )
        async for _ in events(gen, request, True):
            pass
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": s.text},
                "logprobs": _chat_logprobs(tokenizer, s.tokens, params.logprobs),
                "finish_reason": s.finish,
            }
            for i, s in enumerate(gen.samples)
        ]
        return {**head, "choices": choices, "usage": gen.usage(len(prompt))}

    return app


async def _stream(
    gen: _Generation, source: AsyncIterator, head: dict, prompt_len: int, *, chat: bool, tok: Any
) -> AsyncIterator[str]:
    """Server-sent events: one chunk per generated token, then `[DONE]`."""
    k = gen.params.logprobs
    if chat:
        for i in range(gen.params.n):
            choice = {"index": i, "delta": {"role": "assistant", "content": ""},
                      "logprobs": None, "finish_reason": None}  # fmt: skip
            yield json.dumps({**head, "choices": [choice]})
    try:
        async for sample, text, record in source:
            finish = gen.samples[sample].finish
            if chat:
                lp = _chat_logprobs(tok, [record], k)
                choice = {"index": sample, "delta": {"content": text} if text else {},
                          "logprobs": lp, "finish_reason": finish}  # fmt: skip
            else:
                lp = _completion_logprobs(tok, [record], k)
                choice = {"index": sample, "text": text, "logprobs": lp, "finish_reason": finish}
            yield json.dumps({**head, "choices": [choice]})
        if gen.params.include_usage:
            yield json.dumps({**head, "choices": [], "usage": gen.usage(prompt_len)})
        yield "[DONE]"
    finally:
        await source.aclose()  # cancels the engine request if the client left mid-stream


def _render(template: Any, tokenizer: Any, messages: list[dict]) -> list[int]:
    from meltemi.models import chat

    try:
        return chat.prompt_ids(template, tokenizer, messages)
    except Exception as e:  # ChatRowError, a template's raise_exception(...), a Jinja error
        raise P.bad("messages", f"the chat template cannot render them: {e}") from e


def _engine_field(message: str, prompt_field: str) -> str:
    """The OpenAI field an engine `RequestError` is about."""
    fields = {"prompt_ids": prompt_field, "max_tokens": "max_tokens", "n": "n",
              "logprobs": "logprobs", "seed": "seed"}  # fmt: skip
    for name, param in fields.items():
        if message.startswith(f"Request.{name}"):
            return param
    return "max_tokens"  # "Request needs N KV pages": the budget (or n) is too large


def _token_text(tokenizer: Any, token: int) -> str:
    return tokenizer.decode([token])


def _completion_logprobs(tokenizer: Any, records: list, k: int | None) -> dict | None:
    if k is None:
        return None
    tokens, lps, tops, offsets = [], [], [], []
    offset = 0
    for token, lp, top in records:
        text = _token_text(tokenizer, token)
        tokens.append(text)
        lps.append(lp)
        offsets.append(offset)
        offset += len(text)
        alternatives: dict[str, float] = {}
        for t, v in top or ():  # most likely first; tokens that print alike keep the best
            alternatives.setdefault(_token_text(tokenizer, t), v)
        tops.append(alternatives if top else None)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def _chat_logprobs(tokenizer: Any, records: list, k: int | None) -> dict | None:
    if k is None:
        return None

    def entry(token: int, lp: float) -> dict:
        text = _token_text(tokenizer, token)
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}

    content = [
        {**entry(token, lp), "top_logprobs": [entry(t, v) for t, v in (top or ())]}
        for token, lp, top in records
    ]
    return {"content": content, "refusal": None}


def _prometheus(runner: EngineRunner) -> str:
    s = runner.stats
    rows = [
        ("meltemi_requests_total", "counter", "requests admitted to the engine queue", s.requests),
        ("meltemi_requests_refused_total", "counter", "requests the engine refused", s.refused),
        ("meltemi_requests_cancelled_total", "counter", "requests cancelled (client gone)",
         s.cancelled),
        ("meltemi_prompt_tokens_total", "counter", "prompt tokens submitted", s.prompt_tokens),
        ("meltemi_prompt_cached_tokens_total", "counter",
         "prompt tokens read from the prefix cache", s.cached_tokens),
        ("meltemi_generated_tokens_total", "counter", "tokens generated", s.generated_tokens),
        ("meltemi_engine_steps_total", "counter", "engine steps", s.steps),
        ("meltemi_compiles_total", "counter", "XLA compilations in this process", s.compiles),
        ("meltemi_queue_depth", "gauge", "requests waiting for admission", s.queue_depth),
        ("meltemi_running_sequences", "gauge", "decoding slots in use", s.running),
        ("meltemi_kv_pages_in_use", "gauge", "KV cache pages held", s.pages_in_use),
        ("meltemi_kv_pages_capacity", "gauge", "KV cache pages in the pool", s.pages_capacity),
    ]  # fmt: skip
    lines = []
    for name, kind, help_, value in rows:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {value}"]
    return "\n".join(lines) + "\n"
