"""LoRA: low-rank adapters on chosen linear layers of a `Transformer`.

`apply(model, config, key=...)` replaces each targeted `hnn.Linear` (by module name:
`q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`, `up_proj`, `down_proj`; by group:
`attn`, `mlp`; or `"all-linear"`) with a `LoraLinear` computing
`base(x) + (alpha / rank) * B(A(dropout(x)))`. `A` (axes `lora_rank` + the layer's input axes)
starts uniform in `+-1/sqrt(fan_in)` as in PEFT, `B` (output axes + `lora_rank`) at zero, so
the wrapped model equals the base model until `B` is trained. Stacked layers get stacked
adapters (a leading `layers` axis), sliced by the same layer scan.

`merge` folds the adapters into the weights (a plain `Transformer`, e.g. for `hf.save`);
`save_peft` writes `adapter_config.json` + `adapter_model.safetensors` that `peft` loads onto
the `transformers` model of the base checkpoint. For training, `trainable_mask` marks the
adapter arrays, `freeze` stops gradients through everything else and `optimizer` wraps an
optax transform so it keeps state for, and updates, the adapters only.

>>> import jax
>>> import meltemi.models as mm
>>> from meltemi.models import lora
>>> cfg = mm.get_preset("tiny-llama")
>>> model = mm.init(cfg, key=jax.random.key(0))
>>> wrapped = lora.apply(model, lora.LoraConfig(rank=4), key=jax.random.key(1))
>>> type(wrapped.blocks.stacked.attn.q_proj).__name__
'LoraLinear'
>>> bool((wrapped(jax.numpy.arange(5)).array == model(jax.numpy.arange(5)).array).all())
True
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from safetensors.numpy import save_file

import meltemi.haliax as hax
import meltemi.haliax.nn as hnn
from meltemi.models._axes import LAYERS
from meltemi.models._config import ConfigError, ModelConfig
from meltemi.models._transformer import Transformer
from meltemi.models.hf import _keys as K

__all__ = [
    "ALL_LINEAR",
    "LORA_RANK",
    "TARGET_NAMES",
    "LoraConfig",
    "LoraLinear",
    "adapter_bytes",
    "apply",
    "freeze",
    "is_lora",
    "merge",
    "optimizer",
    "resolve_targets",
    "save_peft",
    "trainable_mask",
    "unmerge",
    "with_dropout_key",
]

#: The axis name of the adapters' rank.
LORA_RANK = "lora_rank"
ALL_LINEAR = "all-linear"
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
#: Module names a target may be (`attn` / `mlp` select a block's group).
TARGET_NAMES = _ATTN + _MLP
_GROUPS = {"attn": _ATTN, "mlp": _MLP}


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Which linear layers get adapters, and their shape.

    Attributes:
        rank: the adapters' rank `r` (0: LoRA off).
        alpha: the update is scaled by `alpha / rank` (PEFT's `lora_alpha`).
        dropout: dropout on the adapters' input while training (PEFT's `lora_dropout`).
        targets: module names (`q_proj`, ..., `down_proj`), groups (`attn`, `mlp`) or
            `"all-linear"` (every projection of attention and the dense MLP; never `lm_head`).
    """

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] | str = ("q_proj", "v_proj")

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise ConfigError(
                f"LoraConfig.rank={self.rank!r}: must be an int >= 0 (0 turns LoRA off), e.g. 8"
            )
        alpha = self.alpha
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not alpha > 0:
            raise ConfigError(f"LoraConfig.alpha={alpha!r}: must be a number > 0, e.g. 16.0")
        drop = self.dropout
        if isinstance(drop, bool) or not isinstance(drop, int | float) or not 0 <= drop < 1:
            raise ConfigError(f"LoraConfig.dropout={drop!r}: must be in [0, 1), e.g. 0.05")
        targets = self.targets
        if isinstance(targets, list):
            targets = tuple(targets)
            object.__setattr__(self, "targets", targets)
        if isinstance(targets, str) and targets != ALL_LINEAR:
            if targets not in TARGET_NAMES and targets not in _GROUPS:
                raise ConfigError(
                    f"LoraConfig.targets={targets!r}: a string must be {ALL_LINEAR!r} or one "
                    f"module from {TARGET_NAMES + tuple(_GROUPS)}; name several as a tuple, "
                    "e.g. ('q_proj', 'v_proj')"
                )
            targets = (targets,)
            object.__setattr__(self, "targets", targets)
        if targets == ALL_LINEAR:
            return
        if not isinstance(targets, tuple) or not targets:
            raise ConfigError(
                f"LoraConfig.targets={targets!r}: must be a non-empty tuple of module names "
                f"from {TARGET_NAMES + tuple(_GROUPS)} or {ALL_LINEAR!r}"
            )
        for name in targets:
            if name not in TARGET_NAMES and name not in _GROUPS:
                raise ConfigError(
                    f"LoraConfig.targets={targets!r}: unknown module {name!r}; choose from "
                    f"{TARGET_NAMES + tuple(_GROUPS)} or {ALL_LINEAR!r}"
                )

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        return float(self.alpha) / self.rank


