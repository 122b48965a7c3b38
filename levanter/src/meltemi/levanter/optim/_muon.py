"""Muon (optax's `contrib.scale_by_muon`) on weight matrices, AdamW on the rest, by axis name.

Muon orthogonalises each weight's momentum as a matrix `[inputs, outputs]` (Keller Jordan's
Newton-Schulz iteration; optax does the multi-axis case with `MuonDimensionNumbers`: reduction
axes, output axes, every other axis a batch of independent matrices). What is left to decide
is which axes of a parameter are its inputs and which its outputs; one function,
`muon_dimension_numbers(params)`, decides it by name:

* the weight of a linear layer (any pytree node with `weight`, `In` and `Out`, as haliax's
  `nn.Linear`): its `In` axes are the inputs, its `Out` axes the outputs, the rest (`layers`
  of a scanned stack, `experts`) are batch axes. So `q_proj` (`embed` -> `kv_heads x
  q_heads_per_group x head_size`) and `o_proj` are one matrix each per layer;
* another NamedArray: its batch axes (default `layers`, `experts`) removed by name, it is a
  matrix when exactly two axes remain, the first read as the input (`x @ W`);
* a plain array: a matrix when 2-D, `[inputs, outputs]`.

Everything else (norms, biases, embeddings and the output head by path, see
`DEFAULT_ADAM_PATTERNS`) goes to an AdamW fallback with its own learning rate.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers

from meltemi.levanter.optim._adamw import (
    AdamCMode,
    ScalarOrSchedule,
    adamw,
    add_decayed_weights,
    scale_by_learning_rate,
)
from meltemi.levanter.optim._errors import OptimizerConfigError
from meltemi.levanter.optim._named import (
    axis_names,
    is_named_array,
    path_str,
    raw,
    rewrap,
)

#: Keller Jordan's quintic coefficients: fast, singular values land in roughly [0.7, 1.2].
DEFAULT_NS_COEFFS: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)
#: Parameters whose path matches one of these stay on AdamW (embeddings, output head).
DEFAULT_ADAM_PATTERNS: tuple[str, ...] = (r"embed", r"lm_head", r"(^|/)w[pt]e(/|$)")
#: NamedArray axes that index independent matrices (a scanned stack, a mixture of experts).
DEFAULT_BATCH_AXES: tuple[str, ...] = ("layers", "experts")
MuonScale = Literal["spectral", "rms", "none"]
MUON_SCALES: tuple[str, ...] = ("spectral", "rms", "none")
DimensionNumbersFn = Callable[[str, Any], MuonDimensionNumbers | None]


def _is_linear(x: Any) -> bool:
    return (
        not is_named_array(x)
        and hasattr(x, "weight")
        and hasattr(x, "In")
        and hasattr(x, "Out")
        and is_named_array(getattr(x, "weight", None))
    )


def _names(spec: Any) -> tuple[str, ...]:
    specs = spec if isinstance(spec, (tuple, list)) else (spec,)
    return tuple(str(getattr(a, "name", a)) for a in specs)


def _linear_axes(params: Any) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """`{path of a linear layer's weight: (input axis names, output axis names)}`."""
    found = {}
    nodes = jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_linear)[0]
    for path, node in nodes:
        if _is_linear(node):
            prefix = path_str(path)
            found[f"{prefix}/weight" if prefix else "weight"] = (
                _names(node.In),
                _names(node.Out),
            )
    return found


def _dims_of(
    leaf: Any,
    linear: tuple[tuple[str, ...], tuple[str, ...]] | None,
    batch_axes: Sequence[str],
) -> MuonDimensionNumbers | None:
    names = axis_names(leaf)
    if names is None:
        return MuonDimensionNumbers(0, 1) if jnp.ndim(leaf) == 2 else None
    if linear is not None:
        ins, outs = linear
        reduction = tuple(i for i, n in enumerate(names) if n in ins)
        output = tuple(i for i, n in enumerate(names) if n in outs)
        if len(reduction) == len(ins) and len(output) == len(outs) and ins and outs:
            return MuonDimensionNumbers(reduction, output)
        return None
    lowered = {b.lower() for b in batch_axes}
    rest = [i for i, n in enumerate(names) if n.lower() not in lowered]
    if len(rest) != 2:
        return None
    return MuonDimensionNumbers(rest[0], rest[1])


def _leaf_dims(
    tree: Any,
    batch_axes: Sequence[str],
    adam_patterns: Sequence[str],
    override: DimensionNumbersFn | None,
) -> tuple[list, Any, list]:
    """Every parameter of `tree` (a NamedArray is one), its treedef, and its dimension numbers."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_named_array)
    leaves = [leaf for _, leaf in flat]
    if override is not None:
        return leaves, treedef, [override(path_str(p), leaf) for p, leaf in flat]
    compiled = [re.compile(p) for p in adam_patterns]
    linear = _linear_axes(tree)
    dims = []
    for p, leaf in flat:
        path = path_str(p)
        if any(c.search(path.lower()) for c in compiled):
            dims.append(None)
        else:
            dims.append(_dims_of(leaf, linear.get(path), batch_axes))
    return leaves, treedef, dims


