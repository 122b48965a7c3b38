"""The OpenAI request bodies the server accepts, validated into `Params`, and its errors.

Every refusal is an `ApiError`: an HTTP status and OpenAI's error body
`{"error": {"message", "type", "param", "code"}}`, `param` naming the offending field.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from meltemi.models._sampling import SamplingConfig

MAX_STOP_STRINGS = 4
SEED_BOUND = 2**32

# Fields of OpenAI's API this server does not implement; refused unless at their default.
_UNSUPPORTED: dict[str, Any] = {
    "echo": False,
    "suffix": None,
    "best_of": None,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logit_bias": None,
    "tools": None,
    "functions": None,
    "response_format": None,
}


class ApiError(Exception):
    """A refused request: `status`, a message that says the fix, and the field (`param`).

    Args:
        status: HTTP status code.
        message: what is wrong, the value, and the fix.
        param: the request field at fault (`None` for the body as a whole).
        type: OpenAI's error type.
        code: OpenAI's error code (e.g. `"model_not_found"`).
        headers: extra response headers (e.g. `Retry-After`).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        type: str = "invalid_request_error",  # noqa: A002 - OpenAI's field name
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict:
        """OpenAI's JSON error body."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad(param: str, message: str) -> ApiError:
    """A 400 naming `param`."""
    return ApiError(400, f"{param}: {message}", param=param)


@dataclasses.dataclass(frozen=True)
class Params:
    """A validated generation request (both endpoints).

    Attributes:
        model: the model name asked for.
        max_tokens: the token budget, or `None` for the endpoint's default.
        sampling: greedy when `temperature == 0`.
        n: samples.
        stop: stop strings (the text ends before the first match).
        logprobs: top alternatives per token (`None`: no logprobs at all).
        seed: the request's seed, or `None`.
        stream: answer by server-sent events.
        include_usage: a last streamed chunk with the token counts.
        ignore_eos: generate past the eos ids (vLLM's extension; benchmarks use it so that
            every request produces exactly `max_tokens`).
    """

    model: str
    max_tokens: int | None
    sampling: SamplingConfig
    n: int
    stop: tuple[str, ...]
    logprobs: int | None
    seed: int | None
    stream: bool
    include_usage: bool
    ignore_eos: bool = False


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _optional_int(body: Mapping, name: str, *, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    bound = f"[{low}, {high}]" if high is not None else f">= {low}"
    if not _is_int(value) or value < low or (high is not None and value > high):
        raise bad(name, f"{value!r} is not an integer in {bound}. Fix: e.g. {name}={low}")
    return value


def _sampling(body: Mapping) -> SamplingConfig:
    temperature = body.get("temperature", 1.0)
    temperature = 1.0 if temperature is None else temperature
    if not _is_number(temperature) or temperature < 0:
        raise bad(
            "temperature",
            f"{temperature!r} must be a number >= 0 (0 is greedy). Fix: temperature=0.7",
        )
    top_p = body.get("top_p")
    if top_p is not None and (not _is_number(top_p) or not 0 < top_p <= 1):
        raise bad("top_p", f"{top_p!r} must be in (0, 1]. Fix: top_p=0.9, or leave it out")
    top_k = body.get("top_k")
    if top_k is not None and (not _is_int(top_k) or top_k < -1):
        raise bad("top_k", f"{top_k!r} must be an integer >= 1 (0 or -1: no top-k)")
    top_k = None if top_k in (None, 0, -1) else top_k
    return SamplingConfig(float(temperature), top_k, None if top_p is None else float(top_p))


def _stop(body: Mapping) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or not all(isinstance(s, str) and s for s in stops)
        or len(stops) > MAX_STOP_STRINGS
    ):
        raise bad(
            "stop",
            f"{stop!r} must be a non-empty string or a list of at most {MAX_STOP_STRINGS} "
            'non-empty strings. Fix: stop=["\\n\\n"]',
        )
    return tuple(stops)


def _unsupported(body: Mapping) -> None:
    for name, default in _UNSUPPORTED.items():
        value = body.get(name, default)
        if value not in (default, None) and value != {} and value != []:
            raise bad(name, f"{value!r} is not supported by this server; leave {name} out")


def parse_common(body: Any, *, chat: bool, max_seqs: int, max_logprobs: int) -> Params:
    """Validates the fields both endpoints share (raises `ApiError` naming the field)."""
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", f"{model!r}: give the model name (see GET /v1/models)")
    _unsupported(body)
    max_tokens = _optional_int(body, "max_tokens", low=1)
    if chat and body.get("max_completion_tokens") is not None:
        max_tokens = _optional_int(body, "max_completion_tokens", low=1)
    n = _optional_int(body, "n", low=1, high=max_seqs)
    if chat:
        wants = body.get("logprobs")
        if wants is not None and not isinstance(wants, bool):
            raise bad("logprobs", f"{wants!r} must be true or false (chat completions)")
        top = _optional_int(body, "top_logprobs", low=0, high=max_logprobs)
        if top is not None and not wants:
            raise bad("top_logprobs", "needs logprobs=true. Fix: add logprobs=true")
        logprobs = (top or 0) if wants else None
    else:
        logprobs = _optional_int(body, "logprobs", low=0, high=max_logprobs)
    seed = _optional_int(body, "seed", low=0, high=SEED_BOUND - 1)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("stream", f"{stream!r} must be true or false")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise bad("ignore_eos", f"{ignore_eos!r} must be true or false")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad("stream_options", f"{options!r} must be an object like {{'include_usage': true}}")
    return Params(
        model=model,
        max_tokens=max_tokens,
        sampling=_sampling(body),
        n=1 if n is None else n,
        stop=_stop(body),
        logprobs=logprobs,
        seed=seed,
        stream=stream,
        include_usage=bool(options.get("include_usage", False)),
        ignore_eos=ignore_eos,
    )


MAX_BATCH_PROMPTS = 64
"""Most prompts one `/v1/completions` request may carry (each is an engine request)."""


def parse_prompts(body: Mapping, vocab_size: int) -> list[str | list[int]]:
    """The completions prompts: a string, a list of token ids, or a batch (a list of strings
    or of token id lists; OpenAI's choices come back prompt by prompt)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        if len(prompt) > MAX_BATCH_PROMPTS:
            raise bad(
                "prompt",
                f"a batch of {len(prompt)} prompts; at most {MAX_BATCH_PROMPTS} per request. "
                "Fix: split it over several requests",
            )
        return [_one_prompt(p, vocab_size, f"prompt[{i}]") for i, p in enumerate(prompt)]
    return [_one_prompt(prompt, vocab_size, "prompt")]


def _one_prompt(prompt: Any, vocab_size: int, where: str) -> str | list[int]:
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        bad_ids = [t for t in prompt if not 0 <= t < vocab_size]
        if bad_ids:
            raise bad(
                "prompt",
                f"{where}: token id {bad_ids[0]} is outside the vocabulary [0, {vocab_size})",
            )
        return list(prompt)
    raise bad(
        "prompt",
        f"{where}: {_short(prompt)} must be a non-empty string or a non-empty list of token "
        "ids (or a list of those, a batch)",
    )


def parse_messages(body: Mapping) -> list[dict[str, str]]:
    """The chat conversation: `[{"role": ..., "content": str}]` (text content parts joined)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", f"{_short(messages)} must be a non-empty list of messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad(where, f"{_short(m)} must be an object with a string 'role'")
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise bad(f"{where}.content[{j}]", "only text parts are supported")
                parts.append(str(part.get("text", "")))
            content = "".join(parts)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise bad(f"{where}.content", f"{_short(content)} must be a string or text parts")
        out.append({**m, "content": content})
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_budget(prompt_len: int, max_tokens: int, *, max_seq_len: int, prompt_field: str) -> None:
    """Refuses a prompt that fills the context, or a budget past what is left of it."""
    if prompt_len >= max_seq_len:
        raise bad(
            prompt_field,
            f"{prompt_len} tokens leave no room in the context of {max_seq_len} tokens "
            f"(max_seq_len). Fix: a prompt of at most {max_seq_len - 1} tokens",
        )
    if prompt_len + max_tokens > max_seq_len:
        raise bad(
            "max_tokens",
            f"{max_tokens} + {prompt_len} prompt tokens = {prompt_len + max_tokens} exceeds the "
            f"context of {max_seq_len} tokens. Fix: max_tokens<={max_seq_len - prompt_len}",
        )


def token_budget(params: Params, prompt_len: int, max_seq_len: int, default: int | None) -> int:
    """`max_tokens`, or the endpoint's default (`None`: what is left of the context)."""
    if params.max_tokens is not None:
        return params.max_tokens
    left = max(max_seq_len - prompt_len, 1)
    return left if default is None else min(default, left)