def _available(config: ModelConfig) -> tuple[str, ...]:
    mlp = () if config.is_moe else (_MLP if config.gated_mlp else _MLP[1:])
    return _ATTN + mlp


def resolve_targets(config: ModelConfig, lora: LoraConfig) -> tuple[str, ...]:
    """The module names `lora.targets` selects in a model of `config`.

    Raises:
        ConfigError: a named module does not exist in this family (e.g. `gate_proj` in GPT-2,
            or any MLP projection of a mixture-of-experts model, whose experts are not
            linear layers).
    """
    available = _available(config)
    if lora.targets == ALL_LINEAR:
        return available
    names: list[str] = []
    for target in lora.targets:
        for name in _GROUPS.get(target, (target,)):
            if name not in available and target not in _GROUPS:
                kind = "mixture-of-experts" if config.is_moe else config.family
                raise ConfigError(
                    f"LoraConfig.targets={lora.targets!r}: a {kind} model has no {name!r} "
                    f"linear layer; its targets are {available} (or {ALL_LINEAR!r})"
                )
            if name in available and name not in names:
                names.append(name)
    if not names:
        raise ConfigError(
            f"LoraConfig.targets={lora.targets!r} selects no layer of a {config.family} model; "
            f"its targets are {available}"
        )
    return tuple(names)


def _tuple(spec: Any) -> tuple[hax.Axis, ...]:
    return tuple(spec) if isinstance(spec, tuple | list) else (spec,)


class LoraLinear(eqx.Module):
    """`base(x) + scale * B(A(dropout(x)))`: a frozen linear layer plus a low-rank update.

    Attributes:
        base: the wrapped `hnn.Linear`.
        lora_a: axes `(layers?, lora_rank, *In)`.
        lora_b: axes `(layers?, *Out, lora_rank)`.
        scale: `alpha / rank`.
        dropout: dropout rate on the adapter's input (applied only with `dropout_key`).
        dropout_key: raw PRNG key data (`with_dropout_key`), `None` outside training.
    """

    base: hnn.Linear
    lora_a: hax.NamedArray
    lora_b: hax.NamedArray
    scale: float = eqx.field(static=True)
    dropout: float = eqx.field(static=True, default=0.0)
    dropout_key: jax.Array | None = None

    @property
    def In(self) -> Any:  # noqa: N802
        return self.base.In

    @property
    def Out(self) -> Any:  # noqa: N802
        return self.base.Out

    def delta(self) -> hax.NamedArray:
        """`scale * B A` over the base weight's axes (the update `merge` adds)."""
        d = hax.dot(self.lora_b, self.lora_a, axis=LORA_RANK) * self.scale
        return d.rearrange(self.base.weight.axes).astype(self.base.weight.dtype)

    def __call__(self, x: hax.NamedArray, *, key: jax.Array | None = None) -> hax.NamedArray:
        out = self.base(x)
        h = x
        if self.dropout > 0 and self.dropout_key is not None:
            keep = jax.random.bernoulli(
                jax.random.wrap_key_data(self.dropout_key), 1 - self.dropout, x.array.shape
            )
            h = hax.named(jnp.where(keep, x.array / (1 - self.dropout), 0).astype(x.dtype), x.axes)
        a = self.lora_a.astype(x.dtype)
        b = self.lora_b.astype(x.dtype)
        low = h.dot(a, axis=self.base.In)
        return out + (low.dot(b, axis=LORA_RANK) * self.scale).astype(out.dtype)


def is_lora(model: Any) -> bool:
    """Whether `model` holds any `LoraLinear`."""
    leaves = jax.tree.leaves(model, is_leaf=lambda x: isinstance(x, LoraLinear))
    return any(isinstance(x, LoraLinear) for x in leaves)


def _name(path: Sequence[Any]) -> str | None:
    for k in reversed(path):
        if isinstance(k, jax.tree_util.GetAttrKey):
            return k.name
    return None


def _wrap(linear: hnn.Linear, lora: LoraConfig, key: jax.Array) -> LoraLinear:
    In, Out = _tuple(linear.In), _tuple(linear.Out)  # noqa: N806
    names = {a.name for a in In + Out}
    lead = tuple(a for a in linear.weight.axes if a.name not in names)
    Rank = hax.Axis(LORA_RANK, lora.rank)  # noqa: N806
    fan_in = math.prod(a.size for a in In)
    bound = 1.0 / math.sqrt(fan_in)  # PEFT: kaiming_uniform_(a=sqrt(5))
    dtype = linear.weight.dtype
    a = hax.random.uniform(key, lead + (Rank,) + In, minval=-bound, maxval=bound).astype(dtype)
    b = hax.zeros(lead + Out + (Rank,), dtype)
    return LoraLinear(linear, a, b, lora.scale, float(lora.dropout))


