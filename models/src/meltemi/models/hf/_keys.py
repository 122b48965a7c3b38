"""Hugging Face tensor names and layouts of each family, and the model <-> state-dict conversion.

Each parameter is described once by a `Spec`: its HF key (with `{i}` for the layer and `{j}` for
the expert), where it lives in the model, and how its named axes flatten into PyTorch's
`[out, in]` matrix (or `[in, out]` for GPT-2's `Conv1D`). Export and import are both driven by
the same table, so they cannot disagree.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import meltemi.haliax as hax
import meltemi.haliax.nn as hnn
from meltemi.models._axes import (
    EMBED,
    EXPERTS,
    HEAD_SIZE,
    KV_HEADS,
    LAYERS,
    MAX_POSITION,
    MLP,
    Q_HEADS_PER_GROUP,
    VOCAB,
)
from meltemi.models._config import ModelConfig
from meltemi.models._transformer import Transformer

Q = (KV_HEADS, Q_HEADS_PER_GROUP, HEAD_SIZE)
KV = (KV_HEADS, HEAD_SIZE)
Getter = Callable[[Any], hax.NamedArray]


@dataclasses.dataclass(frozen=True)
class Spec:
    """One HF tensor.

    Attributes:
        hf: key template (`{i}` layer, `{j}` expert).
        get: the NamedArray in the model (for per-layer specs: in one `Block`).
        out: axis names flattened into the HF rows (or the whole vector).
        inn: axis names flattened into the HF columns (empty for vectors).
        layer: one tensor per layer.
        expert: one tensor per expert (the `experts` axis is split off).
        conv1d: HF stores `[in, out]` (GPT-2).
        parts: for fused HF tensors (GPT-2's `c_attn`): `(getter, out)` pieces concatenated
            along the HF out dimension; `get`/`out` are then unused.
        identity: value that makes the parameter a no-op (norm weights), used to initialise
            it when a warm start's checkpoint lacks it; `None` if there is no such value.
    """

    hf: str
    get: Getter | None
    out: tuple[str, ...] = ()
    inn: tuple[str, ...] = ()
    layer: bool = False
    expert: bool = False
    conv1d: bool = False
    parts: tuple[tuple[Getter, tuple[str, ...]], ...] = ()
    identity: float | None = None

    def pieces(self) -> tuple[tuple[Getter, tuple[str, ...]], ...]:
        return self.parts or ((self.get, self.out),)  # type: ignore[return-value]


def _norm_specs(prefix: str, get: Getter, config: ModelConfig, *, layer: bool) -> list[Spec]:
    identity = 0.0 if config.norm_kind == "rms_one_plus" else 1.0
    specs = [
        Spec(prefix + ".weight", lambda m: get(m).weight, (EMBED,), layer=layer, identity=identity)
    ]
    if config.norm_kind == "layer":
        specs.append(
            Spec(prefix + ".bias", lambda m: get(m).bias, (EMBED,), layer=layer, identity=0.0)
        )
    return specs


def _llama_like(config: ModelConfig) -> list[Spec]:
    L = "model.layers.{i}."  # noqa: N806
    specs = [Spec("model.embed_tokens.weight", lambda m: m.embed.weight, (VOCAB,), (EMBED,))]
    specs += _norm_specs("model.norm", lambda m: m.final_norm, config, layer=False)
    if not config.tie_embeddings:
        specs.append(Spec("lm_head.weight", lambda m: m.lm_head.weight, (VOCAB,), (EMBED,)))
    if not config.pre_norms:
        # OLMo 2 normalises only the outputs of attention and MLP (HF's names say "post").
        specs += _norm_specs(
            L + "post_attention_layernorm", lambda b: b.post_attn_norm, config, layer=True
        )
        specs += _norm_specs(
            L + "post_feedforward_layernorm", lambda b: b.post_mlp_norm, config, layer=True
        )
    elif config.post_norms:  # Gemma 2/3: pre- and post-norms around attention and the MLP
        for name, get in (
            ("input_layernorm", lambda b: b.attn_norm),
            ("post_attention_layernorm", lambda b: b.post_attn_norm),
            ("pre_feedforward_layernorm", lambda b: b.mlp_norm),
            ("post_feedforward_layernorm", lambda b: b.post_mlp_norm),
        ):
            specs += _norm_specs(L + name, get, config, layer=True)
    else:
        specs += _norm_specs(L + "input_layernorm", lambda b: b.attn_norm, config, layer=True)
        specs += _norm_specs(
            L + "post_attention_layernorm", lambda b: b.mlp_norm, config, layer=True
        )
    a = L + "self_attn."
    specs += [
        Spec(a + "q_proj.weight", lambda b: b.attn.q_proj.weight, Q, (EMBED,), layer=True),
        Spec(a + "k_proj.weight", lambda b: b.attn.k_proj.weight, KV, (EMBED,), layer=True),
        Spec(a + "v_proj.weight", lambda b: b.attn.v_proj.weight, KV, (EMBED,), layer=True),
        Spec(a + "o_proj.weight", lambda b: b.attn.o_proj.weight, (EMBED,), Q, layer=True),
    ]
    if config.qkv_bias:  # Qwen2
        specs += [
            Spec(a + "q_proj.bias", lambda b: b.attn.q_proj.bias, Q, layer=True),
            Spec(a + "k_proj.bias", lambda b: b.attn.k_proj.bias, KV, layer=True),
            Spec(a + "v_proj.bias", lambda b: b.attn.v_proj.bias, KV, layer=True),
        ]
    if config.qk_norm and config.qk_norm_whole:  # OLMo 2: over all heads of the projection
        specs += [
            Spec(a + "q_norm.weight", lambda b: b.attn.q_norm.weight, Q, layer=True, identity=1.0),
            Spec(a + "k_norm.weight", lambda b: b.attn.k_norm.weight, KV, layer=True, identity=1.0),
        ]
    elif config.qk_norm:
        qk_identity = 0.0 if config.norm_kind == "rms_one_plus" else 1.0  # Gemma 3: (1 + w)
        specs += [
            Spec(
                a + "q_norm.weight",
                lambda b: b.attn.q_norm.weight,
                (HEAD_SIZE,),
                layer=True,
                identity=qk_identity,
            ),
            Spec(
                a + "k_norm.weight",
                lambda b: b.attn.k_norm.weight,
                (HEAD_SIZE,),
                layer=True,
                identity=qk_identity,
            ),
        ]
    if config.moe is None:
        specs += [
            Spec(
                L + "mlp.gate_proj.weight",
                lambda b: b.mlp.gate_proj.weight,
                (MLP,),
                (EMBED,),
                layer=True,
            ),
            Spec(
                L + "mlp.up_proj.weight",
                lambda b: b.mlp.up_proj.weight,
                (MLP,),
                (EMBED,),
                layer=True,
            ),
            Spec(
                L + "mlp.down_proj.weight",
                lambda b: b.mlp.down_proj.weight,
                (EMBED,),
                (MLP,),
                layer=True,
            ),
        ]
        return specs
    if config.facts.moe == "mixtral":
        moe, names = L + "block_sparse_moe.", ("w1", "w3", "w2")
        e = moe + "experts.{j}.{name}.weight"
    else:
        moe, names = L + "mlp.", ("gate_proj", "up_proj", "down_proj")
        e = moe + "experts.{j}.{name}.weight"
    gate, up, down = (e.replace("{name}", n) for n in names)
    return specs + [
        Spec(moe + "gate.weight", lambda b: b.mlp.router.weight, (EXPERTS,), (EMBED,), layer=True),
        Spec(gate, lambda b: b.mlp.gate_proj, (MLP,), (EMBED,), layer=True, expert=True),
        Spec(up, lambda b: b.mlp.up_proj, (MLP,), (EMBED,), layer=True, expert=True),
        Spec(down, lambda b: b.mlp.down_proj, (EMBED,), (MLP,), layer=True, expert=True),
    ]


def _gpt2(config: ModelConfig) -> list[Spec]:
    T, H = "transformer.", "transformer.h.{i}."  # noqa: N806
    specs = [
        Spec(T + "wte.weight", lambda m: m.embed.weight, (VOCAB,), (EMBED,)),
        Spec(T + "wpe.weight", lambda m: m.pos_embed.weight, (MAX_POSITION,), (EMBED,)),
    ]
    specs += _norm_specs(T + "ln_f", lambda m: m.final_norm, config, layer=False)
    if not config.tie_embeddings:
        specs.append(Spec("lm_head.weight", lambda m: m.lm_head.weight, (VOCAB,), (EMBED,)))
    specs += _norm_specs(H + "ln_1", lambda b: b.attn_norm, config, layer=True)
    specs += _norm_specs(H + "ln_2", lambda b: b.mlp_norm, config, layer=True)
    qkv_w = (
        (lambda b: b.attn.q_proj.weight, Q),
        (lambda b: b.attn.k_proj.weight, KV),
        (lambda b: b.attn.v_proj.weight, KV),
    )
    qkv_b = (
        (lambda b: b.attn.q_proj.bias, Q),
        (lambda b: b.attn.k_proj.bias, KV),
        (lambda b: b.attn.v_proj.bias, KV),
    )
    c = dict(layer=True, conv1d=True)
    return specs + [
        Spec(H + "attn.c_attn.weight", None, inn=(EMBED,), parts=qkv_w, **c),
        Spec(H + "attn.c_attn.bias", None, parts=qkv_b, layer=True),
        Spec(H + "attn.c_proj.weight", lambda b: b.attn.o_proj.weight, (EMBED,), Q, **c),
        Spec(H + "attn.c_proj.bias", lambda b: b.attn.o_proj.bias, (EMBED,), layer=True),
        Spec(H + "mlp.c_fc.weight", lambda b: b.mlp.up_proj.weight, (MLP,), (EMBED,), **c),
        Spec(H + "mlp.c_fc.bias", lambda b: b.mlp.up_proj.bias, (MLP,), layer=True),
        Spec(H + "mlp.c_proj.weight", lambda b: b.mlp.down_proj.weight, (EMBED,), (MLP,), **c),
        Spec(H + "mlp.c_proj.bias", lambda b: b.mlp.down_proj.bias, (EMBED,), layer=True),
    ]


def specs_for(config: ModelConfig) -> list[Spec]:
    """Every HF tensor of the model `config` describes."""
    return _gpt2(config) if config.facts.hf_layout == "gpt2" else _llama_like(config)


def embedding_key(config: ModelConfig) -> str:
    """The HF name of the token embedding (what a tied `lm_head.weight` must equal)."""
    if config.facts.hf_layout == "gpt2":
        return "transformer.wte.weight"
    return "model.embed_tokens.weight"


def is_ignorable(key: str, config: ModelConfig) -> bool:
    """Non-parameter buffers some HF checkpoints carry (old GPT-2 causal masks, rotary
    frequencies): skipped on load, and reported."""
    if config.facts.hf_layout == "gpt2" and key.endswith((".attn.bias", ".attn.masked_bias")):
        return True
    return key.endswith("rotary_emb.inv_freq")


# -- stacked <-> unrolled -----------------------------------------------------------------------
def _to_stacked(model: Any) -> Any:
    blocks = model.blocks
    if hasattr(blocks, "stacked"):
        return model
    stacked = hnn.Stacked.from_layers(blocks.Block, blocks.blocks, blocks.gradient_checkpointing)
    return eqx.tree_at(lambda m: m.blocks, model, stacked)


def _to_unrolled(model: Any) -> Any:
    blocks = model.blocks
    seq = hnn.BlockSeq(blocks.unstacked(), blocks.Block, blocks.gradient_checkpointing)
    return eqx.tree_at(lambda m: m.blocks, model, seq)


def _is_abstract(model: Any) -> bool:
    return any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(model))


def as_stacked(model: Any) -> Any:
    """`model` with its blocks in `Stacked` form (works on `eval_shape`d models too)."""
    if hasattr(model.blocks, "stacked"):
        return model
    if _is_abstract(model):
        return eqx.filter_eval_shape(_to_stacked, model)
    return _to_stacked(model)


# -- model -> HF ------------------------------------------------------------------------------
def _flatten(named: hax.NamedArray, lead: tuple[str, ...], out, inn) -> np.ndarray:
    names = [a.name for a in named.axes]
    order = lead + tuple(out) + tuple(inn)
    # numpy, not jax: a device transpose would compile once per distinct shape.
    arr = np.transpose(np.asarray(jax.device_get(named.array)), [names.index(n) for n in order])
    sizes = named.shape
    shape = tuple(sizes[n] for n in lead) + (math.prod(sizes[n] for n in out),)
    if inn:
        shape += (math.prod(sizes[n] for n in inn),)
    return arr.reshape(shape)


def _lead(spec: Spec) -> tuple[str, ...]:
    return tuple(n for n, on in ((LAYERS, spec.layer), (EXPERTS, spec.expert)) if on)


def _array(model: Any, spec: Spec, get: Getter) -> hax.NamedArray:
    return get(model.blocks.stacked) if spec.layer else get(model)


def to_state_dict(model: Any, dtype: Any = None) -> dict[str, np.ndarray]:
    """The HF state dict (name -> numpy array, HF layout) of `model`."""
    config: ModelConfig = model.config
    model = as_stacked(model)
    out: dict[str, np.ndarray] = {}
    for spec in specs_for(config):
        lead = _lead(spec)
        pieces = [_flatten(_array(model, spec, g), lead, o, spec.inn) for g, o in spec.pieces()]
        full = np.concatenate(pieces, axis=len(lead)) if len(pieces) > 1 else pieces[0]
        if spec.conv1d:
            full = np.swapaxes(full, -1, -2)
        if dtype is not None:
            full = full.astype(dtype)
        for key, index in _expand(spec, config):
            out[key] = np.ascontiguousarray(full[index])
    return out


def _expand(spec: Spec, config: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    layers = range(config.num_layers) if spec.layer else [None]
    experts = range(config.moe.num_experts) if spec.expert and config.moe else [None]
    keys = []
    for i in layers:
        for j in experts:
            index = tuple(x for x in (i, j) if x is not None)
            keys.append((spec.hf.format(i=i, j=j), index))
    return keys


def expected_keys(config: ModelConfig) -> list[str]:
    """Every HF key of the model `config` describes, in spec order."""
    return [key for spec in specs_for(config) for key, _ in _expand(spec, config)]


def state_dict_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Shape of every HF tensor of the model `config` describes (nothing is allocated)."""
    model = as_stacked(eqx.filter_eval_shape(Transformer.init, config, key=jax.random.key(0)))
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs_for(config):
        t = [_array(model, spec, g).shape for g, _ in spec.pieces()]
        rows = sum(math.prod(sizes[n] for n in out) for sizes, (_, out) in zip(t, spec.pieces()))
        shape = (rows, math.prod(t[0][n] for n in spec.inn)) if spec.inn else (rows,)
        if spec.conv1d:
            shape = shape[::-1]
        for key, _ in _expand(spec, config):
            shapes[key] = shape
    return shapes


# -- HF -> model ------------------------------------------------------------------------------
class ShapeError(ValueError):
    """A checkpoint tensor's shape does not match the config."""


ShapeError.__module__ = "meltemi.models"


def _unflatten(
    arr: np.ndarray, template: hax.NamedArray, names: tuple[str, ...], dtype: Any
) -> hax.NamedArray:
    sizes = template.shape
    arr = arr.reshape(tuple(sizes[n] for n in names))
    data = np.transpose(arr, [names.index(a.name) for a in template.axes])
    return hax.NamedArray(jnp.asarray(data, dtype=dtype or data.dtype), template.axes)


def _gather(spec: Spec, keys, tensors: Mapping[str, np.ndarray], config: ModelConfig) -> np.ndarray:
    arrays = [np.asarray(tensors[k]) for k, _ in keys]
    first = arrays[0].shape
    for (k, _), a in zip(keys, arrays, strict=True):
        if a.shape != first:
            raise ShapeError(f"{k}: shape {a.shape} differs from {keys[0][0]}'s {first}")
    if not (spec.layer or spec.expert):
        return arrays[0]
    lead = tuple(config.num_layers if n == LAYERS else config.moe.num_experts for n in _lead(spec))
    return np.stack(arrays).reshape(lead + first)


def from_state_dict(
    template: Any,
    tensors: Mapping[str, np.ndarray],
    *,
    dtype: Any = None,
    init_missing_norms: bool = False,
) -> tuple[Any, list[str], dict[str, str], list[str]]:
    """Fills `template` (a model, possibly `eval_shape`d) from an HF state dict.

    Returns `(model, loaded keys, initialised keys -> value, missing keys)`. A spec is missing
    when any of its keys is absent; it is then set to its identity value if
    `init_missing_norms` and it has one, else left as in `template`.
    """
    config: ModelConfig = template.config
    unrolled = not hasattr(template.blocks, "stacked")
    model = as_stacked(template)
    where: list[Callable[[Any], Any]] = []
    values: list[hax.NamedArray] = []
    loaded: list[str] = []
    initialised: dict[str, str] = {}
    missing: list[str] = []
    for spec in specs_for(config):
        keys = _expand(spec, config)
        lead = _lead(spec)
        absent = [k for k, _ in keys if k not in tensors]
        if absent and not (init_missing_norms and spec.identity is not None):
            missing += absent
            continue
        if absent:
            for get, _ in spec.pieces():
                t = _array(model, spec, get)
                values.append(
                    hax.NamedArray(jnp.full(t.array.shape, spec.identity, dtype or t.dtype), t.axes)
                )
                where.append(_where(spec, get))
            initialised.update({k: f"{spec.identity:g}" for k, _ in keys})
            continue
        full = _gather(spec, keys, tensors, config)
        if spec.conv1d:
            full = np.swapaxes(full, -1, -2)
        offset = 0
        rows = full.shape[len(lead)] if full.ndim > len(lead) else 0
        for get, axes_out in spec.pieces():
            t = _array(model, spec, get)
            width = math.prod(t.shape[n] for n in axes_out)
            expect = tuple(t.shape[n] for n in lead) + (width,)
            if spec.inn:
                expect += (math.prod(t.shape[n] for n in spec.inn),)
            piece = full[(slice(None),) * len(lead) + (slice(offset, offset + width),)]
            if piece.shape != expect or offset + width > rows:
                raise ShapeError(
                    f"{spec.hf}: checkpoint tensor of shape {full.shape[len(lead) :]} does not fit "
                    f"the config's axes {axes_out + spec.inn} = {expect[len(lead) :]}; does "
                    "config.json match the weights?"
                )
            values.append(_unflatten(piece, t, lead + axes_out + spec.inn, dtype))
            where.append(_where(spec, get))
            offset += width
        if offset != rows:
            raise ShapeError(
                f"{spec.hf}: checkpoint has {rows} rows, the config needs {offset}; does "
                "config.json match the weights?"
            )
        loaded += [k for k, _ in keys]
    if where:
        model = eqx.tree_at(lambda m: [w(m) for w in where], model, values)
    if unrolled:
        model = _to_unrolled(model)
    return model, loaded, initialised, missing


def _where(spec: Spec, get: Getter) -> Callable[[Any], Any]:
    if spec.layer:
        return lambda m: get(m.blocks.stacked)
    return lambda m: get(m)
