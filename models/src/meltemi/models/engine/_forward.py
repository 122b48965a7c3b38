"""The model's forward pass through paged KV pools, the batched sampler, and the engine's
compiled programs (a decoding step, and a mixed step: decoding rows and a prompt chunk in one
pass).

Every program takes the model as its first argument (its arrays are traced, so new weights
of the same shapes reuse the compiled program) and the pools second (donated: updated in
place). Shapes come from a small fixed set of buckets (see `Engine.warmup`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

import meltemi.haliax as hax
from meltemi.models._axes import BATCH, EMBED, POSITION, VOCAB
from meltemi.models._generate import _for_decoding
from meltemi.models._layers import constrain, project_qkv
from meltemi.models._sampling import argmax
from meltemi.models._transformer import Transformer
from meltemi.models.engine._paged_attention import (
    Q_ORDER,
    copy_pages,
    in_q_order,
    like_q,
    pool_shapes,
    resolve_paged_backend,
    write_pages,
)
from meltemi.models.engine._pages import NULL_PAGE
from meltemi.models.moe import MoeMlp

Pools = tuple[tuple[jax.Array, jax.Array], ...]
"""Per layer, the `(keys, values)` pools (`_paged_attention.pool_shapes`: head-major)."""


def prepare(model: Transformer) -> Transformer:
    """The model as the engine runs it: `generate`'s decoding form (`_generate._for_decoding`:
    layers unstacked, so each step reads every layer's weights where they are; `Linear`
    weights stored output-first; on the CPU a tied head multiplied weight-first too)."""
    return _for_decoding(model)


def init_pools(model: Transformer, num_pages: int, page_size: int, dtype) -> Pools:
    """Zeroed pools of every layer."""
    cfg = model.config
    k_shape, v_shape = pool_shapes(num_pages, page_size, cfg.num_kv_heads, cfg.head_size)
    return tuple(
        (jnp.zeros(k_shape, dtype), jnp.zeros(v_shape, dtype)) for _ in range(cfg.num_layers)
    )


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
    chunk_table: jax.Array | None = None,
    chunk_seg: jax.Array | None = None,
    copy: tuple[jax.Array, jax.Array] | None = None,
) -> tuple[hax.NamedArray, Pools]:
    """Final-normed hidden states of `tokens` (`[batch, T]`), attending through the pools.

    Each valid token's keys and values are written at its position in its row's pages
    before attention; invalid (padding) tokens write to the reserved page and their outputs
    mean nothing. The block structure mirrors `Block.__call__`, with `attend`'s cache and
    kernel replaced by the paged write and `backend`.

    With `chunk_table` (a mixed step), `tokens` is `[D + C, 1]`: rows `:D` are decoding
    sequences with `page_table` (`[D, pages]`), rows `D:` are a prompt chunk of `C` tokens
    from up to `K` prompts, token `c` belonging to the prompt whose pages `chunk_table[
    chunk_seg[c]]` (`[K, pages]`) lists. Every row goes through the layers' products
    together; attention runs per layer over the decoding rows' own pages, then over each
    prompt's pages for its tokens (`[1, C]` queries, so a prompt's pages are read once).

    Args:
        model: a `prepare`d model.
        pools: the KV pools.
        tokens: `[batch, T]` token ids.
        positions: `[batch, T]` position of each token in its sequence.
        valid: `[batch, T]` bool, real tokens.
        page_table: `[batch, pages]` each row's pages (the decoding rows' with `chunk_table`).
        backend: `EngineConfig.attention_backend`.
        chunk_table: `[K, pages]` the chunk's prompts' pages, or None (every row its own
            sequence).
        chunk_seg: `[C]` int, the prompt (row of `chunk_table`) of each chunk token.
        copy: `(src, dst)` page ids, or None: in every layer, after the write, page `src[i]`
            is copied to `dst[i]` (copy-on-write of a shared prompt's partial last page).
    """
    kernel = resolve_paged_backend(backend)
    page_size = pools[0][0].shape[2]
    if chunk_table is None:
        pages = jnp.take_along_axis(page_table, positions // page_size, axis=1)

        def attend(q, k_pool, v_pool, **options):
            return kernel(q, k_pool, v_pool, page_table, positions, **options)

    else:
        d = page_table.shape[0]
        dec_pos, chunk_pos = positions[:d], positions[d:].reshape(1, -1)
        token_tables = chunk_table[chunk_seg]  # [C, pages]
        pages = jnp.concatenate(
            [
                jnp.take_along_axis(page_table, dec_pos // page_size, axis=1),
                jnp.take_along_axis(token_tables, chunk_pos.reshape(-1, 1) // page_size, axis=1),
            ]
        )
        attend = functools.partial(
            _attend_mixed, kernel, page_table, chunk_table, chunk_seg, dec_pos, chunk_pos
        )
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
        k_pool, v_pool = write_pages(k_pool, v_pool, k, v, pages, offsets)
        if copy is not None:
            # Here, between the write and the reads of attention: after the last layer the
            # copy made XLA:CPU copy every pool whole (+50 ms per step at 162M), here it is free.
            k_pool, v_pool = copy_pages(k_pool, *copy), copy_pages(v_pool, *copy)
        new_pools.append((k_pool, v_pool))
        out = attend(
            q,
            k_pool,
            v_pool,
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


def _attend_mixed(
    kernel, dec_table, chunk_table, chunk_seg, dec_pos, chunk_pos, q, k_pool, v_pool, **options
) -> hax.NamedArray:
    """`kernel` over a mixed step's rows (see `paged_hidden`): the first `D` rows each over
    their own pages, the remaining `C` rows as one sequence per prompt of the chunk (the
    tokens of the other prompts given position -1, which sees nothing, and their outputs
    dropped)."""
    qa, order = in_q_order(q)  # [D + C, 1, kv_heads, group, head]
    d = dec_table.shape[0]
    batch, pos = order[0], order[1]
    dec_q = hax.named(qa[:d], (batch.resize(d), *order[1:]))
    chunk_q = hax.named(
        qa[d:].reshape(1, -1, *qa.shape[2:]),
        (batch.resize(1), pos.resize(qa.shape[0] - d), *order[2:]),
    )
    dec = kernel(dec_q, k_pool, v_pool, dec_table, dec_pos, **options)
    chunk = None
    for k in range(chunk_table.shape[0]):
        mine = chunk_seg == k
        out = kernel(
            chunk_q, k_pool, v_pool, chunk_table[k : k + 1], jnp.where(mine, chunk_pos, -1),
            **options,
        ).rearrange(Q_ORDER).array[0]  # fmt: skip
        chunk = out if chunk is None else jnp.where(mine[:, None, None, None], out, chunk)
    dec = dec.rearrange(Q_ORDER).array
    chunk = chunk.reshape(-1, 1, *qa.shape[2:])
    return like_q(jnp.concatenate([dec, chunk]), order, q)


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
        top: how many top alternatives the row's request reports (0 = none).
    """

    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    seed: jax.Array
    sample: jax.Array
    step: jax.Array
    top: jax.Array


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
    Log-probabilities are those of the raw logits. The alternatives are computed only when a
    row asks for them (`rows.top`; a top-k over the vocabulary is ~0.4 ms at 8 x 32000 on the
    CPU), else they are zeros.
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
    if not num_top:
        return token, chosen, token[:, None][:, :0], logp[:, :0]
    top_lp, top_ids = jax.lax.cond(
        jnp.any(rows.top > 0),
        lambda: tuple(jax.lax.top_k(logp, num_top)),
        lambda: (
            jnp.zeros((logp.shape[0], num_top), logp.dtype),
            jnp.zeros((logp.shape[0], num_top), jnp.int32),
        ),
    )
    return token, chosen, top_ids.astype(jnp.int32), top_lp


class Programs(NamedTuple):
    """The engine's compiled programs for one model structure (see `programs`)."""

    decode: Callable
    decode_many: Callable | None
    mixed: Callable


def programs(treedef: Any, backend: str, num_top: int, steps: int = 1) -> Programs:
    """The compiled programs of models with pytree structure `treedef` (which holds every
    static field: the config, axes, ...). The model travels as its flat list of arrays, the
    cheapest argument to pass per call; cached, so engines of one structure share programs
    (whatever their `steps`: only `decode_many` depends on it).

    * `decode(leaves, pools, tokens, positions, valid, table, rows, remaining)`: one token
      per slot (`[slots]` arrays): write, attend, sample; outputs over `[1, slots, ...]`.
      `decode_many` (`steps > 1`, else None): `steps` such steps in one call, each slot's
      sampled token fed back, row `s` active for its first `remaining[s]` steps; outputs
      over `[steps, slots, ...]`.
    * `mixed(leaves, pools, tokens, positions, valid, table, chunk_table, chunk_seg, last,
      pick, rows, copy_src, copy_dst)`: a decoding step of `D = table.shape[0]` rows and a
      prompt chunk of `C` tokens from up to `K` prompts in one pass (`[D + C]` arrays; the
      prompts' pages in `chunk_table[K, pages]`, each token's prompt in `chunk_seg`; see
      `paged_hidden`). Logits are computed for the `D` decoding rows and the chunk tokens at
      `last[K]` only (each prompt's last token in the chunk); sampling row `s` draws from
      logits row `pick[s]` (`D + k` is prompt `k`'s token: a prompt's `n` samples draw their
      first tokens from it). Page `copy_src[i]` is copied to `copy_dst[i]` in every layer
      (copy-on-write of a shared prompt's partial last page; `NULL_PAGE` for none). Outputs
      over `[rows]`.
    """
    decode = _jitted("decode", treedef, backend, num_top, 1)
    many = _jitted("decode", treedef, backend, num_top, steps) if steps > 1 else None
    return Programs(decode, many, _jitted("mixed", treedef, backend, num_top, 1))


@functools.cache
def _jitted(kind: str, treedef: Any, backend: str, num_top: int, steps: int) -> Callable:
    """One compiled program of `programs` (`kind`: "decode" or "mixed")."""

    def decode(leaves, pools, tokens, positions, valid, table, rows, remaining):
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

    def mixed(
        leaves, pools, tokens, positions, valid, table, chunk_table, chunk_seg, last, pick, rows,
        copy_src, copy_dst,
    ):  # fmt: skip
        model = jax.tree.unflatten(treedef, leaves)
        d = table.shape[0]
        hidden, pools = paged_hidden(
            model,
            pools,
            tokens[:, None],
            positions[:, None],
            valid[:, None],
            table,
            backend,
            chunk_table,
            chunk_seg,
            (copy_src, copy_dst),
        )
        h = hidden.rearrange((BATCH, POSITION, EMBED))
        arr = h.array[:, 0]
        sel = jnp.concatenate([arr[:d], arr[d + last]])
        row = hax.named(sel[:, None], (h.axes[0].resize(sel.shape[0]), h.axes[1], h.axes[2]))
        logits = model._project(row).rearrange((BATCH, POSITION, VOCAB)).array[:, 0]
        out = sample_batch(logits[pick], SamplingRows(*rows), num_top)
        return pools, out

    if kind == "decode":
        return jax.jit(decode, donate_argnums=1)
    return jax.jit(mixed, donate_argnums=1)
