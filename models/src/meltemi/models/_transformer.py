"""`Transformer`: the one decoder-only LM behind every family (Llama, Qwen3, MoE, GPT-2, Gemma)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import meltemi.haliax as hax
import meltemi.haliax.nn as hnn
from meltemi.models._axes import (
    BATCH,
    EMBED,
    HEAD_SIZE,
    KEY_POSITION,
    KV_HEADS,
    LAYERS,
    POSITION,
    VOCAB,
    ModelAxes,
)
from meltemi.models._config import ConfigError, ModelConfig
from meltemi.models._context_parallel import balance, sequence_split, unbalance
from meltemi.models._layers import (
    AttentionOptions,
    DenseMlp,
    LayerCache,
    MaskSpec,
    attend,
    constrain,
    make_attention,
    make_norm,
)
from meltemi.models._loss import blockwise_cross_entropy
from meltemi.models.moe import MoeMlp
from meltemi.models.moe import _kernels as moe_kernels

Tokens = hax.NamedArray | jax.Array | np.ndarray


class Block(eqx.Module):
    """Transformer block: `x + post(attn(pre(x)))`, then `x + post(mlp(pre(x)))`.

    The pre-norms (`attn_norm`, `mlp_norm`: every family but OLMo 2) and the post-norms
    (`post_attn_norm`, `post_mlp_norm`: Gemma 2/3 and OLMo 2) are `None` where a family has none.
    """

    attn_norm: Any
    attn: hnn.Attention
    mlp_norm: Any
    mlp: DenseMlp | MoeMlp
    attn_options: AttentionOptions = AttentionOptions()
    post_attn_norm: Any = None
    post_mlp_norm: Any = None

    @staticmethod
    def init(config: ModelConfig, *, key: jax.Array) -> Block:
        ax = ModelAxes(config)
        ka, km = jax.random.split(key)
        mlp = MoeMlp.init(config, key=km) if config.is_moe else DenseMlp.init(config, key=km)
        pre = config.pre_norms
        post = config.post_norms
        return Block(
            make_norm(config, ax.Embed) if pre else None,
            make_attention(config, key=ka),
            make_norm(config, ax.Embed) if pre else None,
            mlp,
            AttentionOptions.of(config),
            post_attn_norm=make_norm(config, ax.Embed) if post else None,
            post_mlp_norm=make_norm(config, ax.Embed) if post else None,
        )

    def __call__(
        self,
        x: hax.NamedArray,
        mask: MaskSpec,
        positions: hax.NamedArray,
        token_mask: hax.NamedArray | None,
        cache: LayerCache | None,
        cache_index: hax.NamedArray | None,
        sliding: Any = True,
    ) -> tuple[hax.NamedArray, tuple[dict[str, jax.Array], LayerCache | None]]:
        # The residual stream is the scan's carry (what `save_carries` keeps per layer): pin
        # it to the mapping at both ends of the block so the saved carries are batch-sharded.
        x = constrain(x)
        h, new_cache = attend(
            self.attn,
            x if self.attn_norm is None else self.attn_norm(x),
            positions=positions,
            mask=mask,
            cache=cache,
            cache_index=cache_index,
            options=self.attn_options,
            sliding=sliding.array if isinstance(sliding, hax.NamedArray) else sliding,
        )
        if self.post_attn_norm is not None:
            h = self.post_attn_norm(h)
        x = constrain(x + h)
        h = x if self.mlp_norm is None else self.mlp_norm(x)
        if isinstance(self.mlp, MoeMlp):
            h, stats = self.mlp(h, token_mask=token_mask)
        else:
            h, stats = self.mlp(h), {}
        if self.post_mlp_norm is not None:
            h = self.post_mlp_norm(h)
        return constrain(x + h), (stats, new_cache)


def as_tokens(tokens: Tokens, what: str = "tokens") -> tuple[hax.NamedArray, bool]:
    """`tokens` as a NamedArray over `(batch, position)`; also whether a batch axis was added.

    A plain integer array of shape `(batch, seq)` or `(seq,)` is named in that order.
    """
    if isinstance(tokens, hax.NamedArray):
        names = {a.name for a in tokens.axes}
        if POSITION not in names or not names <= {BATCH, POSITION}:
            raise ConfigError(
                f"{what} must have axes ('batch', 'position') or ('position',), got "
                f"{[a.name for a in tokens.axes]}; rename them, e.g. "
                "x.rename({'seq': 'position'})"
            )
        if BATCH not in names:
            return tokens.broadcast_axis(hax.Axis(BATCH, 1)).rearrange((BATCH, POSITION)), True
        return tokens.rearrange((BATCH, POSITION)), False
    arr = jnp.asarray(tokens)
    if arr.ndim == 1:
        return hax.named(arr[None], (hax.Axis(BATCH, 1), hax.Axis(POSITION, arr.shape[0]))), True
    if arr.ndim != 2:
        raise ConfigError(
            f"{what} must be a (batch, seq) or (seq,) integer array, got shape {arr.shape}"
        )
    return hax.named(arr, (hax.Axis(BATCH, arr.shape[0]), hax.Axis(POSITION, arr.shape[1]))), False


def positions_in_segments(segment_ids: hax.NamedArray) -> hax.NamedArray:
    """Position of each token within its (contiguous) segment: restarts at 0 at each new id.

    >>> import meltemi.haliax as hax
    >>> seg = hax.named([[0, 0, 1, 1, 1, 2]], ("batch", "position"))
    >>> positions_in_segments(seg).array.tolist()
    [[0, 1, 0, 1, 2, 0]]
    """
    seg = segment_ids.rearrange((BATCH, POSITION)).array
    idx = jnp.arange(seg.shape[1], dtype=jnp.int32)
    start = jnp.concatenate([jnp.ones_like(seg[:, :1], bool), seg[:, 1:] != seg[:, :-1]], axis=1)
    last_start = jax.lax.cummax(jnp.where(start, idx, 0), axis=1)
    return hax.named(idx - last_start, segment_ids.rearrange((BATCH, POSITION)).axes)


class Transformer(eqx.Module):
    """A decoder-only language model over named axes (see `ModelConfig` for the families).

    Shapes only (`eval_shape` builds nothing); `init(config, key=key)` gives real weights:

    >>> import jax, numpy as np
    >>> import meltemi.models as mm
    >>> cfg = mm.get_preset("tiny-qwen3")
    >>> model = jax.eval_shape(lambda k: mm.Transformer.init(cfg, key=k), jax.random.key(0))
    >>> logits = jax.eval_shape(lambda m, t: m(t), model, np.zeros((3, 7), np.int32))
    >>> [(a.name, a.size) for a in logits.axes]
    [('batch', 3), ('position', 7), ('vocab', 67)]
    """

    embed: hnn.Embedding
    pos_embed: hnn.Embedding | None
    blocks: hnn.Stacked | hnn.BlockSeq
    final_norm: Any
    lm_head: hnn.Linear | None
    config: ModelConfig = eqx.field(static=True)

    @staticmethod
    def init(config: ModelConfig, *, key: jax.Array) -> Transformer:
        """Random initial weights: embeddings `N(0, initializer_range)`, matrices with
        std `1/sqrt(fan_in)`, norms at identity."""
        ax = ModelAxes(config)
        k_embed, k_pos, k_blocks, k_head = jax.random.split(key, 4)
        std = config.initializer_range
        embed = hnn.Embedding.init(ax.Vocab, ax.Embed, key=k_embed, initializer_range=std)
        pos_embed = None
        if not config.uses_rope:
            pos_embed = hnn.Embedding.init(
                ax.MaxPosition, ax.Embed, key=k_pos, initializer_range=std
            )
        stack = hnn.Stacked if config.scan_layers else hnn.BlockSeq
        blocks = stack.init(ax.Layers, Block, gradient_checkpointing=config.remat)(
            config, key=jax.random.split(k_blocks, config.num_layers)
        )
        lm_head = None
        if not config.tie_embeddings:
            lm_head = hnn.Linear.init(ax.Embed, ax.Vocab, key=k_head, use_bias=False)
        return Transformer(embed, pos_embed, blocks, make_norm(config, ax.Embed), lm_head, config)

    @property
    def param_count(self) -> int:
        """Number of parameters (also works on a `jax.eval_shape`d model)."""
        return int(sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(self)))

    # -- forward ------------------------------------------------------------------------------
    def _embed(self, tokens: hax.NamedArray, positions: hax.NamedArray) -> hax.NamedArray:
        x = self.embed.embed(tokens)
        if self.config.scale_embeddings:
            x = x * jnp.asarray(math.sqrt(self.config.hidden_dim), x.dtype)
        if self.pos_embed is not None:
            x = x + self.pos_embed.embed(positions)
        return constrain(x)

    def _sliding(self, layer: int | None = None) -> Any:
        """Whether the sliding window applies: a bool when every layer agrees, else a flag per
        layer (a NamedArray over `layers`, sliced by the layer scan), or layer `layer`'s."""
        flags = self.config.sliding_layers
        if all(flags) or not any(flags):
            return bool(flags[0])
        if layer is not None:
            return flags[layer]
        return hax.named(jnp.asarray(flags), (ModelAxes(self.config).Layers,))

    def _run_blocks(
        self,
        x: hax.NamedArray,
        mask: MaskSpec,
        positions: hax.NamedArray,
        token_mask: hax.NamedArray | None = None,
        cache: LayerCache | None = None,
        cache_index: hax.NamedArray | None = None,
    ) -> tuple[hax.NamedArray, dict[str, jax.Array], LayerCache | None]:
        x, (stats, new_cache) = self.blocks.scan(
            x, mask, positions, token_mask, cache, cache_index, self._sliding()
        )
        return self.final_norm(x), stats, new_cache

    def _project(self, hidden: hax.NamedArray) -> hax.NamedArray:
        if self.lm_head is None:
            logits = self.embed.unembed(hidden)
        else:
            logits = self.lm_head(hidden)
        cap = self.config.final_logit_softcap
        if cap is not None:  # Gemma 2: cap * tanh(logits / cap)
            logits = hax.named(jnp.tanh(logits.array / cap) * cap, logits.axes)
        return constrain(logits)

    def _hidden(
        self,
        tokens: hax.NamedArray,
        segment_ids: Tokens | None,
        positions: Tokens | None,
        split: int = 1,
    ) -> tuple[hax.NamedArray, dict[str, jax.Array]]:
        """Final hidden states; with `split > 1` (the sequence split over that many devices)
        in load-balanced slot order (`_context_parallel.balance`)."""
        Pos = tokens.resolve_axis(POSITION)  # noqa: N806
        seg = None
        if segment_ids is not None:
            seg = as_tokens(segment_ids, "segment_ids")[0].broadcast_to(tokens.axes)
        mask = MaskSpec.self_attention(Pos, seg)
        if positions is not None:
            pos = as_tokens(positions, "positions")[0].broadcast_to(tokens.axes)
        elif seg is not None:
            pos = positions_in_segments(seg)
        else:
            pos = hax.arange(Pos)
        if split > 1:
            # Positions (global, or per document) are computed in the natural order above;
            # the mask compares the global slot of each query and key.
            tokens, pos = balance(tokens, split), balance(pos, split)
            seg = None if seg is None else balance(seg, split)
            order = balance(hax.arange(Pos), split)
            kv_seg = None if seg is None else seg.rename({POSITION: KEY_POSITION})
            mask = MaskSpec(order, order.rename({POSITION: KEY_POSITION}), seg, kv_seg, None, False)
        if self.config.sequence_parallel != "none":
            mask = dataclasses.replace(mask, sequence_parallel=self.config.sequence_parallel)
        x = self._embed(tokens, pos)
        token_mask = None if seg is None else seg >= 0
        hidden, stats, _ = self._run_blocks(x, mask, pos, token_mask)
        return hidden, stats

    def __call__(
        self,
        tokens: Tokens,
        *,
        segment_ids: Tokens | None = None,
        positions: Tokens | None = None,
        key: jax.Array | None = None,
    ) -> hax.NamedArray:
        """Next-token logits over `(batch, position, vocab)`.

        Args:
            tokens: integer ids, a NamedArray over `(batch, position)` or a plain `(batch, seq)`
                array (a 1-D input gives logits without the batch axis).
            segment_ids: same shape; tokens attend only within their segment (packed
                sequences) and positions restart at each new segment.
            positions: explicit position ids (default: `arange` or per segment).
            key: unused (no dropout); accepted for the trainer's uniform call signature.
        """
        del key
        named, added = as_tokens(tokens)
        split = sequence_split(self.config.sequence_parallel, named.axis_size(POSITION))
        hidden, _ = self._hidden(named, segment_ids, positions, split)
        logits = self._project(unbalance(hidden, split))
        return logits[{BATCH: 0}] if added else logits

    # -- loss ---------------------------------------------------------------------------------
    def loss_and_metrics(
        self,
        tokens: Tokens,
        targets: Tokens | None = None,
        *,
        loss_mask: Tokens | None = None,
        segment_ids: Tokens | None = None,
        positions: Tokens | None = None,
        z_loss: float = 0.0,
        key: jax.Array | None = None,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Mean next-token cross-entropy plus the optional z-loss and the MoE auxiliary losses.

        Without `targets`, position `t` predicts `tokens[t + 1]`: the last position and (with
        `segment_ids`) the last token of each segment are masked out. `loss_mask` (1 = count)
        is multiplied in. Returns the scalar loss and a dict with `cross_entropy`, `z_loss`,
        and for MoE models `load_balancing`, `router_z` and `dropped_fraction`.
        """
        del key
        named, _ = as_tokens(tokens)
        Pos = named.resolve_axis(POSITION)  # noqa: N806
        if targets is None:
            tgt = hax.roll(named, -1, POSITION)
            mask = (hax.arange(Pos) < Pos.size - 1).broadcast_to(named.axes)
            if segment_ids is not None:
                seg = as_tokens(segment_ids, "segment_ids")[0]
                mask = mask & (seg == hax.roll(seg, -1, POSITION)) & (seg >= 0)
        else:
            tgt = as_tokens(targets, "targets")[0]
            mask = hax.ones(named.axes, dtype=bool)
        weight = mask.astype(jnp.float32)
        if loss_mask is not None:
            weight = weight * as_tokens(loss_mask, "loss_mask")[0].astype(jnp.float32)
        split = sequence_split(self.config.sequence_parallel, Pos.size)
        hidden, stats = self._hidden(named, segment_ids, positions, split)
        # The loss is a sum over tokens: targets and weights follow the hidden states' order.
        tgt, weight = balance(tgt, split), balance(weight, split)
        denom = jnp.maximum(hax.sum(weight).array, 1.0)
        if self.config.blockwise_loss:
            ce_sum, z_sum = self._blockwise_loss(hidden, tgt, weight)
            ce, zl = ce_sum / denom, z_sum / denom
        else:
            logits = self._project(hidden).astype(jnp.float32)
            per_token, log_z = hnn.cross_entropy_loss_and_log_normalizers(logits, VOCAB, tgt)
            ce = hax.sum(per_token * weight).array / denom
            zl = hax.sum(log_z * log_z * weight).array / denom
        total = ce + z_loss * zl
        metrics = {"cross_entropy": ce, "z_loss": zl}
        moe = self.config.moe
        if moe is not None:
            lb = moe_kernels.load_balancing_loss(
                stats["expert_fraction"], stats["router_prob"], scope=moe.load_balancing_scope
            )
            rz = jnp.mean(stats["router_z"])
            total = total + moe.load_balancing_coef * lb + moe.router_z_coef * rz
            metrics.update(
                load_balancing=lb, router_z=rz, dropped_fraction=jnp.mean(stats["dropped"])
            )
        return total, metrics

    def _blockwise_loss(
        self, hidden: hax.NamedArray, targets: hax.NamedArray, weight: hax.NamedArray
    ) -> tuple[jax.Array, jax.Array]:
        head = self.embed.weight if self.lm_head is None else self.lm_head.weight
        order = (BATCH, POSITION)
        h = hidden.rearrange((*order, EMBED)).array
        return blockwise_cross_entropy(
            h.reshape(-1, h.shape[-1]),
            head.rearrange((VOCAB, EMBED)).array,
            targets.rearrange(order).array.reshape(-1),
            weight.rearrange(order).array.reshape(-1),
            block=self.config.loss_vocab_block,  # type: ignore[arg-type]
            softcap=self.config.final_logit_softcap,
        )

    def loss(
        self,
        tokens: Tokens,
        targets: Tokens | None = None,
        *,
        loss_mask: Tokens | None = None,
        segment_ids: Tokens | None = None,
        positions: Tokens | None = None,
        z_loss: float = 0.0,
        key: jax.Array | None = None,
    ) -> jax.Array:
        """The scalar training loss of `loss_and_metrics`.

        >>> import jax, numpy as np
        >>> import meltemi.models as mm
        >>> cfg = mm.get_preset("tiny-llama")
        >>> model = jax.eval_shape(lambda k: mm.Transformer.init(cfg, key=k), jax.random.key(0))
        >>> jax.eval_shape(lambda m, t: m.loss(t, z_loss=1e-4), model, np.ones((2, 7), int)).shape
        ()
        """
        return self.loss_and_metrics(
            tokens,
            targets,
            loss_mask=loss_mask,
            segment_ids=segment_ids,
            positions=positions,
            z_loss=z_loss,
            key=key,
        )[0]

    # -- cached decoding ----------------------------------------------------------------------
    def init_cache(
        self, batch: int, max_len: int, dtype: Any = None, *, per_layer: bool = False
    ) -> LayerCache | tuple[LayerCache, ...]:
        """An empty KV cache over `(layers, batch, kv_heads, key_position, head_size)`, or with
        `per_layer=True` a tuple of one `LayerCache` per layer (no `layers` axis).

        `key_position` sits next to `head_size` so attention reads each head's keys and values
        as stored, without a transpose per decoding step. A cache per layer is one buffer per
        layer, which a compiled decoding loop updates in place (`decode`).
        """
        ax = ModelAxes(self.config)
        dtype = dtype or self.embed.weight.dtype
        axes = (hax.Axis(BATCH, batch), ax.KVHeads, hax.Axis(KEY_POSITION, max_len), ax.HeadSize)
        assert axes[1].name == KV_HEADS and axes[3].name == HEAD_SIZE and ax.Layers.name == LAYERS
        if per_layer:
            return tuple(
                LayerCache(hax.zeros(axes, dtype), hax.zeros(axes, dtype))
                for _ in range(self.config.num_layers)
            )
        axes = (ax.Layers, *axes)
        return LayerCache(hax.zeros(axes, dtype), hax.zeros(axes, dtype))

    def decode(
        self,
        tokens: hax.NamedArray,
        cache: LayerCache | tuple[LayerCache, ...],
        *,
        positions: hax.NamedArray,
        cache_index: jax.Array,
        kv_valid: hax.NamedArray,
    ) -> tuple[hax.NamedArray, LayerCache | tuple[LayerCache, ...]]:
        """Runs `tokens` (`batch, position`) through the model, writing their keys and values
        at cache slots `cache_index ...` and attending to every valid slot at or before each
        query's own slot.

        Args:
            tokens: new tokens, `(batch, position)`.
            cache: the KV cache (`init_cache`). With a cache per layer
                (`per_layer=True`) the layers run unrolled, each writing its own buffer; with
                a stacked cache they run in the layer scan, which rebuilds the whole cache as
                its output (a copy per call: fine for a prefill, slow in a decoding loop).
            positions: position ids of the new tokens, `(batch, position)`.
            cache_index: scalar int, the slot of the first new token.
            kv_valid: `(batch, key_position)` bool, slots holding real tokens once these are
                written (left padding stays False).

        Returns:
            Logits over `(batch, position, vocab)` and the updated cache.
        """
        Pos = tokens.resolve_axis(POSITION)  # noqa: N806
        stacked = isinstance(cache, LayerCache)
        KPos = (cache if stacked else cache[0]).k.resolve_axis(KEY_POSITION)  # noqa: N806
        index = hax.named(jnp.asarray(cache_index, jnp.int32), ())
        mask = MaskSpec.cached(Pos, KPos, index.array, kv_valid)
        x = self._embed(tokens, positions)
        if stacked:
            hidden, _, new_cache = self._run_blocks(x, mask, positions, None, cache, index)
            assert new_cache is not None
            return self._project(hidden), new_cache
        new_caches = []
        for i, layer_cache in enumerate(cache):
            x, (_, layer_cache) = self.blocks.get_layer(i)(
                x, mask, positions, None, layer_cache, index, self._sliding(i)
            )
            new_caches.append(layer_cache)
        return self._project(self.final_norm(x)), tuple(new_caches)


def init(config: ModelConfig, *, key: jax.Array) -> Transformer:
    """`Transformer.init(config, key=key)` (jitted): a randomly initialised model of any family.

    >>> import jax
    >>> import meltemi.models as mm
    >>> cfg = mm.get_preset("tiny-mixtral")
    >>> shapes = jax.eval_shape(lambda k: mm.init(cfg, key=k), jax.random.key(0))
    >>> shapes.param_count == mm.param_count(cfg)
    True
    """
    return _jit_init(config, key=key)


# One compiled program instead of one per initialiser op (eager init of a scanned stack would
# compile every op separately).
_jit_init = eqx.filter_jit(Transformer.init)
