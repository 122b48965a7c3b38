"""Paged attention against the dense KV cache, and the page allocator.

Sequences of different lengths are prefilled in chunks through one shared pool, one of them
reading a prefix another one wrote (shared pages), then each decodes a token; every logit
row must equal the dense cache's (`Transformer.decode`) within 1e-5 in float32.
"""

import equinox as eqx
import jax.numpy as jnp
import model_testing as T
import numpy as np
import pytest

import meltemi.haliax as hax
import meltemi.models as mm
from meltemi.models.engine import PageAllocator
from meltemi.models.engine import _forward as F

PAGE = 4
CHUNK = 6
NUM_PAGES = 24
PAGES_PER_SEQ = 6


@eqx.filter_jit
def _paged(model, pools, tokens, positions, valid, table, backend):
    return F.paged_logits(model, pools, tokens, positions, valid, table, backend)


@eqx.filter_jit
def _dense(model, prompt, nxt):
    """Dense-cache logits of the prompt (prefill) and of one decoded token after it."""
    length = prompt.shape[1]
    cache = model.init_cache(1, length + 1, per_layer=True)
    kpos = hax.Axis("key_position", length + 1)
    valid = hax.named(jnp.ones((1, length + 1), bool), (hax.Axis("batch", 1), kpos))

    def named(a):
        return hax.named(a, (hax.Axis("batch", a.shape[0]), hax.Axis("position", a.shape[1])))

    pos = jnp.arange(length)[None]
    logits, cache = model.decode(
        named(prompt), cache, positions=named(pos), cache_index=0, kv_valid=valid
    )
    step, _ = model.decode(
        named(nxt),
        cache,
        positions=named(jnp.full((1, 1), length)),
        cache_index=length,
        kv_valid=valid,
    )
    order = ("batch", "position", "vocab")
    return logits.rearrange(order).array[0], step.rearrange(order).array[0, 0]


def _run_paged(model, prompts, tables, starts, phases, backend="reference"):
    """Prefills `prompts[b][starts[b]:]` in chunks of CHUNK, the rows of each phase together
    (a row reading another's prefix comes in a later phase), then decodes one token of every
    row in one batch; returns each row's prefill logits (from `starts[b]`) and decode logits."""
    pools = F.init_pools(model, NUM_PAGES, PAGE, jnp.float32)
    table = np.zeros((len(prompts), PAGES_PER_SEQ), np.int32)
    for b, t in enumerate(tables):
        table[b, : len(t)] = t
    got = [[] for _ in prompts]
    for rows in phases:
        longest = max(len(prompts[b]) - starts[b] for b in rows)
        for c in range(0, longest, CHUNK):
            tokens = np.zeros((len(rows), CHUNK), np.int32)
            positions = np.zeros_like(tokens)
            valid = np.zeros(tokens.shape, bool)
            for r, b in enumerate(rows):
                s = starts[b] + c
                part = prompts[b][s : s + CHUNK]
                tokens[r, : len(part)] = part
                positions[r, : len(part)] = np.arange(s, s + len(part))
                valid[r, : len(part)] = True
            logits, pools = _paged(model, pools, tokens, positions, valid, table[rows], backend)
            for r, b in enumerate(rows):
                got[b].extend(np.asarray(logits[r])[valid[r]])
    tokens = np.ones((len(prompts), 1), np.int32)
    positions = np.array([[len(p)] for p in prompts], np.int32)
    step, _ = _paged(
        model, pools, tokens, positions, np.ones((len(prompts), 1), bool), table, backend
    )
    return [np.stack(g) for g in got], np.asarray(step[:, 0])


@pytest.mark.parametrize("backend", ["reference", "native", "pallas_gpu"])
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3", "tiny-gemma2"])
def test_paged_logits_equal_dense_cache_with_shared_prefix(preset, backend):
    # gemma2: sliding window 5, local/global layers, soft caps; qwen3: QK-norm.
    cfg = mm.get_preset(preset).replace(max_seq_len=32)
    model = F.prepare(T.random_model(cfg, seed=2))
    rng = np.random.default_rng(0)
    a = rng.integers(1, cfg.vocab_size, 13).tolist()
    b = a[:8] + rng.integers(1, cfg.vocab_size, 9).tolist()  # shares a's first two pages
    c = rng.integers(1, cfg.vocab_size, 3).tolist()
    # Page ids out of order, b reads a's pages 0-1 and writes only from position 8 on.
    tables = [[7, 2, 11, 5, 9], [7, 2, 3, 14, 20], [16]]
    prefill, step = _run_paged(model, [a, b, c], tables, [0, 8, 0], [[0, 2], [1]], backend)
    for row, (p, s) in enumerate(zip([a, b, c], [0, 8, 0])):
        dense_prefill, dense_step = _dense(
            model, np.asarray([p], np.int32), np.ones((1, 1), np.int32)
        )
        np.testing.assert_allclose(prefill[row], np.asarray(dense_prefill)[s:], atol=1e-5, rtol=0)
        np.testing.assert_allclose(step[row], np.asarray(dense_step), atol=1e-5, rtol=0)


def test_paged_logits_see_the_pages_the_table_names():
    # The check above can fail: pointing b at a page a did not write changes its logits.
    cfg = mm.get_preset("tiny-llama").replace(max_seq_len=32)
    model = F.prepare(T.random_model(cfg, seed=2))
    a = list(range(1, 14))
    b = a[:8] + list(range(20, 29))
    right, _ = _run_paged(model, [a, b], [[7, 2, 11, 5, 9], [7, 2, 3, 14, 20]], [0, 8], [[0], [1]])
    wrong, _ = _run_paged(model, [a, b], [[7, 2, 11, 5, 9], [7, 4, 3, 14, 20]], [0, 8], [[0], [1]])
    assert np.abs(right[1] - wrong[1]).max() > 1e-2


def test_allocator_reference_counts_free_and_reuse_pages():
    pages = PageAllocator(6)
    assert pages.capacity == 5 and pages.num_free == 5
    a = pages.alloc(3)
    assert 0 not in a and len(set(a)) == 3
    pages.share(a[:2])
    assert pages.refcount[a].tolist() == [2, 2, 1]
    pages.release(a)
    assert pages.num_free == 3  # the shared two are still held once
    pages.release(a[:2])
    assert pages.num_free == 5
    assert sorted(pages.alloc(5)) == [1, 2, 3, 4, 5]  # freed pages are handed out again
    with pytest.raises(MemoryError, match=r"alloc\(1\) with 0 free"):
        pages.alloc(1)
    with pytest.raises(ValueError, match="already free"):
        PageAllocator(3).release([1])
