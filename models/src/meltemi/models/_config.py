"""Model configuration: one frozen dataclass for every decoder-only family.

A family is an architecture *recipe* (norm kind, position encoding, MLP kind, biases); the
config holds the sizes. Every field is validated at construction, so a bad value fails where
it was written, with the field, the value and the fix in the message.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from typing import Any, Literal

from meltemi.models._families import FAMILIES, FAMILY_FACTS, Family, FamilyFacts

ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "relu")
REMAT_POLICIES = ("none", "save_carries", "full", "offload")
MOE_DISPATCH = ("dropless", "capacity")
LOAD_BALANCING_SCOPES = ("all_layers", "per_layer")
EP_EXCHANGES = ("auto", "dense", "ragged")
ATTENTION_BACKENDS = ("auto", "xla", "dot_product_attention", "splash")
SEQUENCE_PARALLEL = ("none", "all_gather", "ring")
LAYER_TYPES = ("full_attention", "sliding_attention")


class ConfigError(ValueError):
    """A model config field holds an invalid value (the message names the field and the fix)."""


ConfigError.__module__ = "meltemi.models"


def _fail(cls: str, field: str, value: Any, why: str, fix: str) -> None:
    raise ConfigError(f"{cls}.{field}={value!r}: {why}. Fix: {fix}")


def _check_positive_ints(obj: Any, names: tuple[str, ...]) -> None:
    cls = type(obj).__name__
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            _fail(cls, name, value, "must be a positive int", f"{cls}(..., {name}=8)")


def _replace(obj: Any, **changes: Any) -> Any:
    names = {f.name for f in dataclasses.fields(obj)}
    for key in changes:
        if key not in names:
            close = difflib.get_close_matches(key, sorted(names), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{type(obj).__name__} has no field {key!r}.{hint} Fields: {sorted(names)}"
            )
    return dataclasses.replace(obj, **changes)


ROPE_SCALINGS = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding and its scaling (Hugging Face's `rope_parameters`).

    The formulas are `transformers`' (`modeling_rope_utils.py`); see `meltemi.models._rope`.

    Attributes:
        theta: base period of the rotation frequencies (`rope_theta`).
        scaling: `default`, `linear`, `dynamic`, `yarn`, `llama3` or `longrope` (`rope_type`).
            Setting `llama3_factor` implies `llama3`.
        llama3_factor: Llama 3 scaling factor; required by (and only used by) `llama3`.
        low_freq_factor: Llama 3 `low_freq_factor`.
        high_freq_factor: Llama 3 `high_freq_factor`.
        original_max_position: the pretraining context (`original_max_position_embeddings`)
            of `llama3`, `yarn`, `longrope`; for `dynamic`, the length past which the base
            grows (Hugging Face's `max_position_embeddings`).
        factor: the scaling factor of `linear`, `dynamic`, `yarn` and `longrope`.
        partial_rotary_factor: fraction of each head that is rotated (the rest passes).
        beta_fast: YaRN's extrapolation boundary (`beta_fast`).
        beta_slow: YaRN's interpolation boundary (`beta_slow`).
        mscale: YaRN `mscale` (with `mscale_all_dim`, sets the default attention factor).
        mscale_all_dim: YaRN `mscale_all_dim`.
        attention_factor: cos/sin scale of `yarn` / `longrope`; `None`: their default.
        truncate: YaRN rounds its correction range to whole dimensions (`truncate`).
        short_factor: LongRoPE per-frequency factors up to `original_max_position`.
        long_factor: LongRoPE per-frequency factors beyond it.

    >>> RopeConfig(theta=500_000.0, llama3_factor=8.0).is_llama3
    True
    >>> RopeConfig(scaling="yarn", factor=4.0, original_max_position=32).scaling
    'yarn'
    """

    theta: float = 10_000.0
    llama3_factor: float | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    scaling: str = "default"
    factor: float = 1.0
    partial_rotary_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if not self.theta > 0:
            _fail("RopeConfig", "theta", self.theta, "must be > 0", "RopeConfig(theta=10000.0)")
        if self.llama3_factor is not None and self.scaling == "default":
            object.__setattr__(self, "scaling", "llama3")
        if self.scaling not in ROPE_SCALINGS:
            close = difflib.get_close_matches(str(self.scaling), ROPE_SCALINGS, n=1)
            fix = f'scaling="{close[0]}"' if close else f"one of {ROPE_SCALINGS}"
            _fail("RopeConfig", "scaling", self.scaling, "unknown rope scaling", fix)
        for name in ("short_factor", "long_factor"):
            value = getattr(self, name)
            if isinstance(value, list):  # from JSON
                object.__setattr__(self, name, tuple(float(v) for v in value))
        if self.scaling == "llama3" and self.llama3_factor is None:
            _fail(
                "RopeConfig",
                "llama3_factor",
                None,
                'scaling="llama3" needs its factor',
                "RopeConfig(llama3_factor=8.0)",
            )
        if self.scaling != "llama3" and self.llama3_factor is not None:
            _fail(
                "RopeConfig",
                "llama3_factor",
                self.llama3_factor,
                f"only used by scaling='llama3', not {self.scaling!r}",
                "llama3_factor=None, or factor=... for the other scalings",
            )
        if self.llama3_factor is not None and not self.llama3_factor >= 1:
            _fail(
                "RopeConfig",
                "llama3_factor",
                self.llama3_factor,
                "must be >= 1 (or None for plain RoPE)",
                "RopeConfig(llama3_factor=8.0)",
            )
        if self.llama3_factor is not None and not self.high_freq_factor > self.low_freq_factor:
            _fail(
                "RopeConfig",
                "high_freq_factor",
                self.high_freq_factor,
                f"must exceed low_freq_factor={self.low_freq_factor}",
                "RopeConfig(low_freq_factor=1.0, high_freq_factor=4.0)",
            )
        if self.scaling in ("linear", "dynamic", "yarn") and not self.factor >= 1:
            _fail(
                "RopeConfig",
                "factor",
                self.factor,
                f"scaling={self.scaling!r} needs a factor >= 1",
                f'RopeConfig(scaling="{self.scaling}", factor=4.0)',
            )
        if not 0 < self.partial_rotary_factor <= 1:
            _fail(
                "RopeConfig",
                "partial_rotary_factor",
                self.partial_rotary_factor,
                "must be in (0, 1]",
                "partial_rotary_factor=1.0 (rotate whole heads)",
            )
        if not (isinstance(self.original_max_position, int) and self.original_max_position > 0):
            _fail(
                "RopeConfig",
                "original_max_position",
                self.original_max_position,
                "must be a positive int",
                "original_max_position=8192",
            )
        if self.scaling == "longrope" and (self.short_factor is None or self.long_factor is None):
            _fail(
                "RopeConfig",
                "short_factor" if self.short_factor is None else "long_factor",
                None,
                "scaling='longrope' needs short_factor and long_factor (one per frequency)",
                "RopeConfig(scaling='longrope', short_factor=(1.0, ...), long_factor=(2.0, ...))",
            )

    @property
    def is_llama3(self) -> bool:
        return self.llama3_factor is not None

    def replace(self, **changes: Any) -> RopeConfig:
        return _replace(self, **changes)

    def scaled(self, rope_scaling: Mapping[str, Any]) -> RopeConfig:
        """This rope (its theta and rotated fraction) with a Hugging Face `rope_scaling` dict.

        The keys are `transformers`' (`rope_type`, `factor`, `original_max_position_embeddings`,
        `low_freq_factor`, `high_freq_factor`, `beta_fast`, `beta_slow`, `attention_factor`,
        `mscale`, `mscale_all_dim`, `truncate`, `rope_theta`); what a type does not use is an
        error. `longrope` needs its per-frequency factors: set them on `RopeConfig` instead.

        >>> RopeConfig(theta=500_000.0).scaled({"rope_type": "yarn", "factor": 16.0,
        ...     "original_max_position_embeddings": 4096}).original_max_position
        4096
        """
        params = dict(rope_scaling)
        kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
        params.pop("type", None)
        if kind not in _SCALING_KEYS:
            close = difflib.get_close_matches(str(kind), list(_SCALING_KEYS), n=1)
            fix = f'"rope_type": "{close[0]}"' if close else f"one of {sorted(_SCALING_KEYS)}"
            _fail(
                "RopeConfig", "rope_scaling", dict(rope_scaling), f"unknown rope_type {kind!r}", fix
            )
        unknown = sorted(set(params) - set(_SCALING_KEYS[kind]) - {"rope_theta"})
        if unknown:
            _fail(
                "RopeConfig",
                "rope_scaling",
                dict(rope_scaling),
                f"rope_type {kind!r} does not use {unknown}",
                f"its keys are {list(_SCALING_KEYS[kind])}",
            )
        base = self.replace(
            theta=float(params.pop("rope_theta", self.theta)),
            scaling="default",
            llama3_factor=None,
        )
        old = int(params.pop("original_max_position_embeddings", base.original_max_position))
        if kind == "default":
            return base
        if "factor" not in params:
            _fail(
                "RopeConfig",
                "rope_scaling",
                dict(rope_scaling),
                f"rope_type {kind!r} needs its 'factor'",
                f'{{"rope_type": "{kind}", "factor": 8.0, ...}}',
            )
        if kind == "llama3":
            return base.replace(
                llama3_factor=float(params["factor"]),
                low_freq_factor=float(params.get("low_freq_factor", 1.0)),
                high_freq_factor=float(params.get("high_freq_factor", 4.0)),
                original_max_position=old,
            )
        changes: dict[str, Any] = {"scaling": kind, "factor": float(params["factor"])}
        if kind == "yarn":
            changes.update(
                original_max_position=old,
                beta_fast=float(params.get("beta_fast", 32.0)),
                beta_slow=float(params.get("beta_slow", 1.0)),
                mscale=params.get("mscale"),
                mscale_all_dim=params.get("mscale_all_dim"),
                attention_factor=params.get("attention_factor"),
                truncate=bool(params.get("truncate", True)),
            )
        return base.replace(**changes)