def muon_dimension_numbers(
    params: Any,
    *,
    batch_axes: Sequence[str] = DEFAULT_BATCH_AXES,
    adam_patterns: Sequence[str] = DEFAULT_ADAM_PATTERNS,
) -> Any:
    """Per parameter: its `MuonDimensionNumbers` (inputs, outputs), or None for AdamW.

    The result has the structure of `params` with each array (or NamedArray) replaced.

    Example:
        >>> import jax.numpy as jnp
        >>> dims = muon_dimension_numbers({"w": jnp.ones((3, 5)), "embed": jnp.ones((7, 3))})
        >>> dims["w"], dims["embed"]
        (MuonDimensionNumbers(reduction_axis=0, output_axis=1), None)
    """
    _, treedef, dims = _leaf_dims(params, batch_axes, adam_patterns, None)
    return jax.tree_util.tree_unflatten(treedef, dims)


def muon_labels(
    params: Any,
    *,
    batch_axes: Sequence[str] = DEFAULT_BATCH_AXES,
    adam_patterns: Sequence[str] = DEFAULT_ADAM_PATTERNS,
    dimension_numbers: DimensionNumbersFn | None = None,
) -> Any:
    """`"muon"` for the parameters Muon orthogonalises, `"adam"` for everything else.

    Example:
        >>> import jax.numpy as jnp
        >>> muon_labels({"embed": jnp.ones((7, 3)), "w": jnp.ones((3, 5)), "b": jnp.ones(5)})
        {'b': 'adam', 'embed': 'adam', 'w': 'muon'}
    """
    _, treedef, dims = _leaf_dims(params, batch_axes, adam_patterns, dimension_numbers)
    return jax.tree_util.tree_unflatten(treedef, ["adam" if d is None else "muon" for d in dims])


def _shape_scale(x: jax.Array, dims: MuonDimensionNumbers, scale: str) -> jax.Array:
    red = (dims.reduction_axis,) if isinstance(dims.reduction_axis, int) else dims.reduction_axis
    out = (dims.output_axis,) if isinstance(dims.output_axis, int) else dims.output_axis
    fan_in = math.prod(x.shape[a] for a in red)
    fan_out = math.prod(x.shape[a] for a in out)
    if scale == "spectral":  # Keller Jordan: unit RMS->RMS operator norm, sqrt(fan_out / fan_in)
        return x * math.sqrt(max(1.0, fan_out / fan_in))
    if scale == "rms":  # Moonshot (arXiv 2502.16982): match AdamW's update RMS (~0.2)
        return x * (0.2 * math.sqrt(max(fan_in, fan_out)))
    return x


def scale_by_muon(
    beta: float = 0.95,
    *,
    nesterov: bool = True,
    ns_steps: int = 5,
    ns_coeffs: tuple[float, float, float] = DEFAULT_NS_COEFFS,
    scale: MuonScale = "spectral",
    mu_dtype: Any = None,
    batch_axes: Sequence[str] = DEFAULT_BATCH_AXES,
    adam_patterns: Sequence[str] = DEFAULT_ADAM_PATTERNS,
    dimension_numbers: DimensionNumbersFn | None = None,
) -> optax.GradientTransformation:
    """optax's `contrib.scale_by_muon` on named parameters, then Muon's shape scaling.

    Each leaf is handed to optax as a plain array with its `MuonDimensionNumbers` (from
    `muon_dimension_numbers`, or `dimension_numbers(path, leaf)`); a NamedArray keeps its
    axes. Every parameter given to it must be a matrix; `muon` routes the others to AdamW.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> tx = scale_by_muon()
        >>> g = {"w": jax.random.normal(jax.random.key(0), (5, 3))}
        >>> u, _ = tx.update(g, tx.init(g))
        >>> u["w"].shape
        (5, 3)
    """
    if scale not in MUON_SCALES:
        raise OptimizerConfigError(f"scale={scale!r} is not one of {MUON_SCALES}")

    def inner(dims: list) -> optax.GradientTransformation:
        return optax.contrib.scale_by_muon(
            ns_coeffs=ns_coeffs, ns_steps=ns_steps, beta=beta, mu_dtype=mu_dtype,
            nesterov=nesterov, weight_dimension_numbers=dims,
        )  # fmt: skip

    def check(leaves: list, dims: list) -> None:
        for leaf, d in zip(leaves, dims, strict=True):
            if d is None:
                raise OptimizerConfigError(
                    f"scale_by_muon got a parameter that is not a matrix (shape "
                    f"{jnp.shape(raw(leaf))}, axes {axis_names(leaf)}); route it to AdamW: "
                    f"use `muon(...)`, whose labels send non-matrices to the fallback, or pass "
                    f"dimension_numbers="
                )

    def init_fn(params: Any) -> Any:
        leaves, _, dims = _leaf_dims(params, batch_axes, adam_patterns, dimension_numbers)
        check(leaves, dims)
        return inner(dims).init([raw(x) for x in leaves])

    def update_fn(updates: Any, state: Any, params: Any = None):
        del params
        leaves, treedef, dims = _leaf_dims(updates, batch_axes, adam_patterns, dimension_numbers)
        check(leaves, dims)
        out, state = inner(dims).update([raw(x) for x in leaves], state)
        out = [
            _shape_scale(o, d, scale).astype(raw(x).dtype)
            for o, d, x in zip(out, dims, leaves, strict=True)
        ]
        return jax.tree_util.tree_unflatten(
            treedef, [rewrap(x, o) for x, o in zip(leaves, out, strict=True)]
        ), state

    return optax.GradientTransformation(init_fn, update_fn)