def apply(model: Transformer, lora: LoraConfig, *, key: jax.Array) -> Transformer:
    """`model` with adapters on the linear layers `lora.targets` names (see `LoraConfig`).

    The result computes exactly what `model` does until `B` changes (`B = 0`).

    Raises:
        ConfigError: LoRA is off (`rank=0`), the model already has adapters, or a target
            does not exist in this family.
    """
    if not lora.enabled:
        raise ConfigError("LoraConfig.rank=0: LoRA is off; set rank > 0, e.g. rank=8")
    if is_lora(model):
        raise ConfigError("lora.apply: the model already has adapters; merge(model) first")
    names = set(resolve_targets(model.config, lora))
    is_linear = lambda x: isinstance(x, hnn.Linear)  # noqa: E731
    found = [
        p
        for p, x in jax.tree_util.tree_flatten_with_path(model, is_leaf=is_linear)[0]
        if is_linear(x) and _name(p) in names and _in_block(p)
    ]
    keys = iter(jax.random.split(key, max(len(found), 1)))

    def wrap(path, x):
        if is_linear(x) and _name(path) in names and _in_block(path):
            return _wrap(x, lora, next(keys))
        return x

    return jax.tree_util.tree_map_with_path(wrap, model, is_leaf=is_linear)


def _in_block(path: Sequence[Any]) -> bool:
    return any(isinstance(k, jax.tree_util.GetAttrKey) and k.name == "blocks" for k in path)


def _is_lora_leaf(x: Any) -> bool:
    return isinstance(x, LoraLinear)


def merge(model: Transformer) -> Transformer:
    """A plain `Transformer` whose weights are `W + (alpha / rank) * B A` (for `hf.save`,
    generation without the extra matmuls, or another round of LoRA)."""

    def fold(x):
        if isinstance(x, LoraLinear):
            return dataclasses.replace(x.base, weight=x.base.weight + x.delta())
        return x

    return jax.tree.map(fold, model, is_leaf=_is_lora_leaf)


def unmerge(merged: Transformer, like: Transformer) -> Transformer:
    """The inverse of `merge`: `like`'s adapters on `merged`'s weights minus their update.

    Exact up to float rounding of `W + d - d`; keep the wrapped model to get the base weights
    bit for bit.
    """
    flat_like = jax.tree.leaves(like, is_leaf=_is_lora_leaf)
    adapters = iter([x for x in flat_like if isinstance(x, LoraLinear)])
    paths = {
        jax.tree_util.keystr(p)
        for p, x in jax.tree_util.tree_flatten_with_path(like, is_leaf=_is_lora_leaf)[0]
        if isinstance(x, LoraLinear)
    }
    is_linear = lambda x: isinstance(x, hnn.Linear)  # noqa: E731

    def split(path, x):
        if is_linear(x) and jax.tree_util.keystr(path) in paths:
            lo = next(adapters)
            base = dataclasses.replace(x, weight=x.weight - lo.delta())
            return dataclasses.replace(lo, base=base)
        return x

    return jax.tree_util.tree_map_with_path(split, merged, is_leaf=is_linear)


# -- training ---------------------------------------------------------------------------------
def trainable_mask(tree: Any) -> Any:
    """A bool per leaf of `tree` (a LoRA model or its `eqx.filter`ed params): True for adapter
    arrays (`lora_a`, `lora_b`)."""

    def is_adapter(path, _):
        return any(
            isinstance(k, jax.tree_util.GetAttrKey) and k.name in ("lora_a", "lora_b") for k in path
        )

    return jax.tree_util.tree_map_with_path(is_adapter, tree)


def freeze(model: Any) -> Any:
    """`model` with gradients stopped through every array but the adapters."""
    mask = trainable_mask(model)
    return jax.tree.map(
        lambda x, train: x if train or not eqx.is_inexact_array(x) else jax.lax.stop_gradient(x),
        model,
        mask,
    )