# rope_type -> the keys of a `rope_scaling` dict `RopeConfig.scaled` reads for it.
_SCALING_KEYS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": (
        "factor",
        "original_max_position_embeddings",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    ),
}


LLAMA3_ROPE = RopeConfig(theta=500_000.0, llama3_factor=8.0)


def sliding_layer_types(num_layers: int, pattern: int) -> tuple[str, ...]:
    """Hugging Face's default `layer_types`: every `pattern`-th layer is global, the others
    slide (Gemma 2: `pattern=2`, Gemma 3: `pattern=6`, i.e. 5 local : 1 global).

    >>> sliding_layer_types(4, 2)
    ('sliding_attention', 'full_attention', 'sliding_attention', 'full_attention')
    """
    return tuple(
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
        for i in range(num_layers)
    )


@dataclasses.dataclass(frozen=True)
class MoeConfig:
    """Mixture-of-experts settings (Mixtral, Qwen3-MoE).

    Attributes:
        num_experts: experts per layer (the `experts` axis).
        top_k: experts each token is routed to.
        expert_dim: hidden size of each expert's SwiGLU MLP.
        norm_topk_prob: renormalise the top-k router probabilities to sum to one (Mixtral: yes).
        dispatch: `"dropless"` (sort by expert + `jax.lax.ragged_dot`, no token is dropped) or
            `"capacity"` (fixed per-expert buffers of `capacity_factor * tokens * top_k /
            num_experts` slots per sequence; overflow tokens skip the MLP).
        capacity_factor: slack of the capacity path.
        load_balancing_coef: weight of the load-balancing loss in `loss()`.
        load_balancing_scope: `"all_layers"` (default; one loss over every layer's router
            statistics, as `transformers` computes it, so HF- and Meltemi-trained models
            optimise the same objective) or `"per_layer"` (the mean of per-layer losses).
        router_z_coef: weight of the router z-loss (mean squared logsumexp of router logits).
        ep_exchange: how expert parallelism moves tokens: `"dense"` (`all_to_all` of fixed
            slots), `"ragged"` (`ragged_all_to_all` of exactly the routed rows; TPU and GPU
            only) or `"auto"` (ragged where the platform compiles it, dense on CPU).
        ep_buffer_factor: the ragged exchange's receive buffer per device, in multiples of the
            mean load (`b * S * top_k` rows), never above the worst case; `None` sizes it for
            the worst case (up to `n * min(top_k, E/n) / top_k` times the mean: 32x at EP = 64
            with top-8 of 256 experts). Rows past the bound are dropped, even with
            `dispatch="dropless"`, and counted in `dropped_fraction`. The default, 4, never
            binds where the worst case is at most 4x the mean (top-2 of 8 at any EP).

    >>> MoeConfig(num_experts=4, top_k=2, expert_dim=16).dispatch
    'dropless'
    """

    num_experts: int
    top_k: int
    expert_dim: int
    norm_topk_prob: bool = True
    dispatch: Literal["dropless", "capacity"] = "dropless"
    capacity_factor: float = 1.25
    load_balancing_coef: float = 0.01
    router_z_coef: float = 0.001
    load_balancing_scope: Literal["all_layers", "per_layer"] = "all_layers"
    ep_exchange: Literal["auto", "dense", "ragged"] = "auto"
    ep_buffer_factor: float | None = 4.0

    def __post_init__(self) -> None:
        _check_positive_ints(self, ("num_experts", "top_k", "expert_dim"))
        if self.top_k > self.num_experts:
            _fail(
                "MoeConfig",
                "top_k",
                self.top_k,
                f"exceeds num_experts={self.num_experts}",
                f"MoeConfig(..., top_k={self.num_experts}) or more experts",
            )
        if self.dispatch not in MOE_DISPATCH:
            _fail(
                "MoeConfig",
                "dispatch",
                self.dispatch,
                f"must be one of {MOE_DISPATCH}",
                'MoeConfig(..., dispatch="dropless")',
            )
        if not self.capacity_factor > 0:
            _fail(
                "MoeConfig",
                "capacity_factor",
                self.capacity_factor,
                "must be > 0",
                "MoeConfig(..., capacity_factor=1.25)",
            )
        if self.load_balancing_scope not in LOAD_BALANCING_SCOPES:
            _fail(
                "MoeConfig",
                "load_balancing_scope",
                self.load_balancing_scope,
                f"must be one of {LOAD_BALANCING_SCOPES}",
                'MoeConfig(..., load_balancing_scope="all_layers")',
            )
        if self.ep_exchange not in EP_EXCHANGES:
            _fail(
                "MoeConfig",
                "ep_exchange",
                self.ep_exchange,
                f"must be one of {EP_EXCHANGES}",
                'MoeConfig(..., ep_exchange="auto")',
            )
        factor = self.ep_buffer_factor
        if factor is not None and (
            isinstance(factor, bool)
            or not isinstance(factor, (int, float))
            or not 1 <= factor < math.inf
        ):
            _fail(
                "MoeConfig",
                "ep_buffer_factor",
                factor,
                "must be None (a worst-case buffer, nothing dropped) or a finite number >= 1 "
                "(the receive buffer in multiples of the mean load)",
                "MoeConfig(..., ep_buffer_factor=4.0) or ep_buffer_factor=None",
            )
        for name in ("load_balancing_coef", "router_z_coef"):
            if getattr(self, name) < 0:
                _fail("MoeConfig", name, getattr(self, name), "must be >= 0", f"{name}=0.0")

    def capacity(self, tokens_per_group: int) -> int:
        """Slots per expert for a group (one sequence) of `tokens_per_group` tokens.

        >>> MoeConfig(num_experts=4, top_k=2, expert_dim=8, capacity_factor=1.0).capacity(10)
        5
        """
        slots = math.ceil(self.capacity_factor * tokens_per_group * self.top_k / self.num_experts)
        return max(1, min(slots, tokens_per_group))

    def replace(self, **changes: Any) -> MoeConfig:
        return _replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Sizes and recipe of a decoder-only language model.

    The `family` picks the recipe:

    | family | norm | positions | MLP | extras |
    |---|---|---|---|---|
    | llama | RMS | RoPE (opt. Llama 3 scaling) | SwiGLU | GQA |
    | qwen3 | RMS | RoPE | SwiGLU | GQA + RMS norm on each head's q and k |
    | mixtral | RMS | RoPE | MoE of SwiGLU experts | GQA |
    | qwen3_moe | RMS | RoPE | MoE of SwiGLU experts | GQA + QK-norm |
    | gpt2 | LayerNorm | learned | GELU, biases | fused qkv in HF files |
    | gemma | RMS with (1 + w) | RoPE | GeGLU | embeddings scaled by sqrt(hidden) |
    | gemma2 | RMS (1 + w), pre + post | RoPE | GeGLU | local/global layers, soft caps |
    | gemma3_text | RMS (1 + w), pre + post | RoPE, local theta | GeGLU | 5 local : 1 global, QK |
    | mistral | RMS | RoPE | SwiGLU | sliding-window attention |

    Attributes:
        family: one of `FAMILIES`.
        vocab_size: vocabulary size (the `vocab` axis).
        hidden_dim: model width (the `embed` axis).
        intermediate_dim: dense MLP width (the `mlp` axis); unused by MoE layers.
        num_layers: transformer blocks (the `layers` axis).
        num_heads: query heads.
        num_kv_heads: key/value heads (GQA); must divide `num_heads`.
        head_dim: per-head size; `None` means `hidden_dim // num_heads`.
        max_seq_len: longest sequence (size of GPT-2's position table, KV-cache bound).
        activation: MLP activation (`silu`, `gelu`, `gelu_tanh`, `relu`).
        norm_eps: epsilon of every norm.
        rope: rotary settings (ignored by gpt2).
        tie_embeddings: share the input embedding with the output projection.
        qk_norm: RMS-normalise queries and keys before RoPE: each head's (Qwen3, Gemma 3) or
            the whole projection, all heads at once (OLMo 2).
        moe: expert settings for the MoE families, `None` for dense ones.
        remat: rematerialisation of the scanned blocks (a `hax.ScanCheckpointPolicy` kind):
            `none` (keep everything), `save_carries` (keep each block's input, recompute its
            inside), `full` (recompute everything from the first input), `offload` (like
            `save_carries`, with the block inputs in host memory where supported).
        scan_layers: run the blocks with a scan (one compile for all layers) or unrolled.
        attention_query_block: attention over a sequence longer than this many positions
            runs one block of queries at a time (each block checkpointed), so only one
            block's `(query, key)` scores are alive instead of the whole `seq x seq` matrix;
            `None` never splits. Exact (each query row still sees every key); used only when
            it divides the sequence length.
        loss_vocab_block: the training loss computes the output projection, cross-entropy and
            z-loss this many vocabulary rows at a time (forward and backward), never holding
            the full `(batch, position, vocab)` float32 logits; used when `vocab_size` exceeds
            it (so by default for vocabularies above 8,192). `None` always builds the full
            logits. Exact either way (same loss and gradients to float32 rounding).
        attention_backend: the attention kernel: `"xla"` (plain XLA, with query blocks),
            `"dot_product_attention"` (`jax.nn.dot_product_attention`; cuDNN flash attention on
            GPU), `"splash"` (the Pallas TPU splash kernel; TPU only) or `"auto"` (splash on
            TPU, cuDNN on GPU, xla on CPU). See `meltemi.models._attention`.
        sequence_parallel: attention when the axis mapping splits `position` over a mesh
            axis (`{"position": "sequence"}`): `"none"` (no split expected; GSPMD decides),
            `"all_gather"` (each device gathers all keys and values) or `"ring"` (keys and
            values passed around the ring of devices, overlapped with compute). Causal load
            balancing permutes the sequence once; see `meltemi.models._context_parallel`.
        sliding_window: a query attends to the keys less than this many positions before
            it (itself included), as Hugging Face's `sliding_window`; `None`: no window.
        layer_types: per layer, `"sliding_attention"` (uses `sliding_window`) or
            `"full_attention"`; `None`: the family's pattern (Gemma 2: every 2nd layer is
            global; Gemma 3: every 6th), else every layer slides when `sliding_window` is set.
        attn_logit_softcap: attention logits become `cap * tanh(logits / cap)` (Gemma 2).
        final_logit_softcap: output logits become `cap * tanh(logits / cap)` (Gemma 2).
        query_pre_attn_scalar: attention logits are scaled by `query_pre_attn_scalar**-0.5`
            instead of `head_size**-0.5` (Gemma 2/3); `None`: the head size.
        rope_local_theta: RoPE base of the sliding-window layers (Gemma 3's
            `rope_local_base_freq`); `None`: every layer uses `rope.theta`.
        initializer_range: std of the normal initialiser of weight matrices.
        bos_token_id: kept for HF `config.json` round trips.
        eos_token_id: one id or a tuple of ids (Hugging Face allows a list); kept for
            `config.json` / `generation_config.json` round trips; generation stops on any.

    >>> cfg = ModelConfig(family="llama", vocab_size=11, hidden_dim=12, intermediate_dim=20,
    ...                   num_layers=2, num_heads=3, num_kv_heads=1)
    >>> cfg.head_size, cfg.replace(num_layers=3).num_layers
    (4, 3)
    """

    family: Family
    vocab_size: int
    hidden_dim: int
    intermediate_dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None
    max_seq_len: int = 4096
    activation: str = "silu"
    norm_eps: float = 1e-5
    rope: RopeConfig = RopeConfig()
    tie_embeddings: bool = False
    qk_norm: bool = False
    moe: MoeConfig | None = None
    remat: str = "save_carries"
    scan_layers: bool = True
    attention_query_block: int | None = 512
    loss_vocab_block: int | None = 8192
    attention_backend: str = "auto"
    sequence_parallel: str = "none"
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    query_pre_attn_scalar: float | None = None
    rope_local_theta: float | None = None
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            close = difflib.get_close_matches(str(self.family), FAMILIES, n=1)
            fix = f'family="{close[0]}"' if close else f"one of {FAMILIES}"
            _fail("ModelConfig", "family", self.family, "unknown family", fix)
        _check_positive_ints(
            self,
            (
                "vocab_size",
                "hidden_dim",
                "intermediate_dim",
                "num_layers",
                "num_heads",
                "num_kv_heads",
                "max_seq_len",
            ),
        )
        if self.num_heads % self.num_kv_heads:
            _fail(
                "ModelConfig",
                "num_kv_heads",
                self.num_kv_heads,
                f"must divide num_heads={self.num_heads} (grouped-query attention)",
                "pick a divisor, e.g. num_kv_heads=1",
            )
        if self.head_dim is None and self.hidden_dim % self.num_heads:
            _fail(
                "ModelConfig",
                "head_dim",
                None,
                f"hidden_dim={self.hidden_dim} is not divisible by num_heads={self.num_heads}",
                "set head_dim explicitly",
            )
        if self.head_dim is not None:
            _check_positive_ints(self, ("head_dim",))
            if self.head_dim * self.num_heads == self.hidden_dim:
                # Canonical form: the default head size is spelled `None`, so equal models
                # compare equal however they were written.
                object.__setattr__(self, "head_dim", None)
        if self.attention_query_block is not None:
            _check_positive_ints(self, ("attention_query_block",))
        if self.loss_vocab_block is not None:
            _check_positive_ints(self, ("loss_vocab_block",))
        if self.uses_rope and self.head_size % 2:
            _fail(
                "ModelConfig",
                "head_dim",
                self.head_size,
                "rotary embeddings need an even head size",
                "use an even head_dim",
            )
        if self.activation not in ACTIVATIONS:
            _fail(
                "ModelConfig",
                "activation",
                self.activation,
                f"must be one of {ACTIVATIONS}",
                'activation="silu"',
            )
        if self.remat not in REMAT_POLICIES:
            _fail(
                "ModelConfig",
                "remat",
                self.remat,
                f"must be one of {REMAT_POLICIES}",
                'remat="save_carries"',
            )
        if not self.norm_eps > 0:
            _fail("ModelConfig", "norm_eps", self.norm_eps, "must be > 0", "norm_eps=1e-5")
        is_moe = self.facts.moe is not None
        if is_moe and self.moe is None:
            _fail(
                "ModelConfig",
                "moe",
                None,
                f"family {self.family!r} is a mixture of experts",
                "moe=MoeConfig(num_experts=8, top_k=2, expert_dim=...)",
            )
        if not is_moe and self.moe is not None:
            _fail(
                "ModelConfig",
                "moe",
                self.moe,
                f"family {self.family!r} is dense",
                'moe=None, or family="mixtral"/"qwen3_moe"',
            )
        self._check_eos_and_rope()
        if self.qk_norm and self.facts.qk_norm == "none":
            _fail(
                "ModelConfig",
                "qk_norm",
                True,
                f"family {self.family!r} has no QK-norm (Hugging Face could not load it)",
                'family="qwen3" (or "qwen3_moe")',
            )
        self._check_attention()
        if self.facts.qk_norm != "none" and not self.qk_norm:
            _fail(
                "ModelConfig",
                "qk_norm",
                False,
                f"family {self.family!r} always has QK-norm",
                'qk_norm=True, or family="llama"/"mixtral"',
            )

    def _check_eos_and_rope(self) -> None:
        """Canonical eos: an int, or a tuple of several ids."""
        eos = self.eos_token_id
        if isinstance(eos, (list, tuple)):
            ids = tuple(int(i) for i in eos)
            if not ids:
                ids = None
            elif len(ids) == 1:
                ids = ids[0]
            object.__setattr__(self, "eos_token_id", ids)

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """`eos_token_id` as a tuple (empty when unset).

        >>> from meltemi.models import get_preset
        >>> get_preset("tiny-llama").replace(eos_token_id=[2, 5]).eos_ids
        (2, 5)
        """
        eos = self.eos_token_id
        if eos is None:
            return ()
        return eos if isinstance(eos, tuple) else (eos,)

    @property
    def pre_norms(self) -> bool:
        """Norms on the attention and MLP inputs (all families but OLMo 2, which only
        normalises their outputs)."""
        return self.facts.pre_norms

    @property
    def qkv_bias(self) -> bool:
        """Biases on the q/k/v projections but not the output one (Qwen2)."""
        return self.facts.bias == "qkv"

    @property
    def qk_norm_whole(self) -> bool:
        """QK-norm over the whole q/k projection (all heads together: OLMo 2) rather than per
        head."""
        return self.facts.qk_norm == "whole"

    def _check_attention(self) -> None:
        """Validates the attention fields (backend, windows, soft caps, scales)."""
        if self.attention_backend not in ATTENTION_BACKENDS:
            close = difflib.get_close_matches(str(self.attention_backend), ATTENTION_BACKENDS, n=1)
            fix = f'attention_backend="{close[0]}"' if close else f"one of {ATTENTION_BACKENDS}"
            _fail("ModelConfig", "attention_backend", self.attention_backend, "unknown", fix)
        if self.sequence_parallel not in SEQUENCE_PARALLEL:
            close = difflib.get_close_matches(str(self.sequence_parallel), SEQUENCE_PARALLEL, n=1)
            fix = f'sequence_parallel="{close[0]}"' if close else f"one of {SEQUENCE_PARALLEL}"
            _fail("ModelConfig", "sequence_parallel", self.sequence_parallel, "unknown", fix)
        if self.sequence_parallel != "none" and self.attention_backend in (
            "splash",
            "dot_product_attention",
        ):
            _fail(
                "ModelConfig",
                "attention_backend",
                self.attention_backend,
                f"sequence_parallel={self.sequence_parallel!r} runs its own blockwise XLA kernel "
                "inside shard_map, not this fused one",
                'attention_backend="auto" (or sequence_parallel="none")',
            )
        if self.sliding_window is not None:
            _check_positive_ints(self, ("sliding_window",))
        if self.layer_types is not None:
            types = self.layer_types
            if isinstance(types, list):
                types = tuple(types)
                object.__setattr__(self, "layer_types", types)
            if len(types) != self.num_layers or any(t not in LAYER_TYPES for t in types):
                _fail(
                    "ModelConfig",
                    "layer_types",
                    types,
                    f"needs one of {LAYER_TYPES} per layer ({self.num_layers} layers)",
                    'layer_types=("sliding_attention", "full_attention", ...)',
                )
            if "sliding_attention" in types and self.sliding_window is None:
                _fail(
                    "ModelConfig",
                    "sliding_window",
                    None,
                    "layer_types has sliding_attention layers but no window size",
                    "sliding_window=4096",
                )
        for name in ("attn_logit_softcap", "final_logit_softcap", "query_pre_attn_scalar"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                _fail("ModelConfig", name, value, "must be > 0 (or None)", f"{name}=None")
        if self.rope_local_theta is not None and not self.rope_local_theta > 0:
            _fail(
                "ModelConfig",
                "rope_local_theta",
                self.rope_local_theta,
                "must be > 0 (or None)",
                "rope_local_theta=10000.0",
            )
        pattern = self.facts.sliding_pattern
        own = (
            sliding_layer_types(self.num_layers, pattern)
            if pattern
            else ("sliding_attention",) * self.num_layers
        )
        if self.facts.sliding_window and self.layer_types == own:
            # Canonical form: the family's own pattern (Gemma's, else every layer sliding) is
            # spelled `None` (it then follows `num_layers` when that is overridden).
            object.__setattr__(self, "layer_types", None)
        if not self.facts.sliding_window:
            if self.sliding_window is not None or self.layer_types is not None:
                _fail(
                    "ModelConfig",
                    "sliding_window",
                    self.sliding_window,
                    f"family {self.family!r} has no sliding-window attention (Hugging Face "
                    "would ignore it)",
                    'sliding_window=None, or family="mistral"',
                )

    # Recipe, derived from the family -------------------------------------------------------
    @property
    def facts(self) -> FamilyFacts:
        """The family's record (`meltemi.models._families`): what the family fixes."""
        return FAMILY_FACTS[self.family]

    @property
    def head_size(self) -> int:
        """Per-head size (`head_dim` or `hidden_dim // num_heads`)."""
        return self.head_dim if self.head_dim is not None else self.hidden_dim // self.num_heads

    @property
    def norm_kind(self) -> Literal["rms", "rms_one_plus", "layer"]:
        return self.facts.norm

    @property
    def uses_rope(self) -> bool:
        return self.facts.rope

    @property
    def gated_mlp(self) -> bool:
        return self.facts.gated_mlp

    @property
    def use_bias(self) -> bool:
        return self.facts.bias == "all"

    @property
    def scale_embeddings(self) -> bool:
        return self.facts.scale_embeddings

    @property
    def post_norms(self) -> bool:
        """Norms on the attention and MLP outputs, before the residual add (Gemma 2/3; OLMo 2,
        which has only these)."""
        return self.facts.post_norms

    @property
    def sliding_layers(self) -> tuple[bool, ...]:
        """Per layer, whether it attends through `sliding_window`."""
        if self.sliding_window is None:
            return (False,) * self.num_layers
        types = self.layer_types
        if types is None and self.facts.sliding_pattern:
            types = sliding_layer_types(self.num_layers, self.facts.sliding_pattern)
        if types is None:
            return (True,) * self.num_layers
        return tuple(t == "sliding_attention" for t in types)

    @property
    def attention_scale(self) -> float:
        """The factor applied to `q . k` (`head_size**-0.5` or `query_pre_attn_scalar**-0.5`)."""
        return float(self.query_pre_attn_scalar or self.head_size) ** -0.5

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def blockwise_loss(self) -> bool:
        """Whether the training loss runs over vocabulary blocks (`loss_vocab_block`)."""
        return self.loss_vocab_block is not None and self.vocab_size > self.loss_vocab_block

    @property
    def q_heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with `changes` applied; an unknown field name is an error that suggests one.

        >>> from meltemi.models import get_preset
        >>> get_preset("tiny-llama").replace(num_layer=3)
        Traceback (most recent call last):
        ...
        meltemi.models.ConfigError: ... no field 'num_layer'. Did you mean 'num_layers'? ...
        """
        return _replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (nested configs as dicts); inverse of `from_dict`."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Builds a config from `to_dict` output; unknown keys are an error naming them.

        >>> from meltemi.models import get_preset
        >>> cfg = get_preset("tiny-mixtral")
        >>> ModelConfig.from_dict(cfg.to_dict()) == cfg
        True
        """
        data = dict(data)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(
                f"ModelConfig.from_dict: unknown keys {unknown}; known: {sorted(names)}"
            )
        if isinstance(data.get("rope"), dict):
            data["rope"] = RopeConfig(**data["rope"])
        if isinstance(data.get("moe"), dict):
            data["moe"] = MoeConfig(**data["moe"])
        return cls(**data)
