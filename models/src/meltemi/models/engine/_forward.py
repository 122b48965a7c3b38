"""The model's forward pass through paged KV pools, the batched sampler, and the engine's
compiled programs (a decoding step, a prefill chunk, a page copy).

Every program takes the model as its first argument (its arrays are traced, so new weights
of the same shapes reuse the compiled program) and the pools second (donated: updated in
place). Shapes are fixed by `EngineConfig`, so serving compiles these three programs once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

import meltemi.haliax as hax
import meltemi.haliax.nn as hnn
from meltemi.models._axes import BATCH, EMBED, POSITION, VOCAB
from meltemi.models._generate import _weights_out_first
from meltemi.models._layers import constrain, project_qkv
from meltemi.models._sampling import argmax
from meltemi.models._transformer import Transformer
from meltemi.models.engine._paged_attention import resolve_paged_backend, write_pages
from meltemi.models.engine._pages import NULL_PAGE
from meltemi.models.moe import MoeMlp

Pools = tuple[tuple[jax.Array, jax.Array], ...]
"""Per layer, the `(keys, values)` pools `[num_pages, page_size, kv_heads, head_size]`."""


def prepare(model: Transformer) -> Transformer:
    """The model as the engine runs it: layers unstacked (each step reads every layer's
    weights where they are) and `Linear` weights stored output-first (see `_generate`)."""
    if isinstance(model.blocks, hnn.Stacked):
        blocks = model.blocks
        unstacked = hnn.BlockSeq(blocks.unstacked(), blocks.Block, blocks.gradient_checkpointing)
        model = eqx.tree_at(lambda m: m.blocks, model, unstacked)
    return _weights_out_first(model)


def init_pools(model: Transformer, num_pages: int, page_size: int, dtype) -> Pools:
    """Zeroed pools of every layer."""
    cfg = model.config
    shape = (num_pages, page_size, cfg.num_kv_heads, cfg.head_size)
    return tuple((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(cfg.num_layers))


def _named(arr: jax.Array) -> hax.NamedArray:
    return hax.named(arr, (hax.Axis(BATCH, arr.shape[0]), hax.Axis(POSITION, arr.shape[1])))


def paged_hidden(
    model: Transformer,
    pools: Pools,
    tokens: jax.Array,
    positions: jax.Array,
    valid: jax.Array,
    page_table: jax.Array,
    backend: str,
) -> tuple[hax.NamedArray, Pools]:
    """Final-normed hidden states of `tokens` (`[batch, T]`), attending through the pools.

    Each valid token's keys and values are written at its position in its row's pages
    before attention; invalid (padding) tokens write to the reserved page and their outputs
    mean nothing. The block structure mirrors `Block.__call__`, with `attend`'s cache and
    kernel replaced by the paged write and `backend`.

    Args:
        model: a `prepare`d model.
        pools: the KV pools.
        tokens: `[batch, T]` token ids.
        positions: `[batch, T]` position of each token in its sequence.
        valid: `[batch, T]` bool, real tokens.
        page_table: `[batch, pages]` each row's pages.
        backend: `EngineConfig.attention_backend`.
    """
    kernel = resolve_paged_backend(backend)
    page_size = pools[0][0].shape[1]
    pages = jnp.take_along_axis(page_table, positions // page_size, axis=1)
    pages = jnp.where(valid, pages, NULL_PAGE)
    offsets = positions % page_size
    pos = _named(positions)
    token_mask = _named(valid)
    x = model._embed(_named(tokens), pos)
    new_pools = []
    for i, (k_pool, v_pool) in enumerate(pools):
        block = model.blocks.get_layer(i)
        sliding = model._sliding(i)
        options = block.attn_options
        x = constrain(x)
        h = x if block.attn_norm is None else block.attn_norm(x)
        q, k, v = project_qkv(block.attn, h, positions=pos, options=options, sliding=sliding)
        k_pool = write_pages(k_pool, k, pages, offsets)
        v_pool = write_pages(v_pool, v, pages, offsets)
        new_pools.append((k_pool, v_pool))
        out = kernel(
            q,
            k_pool,
            v_pool,
            page_table,
            positions,
            window=options.window if sliding else None,
            softcap=options.softcap,
            scale=options.scale,
        )
        h = block.attn.o_proj(constrain(out))
        if block.post_attn_norm is not None:
            h = block.post_attn_norm(h)
        x = constrain(x + h)
        h = x if block.mlp_norm is None else block.mlp_norm(x)
        h = (
            block.mlp(h, token_mask=token_mask)[0]
            if isinstance(block.mlp, MoeMlp)
            else block.mlp(h)
        )
        if block.post_mlp_norm is not None:
            h = block.post_mlp_norm(h)
        x = constrain(x + h)
    return model.final_norm(x), tuple(new_pools)


def paged_logits(model, pools, tokens, positions, valid, page_table, backend="reference"):
    """Logits `[batch, T, vocab]` of `paged_hidden` (for tests and scoring)."""
    hidden, pools = paged_hidden(model, pools, tokens, positions, valid, page_table, backend)
    return model._project(hidden).rearrange((BATCH, POSITION, VOCAB)).array, pools


class SamplingRows(eqx.Module):
    """Per-row sampling parameters of a batch (arrays `[rows]`).

    Attributes:
        temperature: 0 = greedy.
        top_k: 0 = no top-k filter.
        top_p: 1.0 = no nucleus filter.
        seed: the request's seed (uint32).
        sample: the sample index within the request.
        step: the index of the token being drawn within the sample.
    """

    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    seed: jax.Array
    sample: jax.Array
    step: jax.Array


def _draw(logits: jax.Array, rows: SamplingRows) -> jax.Array:
    """One token per row from temperature / top-k / top-p filtered logits (float32)."""
    vocab = logits.shape[-1]
    scaled = logits / jnp.where(rows.temperature > 0, rows.temperature, 1.0)[:, None]
    desc = -jnp.sort(-scaled, axis=-1)
    k = jnp.where(rows.top_k > 0, jnp.minimum(rows.top_k, vocab), vocab)
    kth = jnp.take_along_axis(desc, (k - 1)[:, None], axis=-1)
    # Nucleus over the top-k survivors: keep a token while the mass before it is < top_p.
    kept = jnp.where(desc >= kth, desc, -jnp.inf)
    probs = jax.nn.softmax(kept, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs
    n_keep = jnp.maximum(jnp.sum((before < rows.top_p[:, None]) & (desc >= kth), -1), 1)
    cutoff = jnp.maximum(kth, jnp.take_along_axis(desc, (n_keep - 1)[:, None], axis=-1))
    filtered = jnp.where(scaled >= cutoff, scaled, -jnp.inf)

    def one(row, seed, sample, step):
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), sample), step)
        return jax.random.categorical(key, row).astype(jnp.int32)

    return jax.vmap(one)(filtered, rows.seed, rows.sample, rows.step)


def sample_batch(logits: jax.Array, rows: SamplingRows, num_top: int):
    """Tokens, their log-probabilities and the `num_top` most likely alternatives per row.

    Greedy rows take the argmax; the rest draw from their filtered distribution with the key
    `fold_in(fold_in(key(seed), sample), step)` (a row's draw depends only on its own values).
    Log-probabilities are those of the raw logits.
    """
    logits = logits.astype(jnp.float32)
    greedy = argmax(logits)
    token = jax.lax.cond(
        jnp.any(rows.temperature > 0),
        lambda: jnp.where(rows.temperature > 0, _draw(logits, rows), greedy),
        lambda: greedy,
    )
    logp = jax.nn.log_softmax(logits, axis=-1)
    chosen = jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]
    top_lp, top_ids = (
        jax.lax.top_k(logp, num_top) if num_top else (logp[:, :0], token[:, None][:, :0])
    )
    return token, chosen, top_ids.astype(jnp.int32), top_lp


class Programs(NamedTuple):
    """The engine's compiled programs for one model structure (see `programs`)."""

    decode: Callable
    decode_many: Callable | None
    prefill: Callable
    copy_page: Callable


@functools.cache
def programs(treedef: Any, backend: str, num_top: int, steps: int = 1) -> Programs:
    """The compiled programs of models with pytree structure `treedef` (which holds every
    static field: the config, axes, ...). The model travels as its flat list of arrays, the
    cheapest argument to pass per call; cached, so engines of one structure share programs.

    * `decode(leaves, pools, tokens, positions, valid, table, rows, remaining)`: one token
      per slot (`[slots]` arrays): write, attend, sample; outputs over `[1, slots, ...]`.
      `decode_many` (`steps > 1`, else None): `steps` such steps in one call, each slot's
      sampled token fed back, row `s` active for its first `remaining[s]` steps; outputs
      over `[steps, slots, ...]`.
    * `prefill(leaves, pools, tokens, positions, valid, table, last, rows)`: one chunk of
      one sequence's prompt (`[1, chunk]`), then one draw per row of `rows` from the logits
      at chunk index `last` (the samples' first tokens; used after the prompt's last chunk).
    * `copy_page(pools, src_dst)`: page `src_dst[0]` copied to `src_dst[1]` in every pool
      (copy-on-write of a shared prompt's partial last page).
    """

    def decode(leaves, pools, tokens, positions, valid, table, rows, remaining, *, steps):
        model = jax.tree.unflatten(treedef, leaves)
        rows = SamplingRows(*rows)

        def one(carry, t):
            pools, tokens = carry
            ok = valid & (t < remaining)
            hidden, pools = paged_hidden(
                model, pools, tokens[:, None], (positions + t)[:, None], ok[:, None], table, backend
            )
            logits = model._project(hidden).rearrange((BATCH, POSITION, VOCAB)).array[:, 0]
            step_rows = eqx.tree_at(lambda r: r.step, rows, rows.step + t)
            out = sample_batch(logits, step_rows, num_top)
            return (pools, jnp.where(ok, out[0], tokens)), out

        if steps == 1:
            (pools, _), out = one((pools, tokens), 0)
            return pools, jax.tree.map(lambda x: x[None], out)
        (pools, _), out = jax.lax.scan(one, (pools, tokens), jnp.arange(steps))
        return pools, out

    def prefill(leaves, pools, tokens, positions, valid, table, last, rows):
        model = jax.tree.unflatten(treedef, leaves)
        hidden, pools = paged_hidden(model, pools, tokens, positions, valid, table, backend)
        h = hidden.rearrange((BATCH, POSITION, EMBED))
        one = jax.lax.dynamic_slice_in_dim(h.array, last, 1, axis=1)
        row = hax.named(one, (h.axes[0], h.axes[1].resize(1), h.axes[2]))
        logits = model._project(row).rearrange((BATCH, POSITION, VOCAB)).array[0, 0]
        rows = SamplingRows(*rows)
        rows_logits = jnp.broadcast_to(logits, (rows.seed.shape[0], logits.shape[0]))
        return pools, sample_batch(rows_logits, rows, num_top)

    def copy_page(pools, src_dst):
        src, dst = src_dst[0], src_dst[1]
        return tuple((k.at[dst].set(k[src]), v.at[dst].set(v[src])) for k, v in pools)

    return Programs(
        jax.jit(functools.partial(decode, steps=1), donate_argnums=1),
        jax.jit(functools.partial(decode, steps=steps), donate_argnums=1) if steps > 1 else None,
        jax.jit(prefill, donate_argnums=1),
        jax.jit(copy_page, donate_argnums=0),
    )