def muon(
    learning_rate: ScalarOrSchedule,
    *,
    beta: float = 0.95,
    nesterov: bool = True,
    ns_steps: int = 5,
    ns_coeffs: tuple[float, float, float] = DEFAULT_NS_COEFFS,
    scale: MuonScale = "spectral",
    weight_decay: float = 0.0,
    mask: Any = None,
    adamc: AdamCMode = "off",
    adamc_mask: Any = None,
    lr_max: float | None = None,
    mu_dtype: Any = None,
    adam_learning_rate: ScalarOrSchedule | None = None,
    adam_b1: float = 0.9,
    adam_b2: float = 0.95,
    adam_eps: float = 1e-8,
    adam_weight_decay: float | None = None,
    batch_axes: Sequence[str] = DEFAULT_BATCH_AXES,
    adam_patterns: Sequence[str] = DEFAULT_ADAM_PATTERNS,
    dimension_numbers: DimensionNumbersFn | None = None,
) -> optax.GradientTransformation:
    """Muon on weight matrices, AdamW on the rest, both with decoupled (AdamC-able) decay.

    Args:
        learning_rate: Muon's lr (float or schedule).
        beta: momentum decay (optax's `contrib.scale_by_muon`).
        nesterov: Nesterov momentum (optax's `contrib.scale_by_muon`).
        ns_steps: Newton-Schulz iterations (optax's `contrib.scale_by_muon`).
        ns_coeffs: Newton-Schulz coefficients (optax's `contrib.scale_by_muon`).
        mu_dtype: momentum dtype (optax's `contrib.scale_by_muon`).
        scale: "spectral" (`sqrt(max(1, fan_out / fan_in))`), "rms" (`0.2 *
            sqrt(max(fan_in, fan_out))`, so AdamW's lr transfers) or "none".
        weight_decay: decoupled decay (see `add_decayed_weights`; shared by both parts).
        mask: which leaves decay (see `add_decayed_weights`).
        adamc: AdamC's corrected decay (see `add_decayed_weights`).
        adamc_mask: which leaves get AdamC's correction (see `add_decayed_weights`).
        lr_max: the schedule's peak lr, for AdamC (see `add_decayed_weights`).
        adam_learning_rate: the fallback's lr. Required: Muon's lr (~0.02) is far too large
            for AdamW, so there is no default.
        adam_b1: the fallback AdamW's first-moment decay.
        adam_b2: the fallback AdamW's second-moment decay.
        adam_eps: the fallback AdamW's epsilon.
        adam_weight_decay: the fallback AdamW's decay (default: `weight_decay`).
        batch_axes: NamedArray axis names that index stacked matrices (`layers`, `experts`).
        adam_patterns: path regexes of matrices kept on AdamW.
        dimension_numbers: `(path, leaf) -> MuonDimensionNumbers | None`, replacing
            `muon_dimension_numbers`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> tx = muon(0.02, adam_learning_rate=3e-4)
        >>> params = {"w": jnp.ones((3, 5)), "bias": jnp.ones(5)}
        >>> u, _ = tx.update(params, tx.init(params), params)
        >>> sorted(u)
        ['bias', 'w']
    """
    if adam_learning_rate is None:
        raise OptimizerConfigError(
            "muon: adam_learning_rate=None; the AdamW fallback (embeddings, norms, the output "
            "head) needs its own learning rate, e.g. muon(0.02, adam_learning_rate=3e-4)"
        )
    muon_tx = optax.chain(
        scale_by_muon(
            beta, nesterov=nesterov, ns_steps=ns_steps, ns_coeffs=ns_coeffs, scale=scale,
            mu_dtype=mu_dtype, batch_axes=batch_axes, adam_patterns=adam_patterns,
            dimension_numbers=dimension_numbers,
        ),
        add_decayed_weights(
            weight_decay, mask, adamc=adamc, adamc_mask=adamc_mask, learning_rate=learning_rate,
            lr_max=lr_max,
        ),
        scale_by_learning_rate(learning_rate),
    )  # fmt: skip
    adam_tx = adamw(
        adam_learning_rate, b1=adam_b1, b2=adam_b2, eps=adam_eps,
        weight_decay=weight_decay if adam_weight_decay is None else adam_weight_decay,
        mask=mask, adamc=adamc, adamc_mask=adamc_mask, mu_dtype=mu_dtype,
    )  # fmt: skip
    return optax.multi_transform(
        {"muon": muon_tx, "adam": adam_tx},
        lambda p: muon_labels(
            p, batch_axes=batch_axes, adam_patterns=adam_patterns,
            dimension_numbers=dimension_numbers,
        ),
    )  # fmt: skip