def optimizer(tx: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
    """`tx` on the adapters only: optimizer state exists for them alone and every other
    parameter's update is zero (the base weights stay bit-identical)."""
    frozen = lambda params: jax.tree.map(lambda t: not t, trainable_mask(params))  # noqa: E731
    return optax.chain(
        optax.masked(tx, trainable_mask),
        optax.masked(optax.set_to_zero(), frozen),
    )


def adapter_bytes(tree: Any) -> int:
    """Bytes of the adapter arrays of `tree` (works on `eval_shape`d trees)."""
    mask = trainable_mask(tree)
    return sum(
        math.prod(x.shape) * jnp.dtype(x.dtype).itemsize
        for x, train in zip(jax.tree.leaves(tree), jax.tree.leaves(mask), strict=True)
        if train
    )


def with_dropout_key(model: Any, key: jax.Array) -> Any:
    """`model` with a distinct dropout key in every `LoraLinear` (one per layer when stacked),
    so adapter dropout applies; without one, dropout is off (evaluation, export)."""
    counter = iter(range(1 << 30))

    def put(x):
        if not isinstance(x, LoraLinear) or x.dropout == 0:
            return x
        k = jax.random.fold_in(key, next(counter))
        lead = [a for a in x.lora_a.axes if a.name == LAYERS]
        if lead:
            data = jax.random.key_data(jax.random.split(k, lead[0].size))
        else:
            data = jax.random.key_data(k)
        return dataclasses.replace(x, dropout_key=data)

    return jax.tree.map(put, model, is_leaf=_is_lora_leaf)


# -- PEFT export ------------------------------------------------------------------------------
def _peft_specs(config: ModelConfig, names: Sequence[str]) -> dict[str, K.Spec]:
    if config.facts.hf_layout == "gpt2":
        raise ConfigError(
            "lora.save_peft: GPT-2 fuses q/k/v into one Conv1D (c_attn) that PEFT adapts as a "
            "whole; export the merged model instead (hf.save(lora.merge(model), ...), the "
            "trainer's --export_hf)"
        )
    by_name: dict[str, K.Spec] = {}
    for spec in K.specs_for(config):
        if spec.layer and not spec.expert and spec.hf.endswith(".weight"):
            module = spec.hf.rsplit(".", 2)[-2]
            if module in names:
                by_name[module] = spec
    return by_name


def peft_state_dict(model: Transformer, dtype: Any = None) -> dict[str, np.ndarray]:
    """The adapters under PEFT's names (`base_model.model.<module>.lora_A.weight`, shape
    `[r, in]`; `lora_B.weight`, `[out, r]`) in the base checkpoint's layouts."""
    stacked = K.as_stacked(model)
    block = stacked.blocks.stacked
    modules = {
        _name(p): x
        for p, x in jax.tree_util.tree_flatten_with_path(block, is_leaf=_is_lora_leaf)[0]
        if isinstance(x, LoraLinear)
    }
    specs = _peft_specs(model.config, list(modules))
    out: dict[str, np.ndarray] = {}
    lead = (LAYERS,)
    for name, module in modules.items():
        spec = specs[name]
        a = K._flatten(module.lora_a, lead, (LORA_RANK,), spec.inn)
        b = K._flatten(module.lora_b, lead, spec.out, (LORA_RANK,))
        for i in range(model.config.num_layers):
            prefix = "base_model.model." + spec.hf.format(i=i).removesuffix(".weight")
            for part, arr in (("lora_A", a[i]), ("lora_B", b[i])):
                arr = arr if dtype is None else arr.astype(dtype)
                out[f"{prefix}.{part}.weight"] = np.ascontiguousarray(arr)
    return out


def _lora_of(model: Transformer) -> tuple[int, float, float, tuple[str, ...]]:
    found = [
        (_name(p), x)
        for p, x in jax.tree_util.tree_flatten_with_path(
            K.as_stacked(model).blocks.stacked, is_leaf=_is_lora_leaf
        )[0]
        if isinstance(x, LoraLinear)
    ]
    if not found:
        raise ConfigError("lora.save_peft: the model has no adapters (use lora.apply first)")
    rank = found[0][1].lora_a.resolve_axis(LORA_RANK).size
    scale, dropout = found[0][1].scale, found[0][1].dropout
    return rank, scale * rank, dropout, tuple(n for n, _ in found)


def save_peft(
    model: Transformer,
    directory: str | os.PathLike,
    *,
    base_model_name_or_path: str | None = None,
    dtype: Any = None,
) -> list[str]:
    """Writes a PEFT LoRA adapter (`adapter_config.json`, `adapter_model.safetensors`).

    `peft.PeftModel.from_pretrained(base, directory)` loads it onto the `transformers` model
    of the base checkpoint (`hf.save(merge(model) ...)` writes the merged model instead).

    Args:
        model: a model with adapters (`apply`).
        directory: the output directory (created).
        base_model_name_or_path: recorded in the config (PEFT's pointer to the base model).
        dtype: tensor dtype (default: the adapters').

    Returns:
        The file names written.
    """
    rank, alpha, dropout, names = _lora_of(model)
    tensors = peft_state_dict(model, dtype)
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": dropout,
        "target_modules": sorted(names),
        "bias": "none",
        "fan_in_fan_out": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
        "base_model_name_or_path": base_model_name_or_path,
        "rank_pattern": {},
        "alpha_pattern": {},
    }
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    return ["adapter_config.json", "adapter_model.safetensors"]
