"""`Engine`: continuous batching over a paged KV cache.

Each `step()` (1) admits queued requests, first come first served, while slots and pages
last; (2) runs one decoding step over every sample that is generating (packed into a batch
padded to a power of two, attending over the pages in use, padded to a power of two: one
compiled program per batch bucket x page bucket, all compiled by `warmup`), and in the same
compiled call (3) prefills one chunk of prompt tokens (a "mixed" step: the decoding rows and
the chunk's tokens share every weight read). The chunk is filled with the admitted prompts in
order, the rest of the oldest first, up to `max_prefills` prompts: a burst of short prompts is
prefilled in one pass, and a long prompt takes several steps, so it never stalls the running
sequences for more than one chunk. The chunk takes
what the step's token budget leaves after the decoding rows (`EngineConfig.max_step_tokens`,
Sarathi-Serve's stall-free batching): one chunk length per batch bucket, so the mixed step
stays one program per batch bucket x page bucket, and a step costs at most the budget.
When a prompt's last chunk is in, its `n` samples draw their first tokens in that step and
start decoding at the next.

Pages are planned at admission: a request holds, for sample 0, the pages of its prompt plus
`max_tokens - 1` positions, and for each further sample the same minus the prompt's full
pages, which it shares (the prompt is prefilled once; the partial last page is copied). So a
running sequence never waits for memory, and a request that could never fit is refused at
`submit`. Pages go back to the free list when a sample ends or is cancelled.

With `EngineConfig.prefix_cache`, the full pages of a prompt are registered under their tokens
(`_pages.page_keys`: each key digests its page's tokens and the key before it) as its chunks
go in, and those of a sample's generated tokens when it ends. A request admitted later
takes the cached pages of its prompt's longest registered prefix (all but the page of its last
token, which is always prefilled) and prefills from there; one that starts like a prompt
still being prefilled waits until those pages are written. Released cached pages stay findable
until `alloc` needs their space (least recently released first); new weights forget them all.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from meltemi.models._transformer import Transformer
from meltemi.models.engine import _forward as F
from meltemi.models.engine._config import (
    EngineConfig,
    EngineError,
    Event,
    QueueFullError,
    Request,
    RequestError,
)
from meltemi.models.engine._paged_attention import resolve_paged_backend
from meltemi.models.engine._pages import NULL_PAGE, PageAllocator, page_keys

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
_prepare = eqx.filter_jit(F.prepare)


@dataclasses.dataclass
class _Sample:
    """One sample of a request in a slot."""

    pages: list[int]
    generated: list[int] = dataclasses.field(default_factory=list)
    done: bool = False
    cancelled: bool = False


@dataclasses.dataclass(eq=False)  # identity: queues look requests up with `in`
class _Live:
    """An admitted or queued request."""

    rid: int
    request: Request
    prompt: np.ndarray
    stop: frozenset[int]
    seed: int
    pages_needed: int
    keys: list[bytes]  # the prompt's full pages' `page_keys` (with `prefix_cache`)
    slots: list[int] = dataclasses.field(default_factory=list)
    samples: list[_Sample] = dataclasses.field(default_factory=list)
    prefilled: int = 0
    cached: int = 0  # prompt tokens read from the prefix cache
    weights: int = 0  # `Engine._weights` at admission


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def buckets(limit: int) -> tuple[int, ...]:
    """The sizes a dimension of at most `limit` is padded to: powers of two below `limit`,
    then `limit` (`buckets(12) == (1, 2, 4, 8, 12)`)."""
    out = [1 << i for i in range(limit.bit_length()) if 1 << i < limit]
    return (*out, limit)


def _bucket(n: int, limit: int) -> int:
    """The smallest of `buckets(limit)` that holds `n`."""
    return min(limit, 1 << max(n - 1, 0).bit_length())


class Engine:
    """Continuous-batching inference over a paged KV cache (see the module docstring).

    >>> import jax, numpy as np
    >>> import meltemi.models as mm
    >>> from meltemi.models.engine import Engine, EngineConfig, Request
    >>> cfg = mm.get_preset("tiny-llama").replace(max_seq_len=64)
    >>> shapes = jax.eval_shape(lambda k: mm.init(cfg, key=k), jax.random.key(0))
    >>> rng = np.random.default_rng(0)
    >>> model = jax.tree.map(lambda s: rng.normal(0, 0.2, s.shape).astype(s.dtype), shapes)
    >>> engine = Engine(model, EngineConfig(kv_bytes=1 << 20, page_size=8, max_seqs=2))
    >>> rid = engine.submit(Request([5, 6, 7], max_tokens=3, stop_ids=()))
    >>> [len(s) for s in engine.run_until_done()[rid]]
    [3]
    """

    def __init__(self, model: Transformer, config: EngineConfig):
        mc = model.config
        max_len = config.max_seq_len if config.max_seq_len is not None else mc.max_seq_len
        if max_len > mc.max_seq_len:
            raise EngineError(
                f"EngineConfig.max_seq_len={max_len} exceeds the model's max_seq_len="
                f"{mc.max_seq_len}. Fix: max_seq_len<={mc.max_seq_len} (or None)"
            )
        resolve_paged_backend(config.attention_backend)  # fails early on an unknown name
        self.config = config
        self.model_config = mc
        self.max_seq_len = max_len
        dtype = _DTYPES[config.cache_dtype] if config.cache_dtype else None
        self.dtype = jnp.dtype(dtype or model.embed.weight.dtype)
        self.page_bytes = (
            2 * mc.num_layers * config.page_size * mc.num_kv_heads * mc.head_size
        ) * self.dtype.itemsize
        self.num_pages = config.kv_bytes // self.page_bytes
        self.pages_per_seq = _ceil_div(max_len, config.page_size)
        if self.num_pages < self.pages_per_seq + 1:
            need = (self.pages_per_seq + 1) * self.page_bytes
            raise EngineError(
                f"EngineConfig.kv_bytes={config.kv_bytes}: holds {self.num_pages} pages of "
                f"{self.page_bytes} bytes, fewer than one sequence of max_seq_len={max_len} "
                f"needs ({self.pages_per_seq}, plus one reserved). Fix: kv_bytes>={need} or a "
                "smaller max_seq_len"
            )
        self._leaves_now, treedef = jax.tree.flatten(_prepare(model))
        self._programs = F.programs(
            treedef, config.attention_backend, config.max_logprobs, config.decode_steps
        )
        self._pools = F.init_pools(model, self.num_pages, config.page_size, self.dtype)
        devices = self._leaves_now[0].devices()
        if len(devices) == 1:
            # Committed to the model's device, as every program's output pools are: the first
            # call (in `warmup`) then compiles what serving runs. Left uncommitted, the first
            # program warmed up was compiled a second time when serving first ran it.
            self._pools = jax.device_put(self._pools, next(iter(devices)))
        self.pages = PageAllocator(self.num_pages)
        self._table = np.full((config.max_seqs, self.pages_per_seq), NULL_PAGE, np.int32)
        # A chunk holds at most one token per prompt and one prompt per admitted request.
        self._max_prefills = min(config.max_prefills, config.max_seqs, config.prefill_chunk)
        self._slots: list[tuple[_Live, int] | None] = [None] * config.max_seqs
        self._waiting: collections.deque[_Live] = collections.deque()
        self._prefilling: collections.deque[_Live] = collections.deque()
        self._live: dict[int, _Live] = {}
        self._next_id = 0
        self._rng = np.random.default_rng(config.seed)
        self._weights = 0  # bumped by `update_weights`
        self.num_cached_tokens = 0
        """Prompt tokens read from the prefix cache so far (`EngineConfig.prefix_cache`)."""
        self._leaves = _leaf_specs(model)

    # -- requests ------------------------------------------------------------------------------
    def submit(self, request: Request) -> int:
        """Queues `request`; returns its id. Raises `RequestError` (naming the field) for a
        request that could never run, `QueueFullError` past `max_waiting` queued requests."""
        live = self._validate(request)
        cap = self.config.max_waiting
        if cap is not None and len(self._waiting) >= cap:
            raise QueueFullError(
                f"EngineConfig.max_waiting={cap}: {len(self._waiting)} requests already wait. "
                "Fix: retry later, or raise max_waiting"
            )
        self._waiting.append(live)
        self._live[live.rid] = live
        return live.rid

    def _validate(self, r: Request) -> _Live:
        cfg, mc = self.config, self.model_config
        prompt = np.asarray(r.prompt_ids, np.int64).reshape(-1)
        if prompt.size == 0:
            raise RequestError("Request.prompt_ids is empty: give at least one token")
        if prompt.min() < 0 or prompt.max() >= mc.vocab_size:
            bad = int(prompt[(prompt < 0) | (prompt >= mc.vocab_size)][0])
            raise RequestError(
                f"Request.prompt_ids holds {bad}, outside the vocabulary [0, {mc.vocab_size})"
            )
        if not isinstance(r.max_tokens, int) or r.max_tokens < 1:
            raise RequestError(f"Request.max_tokens={r.max_tokens!r}: must be an int >= 1")
        if prompt.size + r.max_tokens > self.max_seq_len:
            raise RequestError(
                f"Request.max_tokens={r.max_tokens} + {prompt.size} prompt tokens = "
                f"{prompt.size + r.max_tokens} exceeds max_seq_len={self.max_seq_len}. Fix: "
                f"max_tokens<={self.max_seq_len - prompt.size} or a shorter prompt"
            )
        if not isinstance(r.n, int) or not 1 <= r.n <= cfg.max_seqs:
            raise RequestError(
                f"Request.n={r.n!r}: must be in [1, max_seqs={cfg.max_seqs}] (each sample "
                "takes a decoding slot). Fix: a smaller n, or raise EngineConfig.max_seqs"
            )
        if r.logprobs is not None and not 0 <= r.logprobs <= cfg.max_logprobs:
            raise RequestError(
                f"Request.logprobs={r.logprobs!r}: must be in [0, max_logprobs="
                f"{cfg.max_logprobs}]. Fix: logprobs<={cfg.max_logprobs} or raise "
                "EngineConfig.max_logprobs"
            )
        if r.seed is not None and not 0 <= r.seed < 2**32:
            raise RequestError(f"Request.seed={r.seed!r}: must be in [0, 2**32)")
        needed = self._pages_needed(prompt.size, r.max_tokens, r.n)
        if needed > self.pages.capacity:
            raise RequestError(
                f"Request needs {needed} KV pages (n={r.n}, {prompt.size} prompt tokens, "
                f"max_tokens={r.max_tokens}) but the pool holds {self.pages.capacity} "
                f"(EngineConfig.kv_bytes={cfg.kv_bytes}). Fix: raise kv_bytes, or lower n or "
                "max_tokens"
            )
        stop = r.stop_ids if r.stop_ids is not None else mc.eos_token_id
        stop = () if stop is None else (stop,) if isinstance(stop, int) else tuple(stop)
        seed = int(self._rng.integers(2**32)) if r.seed is None else int(r.seed)
        rid = self._next_id
        self._next_id += 1
        prompt = prompt.astype(np.int32)
        keys = page_keys(prompt, cfg.page_size) if cfg.prefix_cache else []
        return _Live(rid, r, prompt, frozenset(stop), seed, needed, keys)

    def _pages_needed(self, prompt_len: int, max_tokens: int, n: int) -> int:
        ps = self.config.page_size
        per_sample = _ceil_div(prompt_len + max_tokens - 1, ps)
        return per_sample + (n - 1) * (per_sample - prompt_len // ps)

    def cancel(self, request_id: int, sample: int | None = None) -> bool:
        """Ends a request (or one sample of it) now and frees its pages; no event follows.
        Returns whether anything was running or queued under that id."""
        live = self._live.get(request_id)
        if live is None:
            return False
        if live in self._waiting:
            self._waiting.remove(live)
            del self._live[request_id]
            return True
        targets = range(len(live.samples)) if sample is None else [sample]
        targets = [i for i in targets if 0 <= i < len(live.samples) and not live.samples[i].done]
        if live in self._prefilling:
            # Sample 0's pages hold the prompt being prefilled for every sample: a sample
            # cancelled now ends (without an event) when the prompt is in, unless all are.
            for i in targets:
                live.samples[i].cancelled = True
            if not all(s.cancelled for s in live.samples):
                return bool(targets)
            self._prefilling.remove(live)
            targets = range(len(live.samples))
        for i in targets:
            self._finish(live, i)
        return bool(targets)

    # -- scheduling ----------------------------------------------------------------------------
    def _admit(self) -> None:
        ps = self.config.page_size
        while self._waiting:
            live = self._waiting[0]
            n = live.request.n
            length = live.prompt.size
            # Cached pages up to the last prompt token's page, which is always prefilled (its
            # logits start the samples) into a page of its own.
            wanted = live.keys[: (length - 1) // ps]
            cached = self.pages.match(wanted)
            if self._in_flight(wanted) > len(cached):
                return  # a prompt being prefilled is writing more of it: wait a step or two
            free = [s for s, v in enumerate(self._slots) if v is None]
            available = self.pages.num_free - self.pages.num_unheld(cached)
            if len(free) < n or available < live.pages_needed - len(cached):
                return
            self._waiting.popleft()
            per_sample = _ceil_div(length + live.request.max_tokens - 1, ps)
            self.pages.claim(cached)
            first = cached + self.pages.alloc(per_sample - len(cached))
            live.prefilled = live.cached = len(cached) * ps
            live.weights = self._weights
            self.num_cached_tokens += live.cached
            shared = first[: length // ps]
            live.samples = [_Sample(first)]
            for _ in range(n - 1):
                self.pages.share(shared)
                live.samples.append(_Sample(shared + self.pages.alloc(per_sample - len(shared))))
            live.slots = free[:n]
            for slot, (i, smp) in zip(live.slots, enumerate(live.samples), strict=True):
                self._slots[slot] = (live, i)
                self._table[slot] = NULL_PAGE
                self._table[slot, : len(smp.pages)] = smp.pages
            self._prefilling.append(live)

    def _in_flight(self, keys: list[bytes]) -> int:
        """The most leading pages of `keys` that a prompt being prefilled (under the current
        weights) will register: a request that starts like it is admitted once they are in,
        rather than prefilling them a second time beside it (a burst of requests with one
        system prompt prefills it once)."""
        best = 0
        for other in self._prefilling:
            if other.weights != self._weights:
                continue
            common = 0
            for a, b in zip(keys, other.keys, strict=False):
                if a != b:
                    break
                common += 1
            best = max(best, common)
        return best

    def _cache_pages(self, live: _Live, i: int) -> None:
        """Registers sample `i`'s full pages whose keys and values are all written: while the
        prompt is prefilled, its pages up to `prefilled` (held by sample 0); when the sample
        ends, those of its generated tokens but the last, which was never fed."""
        if not self.config.prefix_cache or live.weights != self._weights:
            return
        ps, smp, length = self.config.page_size, live.samples[i], live.prompt.size
        if not smp.generated:
            for page, key in zip(smp.pages, live.keys[: live.prefilled // ps], strict=False):
                self.pages.register(page, key)
            return
        start = length // ps  # the prompt's full pages are registered already
        tokens = np.concatenate([live.prompt, np.asarray(smp.generated[:-1], np.int32)])
        keys = page_keys(tokens[start * ps :], ps, parent=live.keys[start - 1] if start else b"")
        for page, key in zip(smp.pages[start:], keys, strict=False):
            self.pages.register(page, key)

    def _finish(self, live: _Live, i: int) -> None:
        smp = live.samples[i]
        smp.done = True
        if smp.generated:
            self._cache_pages(live, i)
        self.pages.release(smp.pages)
        slot = live.slots[i]
        self._slots[slot] = None
        self._table[slot] = NULL_PAGE
        if all(s.done for s in live.samples):
            self._live.pop(live.rid, None)

    def _rows(self, entries: list[tuple[_Live, int, int] | None]) -> tuple[np.ndarray, ...]:
        """Sampling parameters per row: `(request, sample, step)` or None (idle)."""
        size = len(entries)
        temp = np.zeros(size, np.float32)
        top_k = np.zeros(size, np.int32)
        top_p = np.ones(size, np.float32)
        seed = np.zeros(size, np.uint32)
        sample = np.zeros(size, np.int32)
        step = np.zeros(size, np.int32)
        top = np.zeros(size, np.int32)
        for r, e in enumerate(entries):
            if e is None:
                continue
            live, i, t = e
            s = live.request.sampling
            temp[r] = s.temperature
            top_k[r] = s.top_k or 0
            top_p[r] = 1.0 if s.top_p is None else s.top_p
            seed[r], sample[r], step[r] = live.seed, i, t
            top[r] = live.request.logprobs or 0
        return (temp, top_k, top_p, seed, sample, step, top)

    def _emit(self, live: _Live, i: int, token: int, lp: float, ids, lps) -> Event:
        smp = live.samples[i]
        smp.generated.append(token)
        k = live.request.logprobs
        top = None
        if k is not None:
            top = tuple((int(a), float(b)) for a, b in zip(ids[:k], lps[:k], strict=True))
        reason = None
        if token in live.stop:
            reason = "stop"
        elif len(smp.generated) >= live.request.max_tokens:
            reason = "length"
        if reason is not None:
            self._finish(live, i)
        return Event(live.rid, i, token, lp, top, reason, live.cached)

    def step(self) -> list[Event]:
        """Admit, then one compiled call: decode one token for every generating sample, and
        prefill one chunk of the admitted prompts (oldest first) in the same pass if any."""
        self._admit()
        if self._waiting and not self.num_running:
            # Everything is free yet the head does not fit: submit's checks should prevent it.
            raise RuntimeError(
                f"engine bookkeeping: request {self._waiting[0].rid} cannot be admitted into an "
                f"idle engine ({self.pages.num_free} of {self.pages.capacity} pages free)"
            )
        if self._prefilling:
            return self._mixed()
        return self._decode()

    def _generating(self) -> list[tuple[int, _Live, int, int]]:
        """`(slot, request, sample, tokens so far)` of every sample that is generating."""
        out = []
        for slot, held in enumerate(self._slots):
            if held is None:
                continue
            live, i = held
            smp = live.samples[i]
            if smp.generated and not smp.done:  # else still prefilling
                out.append((slot, live, i, len(smp.generated)))
        return out

    def _decode_rows(self, size: int, steps: int, entries) -> tuple[np.ndarray, ...]:
        """Tokens, positions, valid flags and steps left of `entries` packed into `size` rows,
        and the last position any of them reaches in this call (-1 for none)."""
        tokens = np.zeros(size, np.int32)
        positions = np.zeros(size, np.int32)
        valid = np.zeros(size, bool)
        remaining = np.zeros(size, np.int32)
        for r, (_, live, i, done) in enumerate(entries):
            tokens[r] = live.samples[i].generated[-1]
            positions[r] = live.prompt.size + done - 1
            valid[r] = True
            remaining[r] = min(steps, live.request.max_tokens - done)
        last = int((positions + remaining - 1)[valid].max()) if entries else -1
        return tokens, positions, valid, remaining, last

    def _decode_table(self, size: int, pages: int, entries) -> np.ndarray:
        table = np.full((size, pages), NULL_PAGE, np.int32)
        table[: len(entries)] = self._table[[e[0] for e in entries], :pages]
        return table

    def _decode(self) -> list[Event]:
        # Only the generating samples are sent, packed into the first rows of a batch padded to
        # a power of two, with their page tables cut to the pages the step can touch (also a
        # power of two): attention reads those pages, not `max_seqs x max_seq_len` slots.
        many = self._programs.decode_many is not None
        steps = self.config.decode_steps if many else 1
        entries = self._generating()
        if not entries:
            return []
        size = _bucket(len(entries), self.config.max_seqs)
        tokens, positions, valid, remaining, last = self._decode_rows(size, steps, entries)
        pages = _bucket(last // self.config.page_size + 1, self.pages_per_seq)
        program = self._programs.decode_many if many else self._programs.decode
        padded = [e[1:] for e in entries] + [None] * (size - len(entries))
        self._pools, out = program(
            self._leaves_now,
            self._pools,
            tokens,
            positions,
            valid,
            self._decode_table(size, pages, entries),
            self._rows(padded),
            remaining,
        )
        tok, lp, ids, lps = jax.device_get(out)
        events = []
        for t in range(steps):
            for r, (_, live, i, _) in enumerate(entries):
                if t >= remaining[r] or live.samples[i].done:
                    continue
                events.append(
                    self._emit(live, i, int(tok[t, r]), float(lp[t, r]), ids[t, r], lps[t, r])
                )
        return events

    def _mixed(self) -> list[Event]:
        """One decoding step of the generating samples and one prompt chunk, as one compiled
        call (`Programs.mixed`). The chunk is filled with the prefilling prompts in order (the
        rest of the oldest, then the next, ...), at most `max_prefills` of them."""
        cfg = self.config
        ps = cfg.page_size
        entries = self._generating()
        size = _bucket(len(entries), cfg.max_seqs)
        tokens, positions, valid, _, last = self._decode_rows(size, 1, entries)
        width = cfg.chunk(size)  # the step's token budget left after the decoding rows
        chunk = np.zeros(width, np.int32)
        chunk_pos = np.zeros(width, np.int32)
        chunk_valid = np.zeros(width, bool)
        chunk_seg = np.zeros(width, np.int32)
        parts: list[tuple[_Live, int, int, int]] = []  # (request, first position, tokens, end)
        used = 0
        for live in self._prefilling:
            if used == width or len(parts) == self._max_prefills:
                break
            start = live.prefilled
            part = live.prompt[start : start + width - used]
            end = used + part.size
            chunk[used:end] = part
            chunk_pos[used:end] = np.arange(start, start + part.size)
            chunk_valid[used:end] = True
            chunk_seg[used:end] = len(parts)
            parts.append((live, start, part.size, end))
            used = end
        # Every part reads the pages up to its last token (a power of two of them).
        need = max([last // ps + 1] + [_ceil_div(start + n, ps) for _, start, n, _ in parts])
        pages = _bucket(need, self.pages_per_seq)
        chunk_table = np.full((self._max_prefills, pages), NULL_PAGE, np.int32)
        last_tokens = np.zeros(self._max_prefills, np.int32)
        # Sampling rows: the decoding rows, then the samples of each prompt whose last chunk
        # this is, drawing from that prompt's last token (logits row `size + k`).
        rows: list[tuple[_Live, int, int] | None] = [e[1:] for e in entries]
        rows += [None] * (cfg.max_seqs - len(rows))
        pick = np.zeros(cfg.max_seqs, np.int32)
        pick[: len(entries)] = np.arange(len(entries))
        copy_src = np.full(cfg.max_seqs, NULL_PAGE, np.int32)
        copy_dst = np.full(cfg.max_seqs, NULL_PAGE, np.int32)
        finals: list[tuple[_Live, int]] = []  # (request, its first sampling row)
        r, c = len(entries), 0
        for k, (live, start, n, end) in enumerate(parts):
            chunk_table[k] = self._table[live.slots[0], :pages]
            last_tokens[k] = end - 1
            if start + n < live.prompt.size:
                continue
            finals.append((live, r))
            full = live.prompt.size // ps
            for i, smp in enumerate(live.samples):
                pick[r], rows[r] = size + k, (live, i, 0)
                r += 1
                if i and live.prompt.size % ps and not smp.cancelled:
                    copy_src[c], copy_dst[c] = live.samples[0].pages[full], smp.pages[full]
                    c += 1
        self._pools, out = self._programs.mixed(
            self._leaves_now,
            self._pools,
            np.concatenate([tokens, chunk]),
            np.concatenate([positions, chunk_pos]),
            np.concatenate([valid, chunk_valid]),
            self._decode_table(size, pages, entries),
            chunk_table,
            chunk_seg,
            last_tokens,
            pick,
            self._rows(rows),
            copy_src,
            copy_dst,
        )
        tok, lp, ids, lps = jax.device_get(out)
        events = [
            self._emit(live_, i, int(tok[r]), float(lp[r]), ids[r], lps[r])
            for r, (_, live_, i, _) in enumerate(entries)
            if not live_.samples[i].done
        ]
        for live, _, n, _ in parts:
            live.prefilled += n
            self._cache_pages(live, 0)  # its pages are findable as soon as they are written
        for live, r0 in finals:
            self._prefilling.popleft()  # the finished prompts are the oldest ones
            for i, smp in enumerate(live.samples):
                if smp.cancelled:
                    self._finish(live, i)
            events += [
                self._emit(live, i, int(tok[r0 + i]), float(lp[r0 + i]), ids[r0 + i], lps[r0 + i])
                for i, smp in enumerate(live.samples)
                if not smp.done
            ]
        return events

    # -- conveniences --------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        """Whether any request is queued, prefilling or generating."""
        return bool(self._live)

    @property
    def num_waiting(self) -> int:
        """Requests queued, not yet admitted."""
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        """Slots held by admitted samples."""
        return sum(s is not None for s in self._slots)

    def run_until_done(self) -> dict[int, list[list[int]]]:
        """Steps until nothing is left; the tokens of each request that ended, per sample."""
        out: dict[int, list[list[int]]] = {}
        while self.has_work:
            for e in self.step():
                rows = out.setdefault(e.request_id, [])
                while len(rows) <= e.sample:
                    rows.append([])
                rows[e.sample].append(e.token)
        return out

    def warmup(self) -> None:
        """Compiles every program serving can run (on idle inputs): the decoding step (one and
        `decode_steps` steps) and the mixed step (decoding rows and a prompt chunk) at each
        batch bucket x page bucket; `num_programs` of them."""
        cfg, run = self.config, self._programs
        mixed_rows = self._rows([None] * cfg.max_seqs)
        no_copy = np.full(cfg.max_seqs, NULL_PAGE, np.int32)
        for size in buckets(cfg.max_seqs):
            chunk = np.zeros(cfg.chunk(size), np.int32)
            rows = self._rows([None] * size)
            zeros = np.zeros(size, np.int32)
            idle = np.zeros(size, bool)
            for pages in buckets(self.pages_per_seq):
                table = np.full((size, pages), NULL_PAGE, np.int32)
                for decode in (run.decode, run.decode_many):
                    if decode is not None:
                        self._pools, _ = decode(
                            self._leaves_now, self._pools, zeros, zeros, idle, table, rows, zeros
                        )
                self._pools, _ = run.mixed(
                    self._leaves_now,
                    self._pools,
                    np.concatenate([zeros, chunk]),
                    np.concatenate([zeros, chunk]),
                    np.zeros(size + chunk.size, bool),
                    table,
                    np.full((self._max_prefills, pages), NULL_PAGE, np.int32),
                    chunk,
                    np.zeros(self._max_prefills, np.int32),
                    np.zeros(cfg.max_seqs, np.int32),
                    mixed_rows,
                    no_copy,
                    no_copy,
                )
        jax.block_until_ready(self._pools)

    @property
    def num_programs(self) -> int:
        """How many programs (shapes) `warmup` compiles: the decoding step (twice with
        `decode_steps > 1`) and the mixed step at every batch bucket x page bucket."""
        programs = 2 + (self._programs.decode_many is not None)
        return programs * len(buckets(self.config.max_seqs)) * len(buckets(self.pages_per_seq))

    def update_weights(self, model: Transformer) -> None:
        """Serves `model`'s parameters from the next step on (same config, same shapes and
        dtypes; nothing recompiles). Running sequences keep their KV pages."""
        old_cfg, new_cfg = self.model_config, model.config
        if new_cfg != old_cfg:
            diff = "; ".join(
                f"{f.name}: {getattr(old_cfg, f.name)!r} -> {getattr(new_cfg, f.name)!r}"
                for f in dataclasses.fields(new_cfg)
                if getattr(new_cfg, f.name) != getattr(old_cfg, f.name)
            )
            raise EngineError(
                f"update_weights: the new model's config differs from the engine's ({diff}). "
                "Fix: new weights of the same config, or build a new Engine"
            )
        new = _leaf_specs(model)
        for (path, old_spec), (_, new_spec) in zip(self._leaves, new, strict=True):
            if old_spec != new_spec:
                raise EngineError(
                    f"update_weights: parameter {path} is {new_spec[1]}{list(new_spec[0])}, the "
                    f"engine's is {old_spec[1]}{list(old_spec[0])}. Fix: same shapes and dtypes "
                    "(cast with jax.tree.map(lambda x: x.astype(...), model))"
                )
        self._leaves_now = jax.tree.leaves(_prepare(model))
        # Cached pages hold the old weights' keys and values; running requests keep theirs
        # but do not cache them.
        self.pages.clear_cache()
        self._weights += 1


def _leaf_specs(model: Any) -> list[tuple[str, tuple[tuple[int, ...], str]]]:
    leaves = jax.tree_util.tree_leaves_with_path(eqx.filter(model, eqx.is_array))
    return [
        (jax.tree_util.keystr(path), (tuple(x.shape), str(jnp.dtype(x.dtype))))
        for path, x in leaves
    ]
