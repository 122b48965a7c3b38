"""The engine's user-facing records: its memory plan, a request, an event, its errors."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal, NamedTuple

from meltemi.models._config import ConfigError
from meltemi.models._sampling import SamplingConfig

FinishReason = Literal["stop", "length"]


class EngineError(ConfigError):
    """An `EngineConfig` field or an engine call is invalid (names the field and the fix)."""


class RequestError(EngineError):
    """A request is refused at `submit` (it could never run: too long, too large, bad values)."""


class QueueFullError(EngineError):
    """`submit` past `EngineConfig.max_waiting` queued requests; retry later (HTTP 429)."""


for _cls in (EngineError, RequestError, QueueFullError):
    _cls.__module__ = "meltemi.models.engine"


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """The engine's memory plan and fixed shapes, decided once at construction.

    The KV pool holds `kv_bytes // page_bytes` pages, `page_bytes = 2 (k, v) * layers *
    page_size * kv_heads * head_size * dtype size`; page 0 is reserved (padding tokens write
    there), the rest are handed out. Two programs serve everything: a decoding step of up to
    `max_seqs` rows, and the same with a prompt chunk beside them, whose length the step's
    token budget sets (`max_step_tokens`).

    Attributes:
        kv_bytes: byte budget of the KV pool (all layers, keys and values).
        page_size: tokens per page.
        max_seqs: decoding slots (the decode batch); a request with `n` samples takes `n`.
        max_seq_len: prompt + generated tokens bound per sequence (default: the model's).
        prefill_chunk: most prompt tokens prefilled per step (longer prompts take several
            steps, interleaved with the decoding steps of the running sequences).
        max_prefills: most prompts one step's chunk holds: the chunk is filled with the
            admitted prompts in arrival order (the rest of the first, then the next, ...), so
            a burst of short prompts is prefilled in one weight read rather than one per step.
        max_step_tokens: token budget of one step (vLLM's `max_num_batched_tokens` with
            chunked prefill): the decoding rows, padded to their batch bucket `b`, come first,
            and a step's prompt chunk takes what is left, `min(prefill_chunk,
            max_step_tokens - b)` tokens. So no step costs more than `max_step_tokens` rows
            through the model, and the mixed program stays one per batch bucket. At least
            `max_seqs + 1` (every step moves a prefill by at least one token); `None`:
            `max_seqs + prefill_chunk` (a full chunk at every batch size).
        max_logprobs: most top alternatives a request may ask for (`Request.logprobs`).
        cache_dtype: `"float32"` or `"bfloat16"` (default: the model's embedding dtype).
        attention_backend: `"auto"` (per platform: `"pallas_gpu"` on one GPU, `"pallas_tpu"`
            on one TPU, `"native"` on one CPU device, else `"reference"`), `"reference"`
            (plain JAX gather through the page table; every platform), `"native"` (the CPU
            kernel, float32), `"pallas_gpu"` (JAX's Pallas GPU paged attention for decoding
            rows) or `"pallas_tpu"` (JAX's Pallas TPU paged attention for decoding rows of
            bfloat16 pools, `cache_dtype="bfloat16"`).
        max_waiting: bound on queued (not yet admitted) requests; `None`: unbounded.
        decode_steps: decoding steps per call while no prompt is being prefilled (one
            host round trip per `decode_steps` tokens; `step()` then returns up to that many
            events per sample, the same tokens as with 1).
        seed: draws the seed of requests submitted without one.
        prefix_cache: keep the full KV pages of finished prompts and samples, found by their
            tokens, until their space is needed: a request whose prompt starts with pages
            already computed (a shared system prompt, a conversation's earlier turns, the
            choices of one question) prefills only the rest. Off by default: a cached page
            was computed in another step's shapes, so logits may differ in the last bits from
            an uncached run's, and a request's output then depends on what ran before it.

    >>> EngineConfig(kv_bytes=1 << 20, page_size=8).max_seqs
    8
    >>> budgeted = EngineConfig(kv_bytes=1 << 20, prefill_chunk=16, max_step_tokens=12)
    >>> [budgeted.chunk(rows) for rows in (1, 2, 4, 8)]  # rows: the decoding batch bucket
    [11, 10, 8, 4]
    """

    kv_bytes: int
    page_size: int = 16
    max_seqs: int = 8
    max_seq_len: int | None = None
    prefill_chunk: int = 64
    max_prefills: int = 4
    max_step_tokens: int | None = None
    max_logprobs: int = 5
    cache_dtype: str | None = None
    attention_backend: str = "auto"
    max_waiting: int | None = None
    decode_steps: int = 1
    seed: int = 0
    prefix_cache: bool = False

    def __post_init__(self) -> None:
        for name in (
            "kv_bytes", "page_size", "max_seqs", "prefill_chunk", "max_prefills", "decode_steps"
        ):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise EngineError(f"EngineConfig.{name}={value!r}: must be an int >= 1")
        budget = self.max_step_tokens
        if budget is not None and (not isinstance(budget, int) or budget <= self.max_seqs):
            raise EngineError(
                f"EngineConfig.max_step_tokens={budget!r}: must be an int >= max_seqs + 1 = "
                f"{self.max_seqs + 1} (the decoding rows, up to max_seqs={self.max_seqs}, plus "
                f"at least one prompt token, so a prefill always moves). Fix: "
                f"max_step_tokens>={self.max_seqs + 1}, or None for max_seqs + prefill_chunk"
            )
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise EngineError(
                f"EngineConfig.max_seq_len={self.max_seq_len!r}: must be >= 2 (or None for "
                "the model's max_seq_len)"
            )
        if self.max_logprobs < 0:
            raise EngineError(f"EngineConfig.max_logprobs={self.max_logprobs!r}: must be >= 0")
        if self.cache_dtype not in (None, "float32", "bfloat16"):
            raise EngineError(
                f"EngineConfig.cache_dtype={self.cache_dtype!r}: must be None, 'float32' or "
                "'bfloat16'"
            )
        if not isinstance(self.prefix_cache, bool):
            raise EngineError(f"EngineConfig.prefix_cache={self.prefix_cache!r}: must be a bool")
        if self.max_waiting is not None and self.max_waiting < 0:
            raise EngineError(f"EngineConfig.max_waiting={self.max_waiting!r}: must be >= 0")

    def chunk(self, rows: int) -> int:
        """Prompt tokens a step with `rows` decoding rows (a batch bucket) prefills at most."""
        if self.max_step_tokens is None:
            return self.prefill_chunk
        return max(1, min(self.prefill_chunk, self.max_step_tokens - rows))


@dataclasses.dataclass(frozen=True)
class Request:
    """One prompt to continue, `n` times.

    Attributes:
        prompt_ids: token ids (at least one).
        max_tokens: most new tokens per sample.
        sampling: greedy (default) or temperature / top-k / top-p.
        stop_ids: a sample ends after emitting one of these (included in its output);
            `None`: the model config's `eos_token_id`; `()`: only `max_tokens` ends it.
            Stop *strings* are the caller's (detokenize, then `Engine.cancel(id, sample)`).
        n: samples of this prompt; they share the prompt's full KV pages.
        logprobs: number of top alternatives reported with each token (`None`: none; the
            chosen token's log-probability is always reported).
        seed: sample `i`'s token `t` is drawn with `fold_in(fold_in(key(seed), i), t)`, so a
            seeded request reproduces whatever it is batched with (`None`: the engine draws
            one).
    """

    prompt_ids: Sequence[int]
    max_tokens: int
    sampling: SamplingConfig = SamplingConfig()
    stop_ids: Sequence[int] | None = None
    n: int = 1
    logprobs: int | None = None
    seed: int | None = None


class Event(NamedTuple):
    """One new token of one sample (what `Engine.step` returns, in order).

    Attributes:
        request_id: `Engine.submit`'s id.
        sample: sample index in `0 .. n-1`.
        token: the token id.
        logprob: its log-probability under the model (raw logits, before temperature and
            filtering).
        top_logprobs: `((token, logprob), ...)`, the request's `logprobs` most likely
            tokens at this step, or `None` when it asked for none.
        finish_reason: `None` (more to come), `"stop"` (a stop id) or `"length"`
            (`max_tokens` reached).
        cached_tokens: prompt tokens of this request read from the prefix cache rather than
            prefilled (`EngineConfig.prefix_cache`; 0 without it).
    """

    request_id: int
    sample: int
    token: int
    logprob: float
    top_logprobs: tuple[tuple[int, float], ...] | None
    finish_reason: FinishReason | None
    cached_tokens: int = 0
