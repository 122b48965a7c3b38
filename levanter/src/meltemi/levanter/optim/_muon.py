"""Muon: momentum, then Newton-Schulz orthogonalisation of each weight matrix's update.

Only matrices are orthogonalised; every other parameter (norms, biases, embeddings, the output
head, tensors with more than two matrix axes) goes to an AdamW fallback. Which axes form the
matrix is decided by one small function, `muon_matrix_dims`:

* a plain array is a matrix when it is 2-D;
* a NamedArray (haliax) has its batch axes removed first (by name, default `layers`: a stacked
  `Layers` axis of a scanned model is a batch of matrices, not a matrix dimension); it is a
  matrix when exactly two axes remain.

Pass `matrix_dims=` to `muon` to decide differently (e.g. to flatten `Heads x HeadSize`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax

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
    map_params_with_path,
    raw,
    rewrap,
)

#: Keller Jordan's quintic coefficients: fast, singular values land in roughly [0.7, 1.2].
DEFAULT_NS_COEFFS: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)
#: 2-D parameters whose path matches one of these stay on AdamW (embeddings, output head).
DEFAULT_ADAM_PATTERNS: tuple[str, ...] = (r"embed", r"lm_head", r"(^|/)w[pt]e(/|$)")
MuonScale = Literal["spectral", "rms", "none"]


class MatrixDims(NamedTuple):
    """How an update tensor is viewed as a (batch of) matrices: dimension indices per role."""

    batch: tuple[int, ...]
    rows: tuple[int, ...]
    cols: tuple[int, ...]


def muon_matrix_dims(leaf: Any, batch_axes: Sequence[str] = ("layers",)) -> MatrixDims | None:
    """The matrix view of a parameter for Muon, or None when it is not a matrix.

    Args:
        leaf: a plain array or a NamedArray (anything with `.axes` and `.array`).
        batch_axes: axis names (case-insensitive) that index independent matrices.

    Example:
        >>> import jax.numpy as jnp
        >>> muon_matrix_dims(jnp.ones((3, 5)))
        MatrixDims(batch=(), rows=(0,), cols=(1,))
        >>> muon_matrix_dims(jnp.ones((2, 3, 5))) is None
        True
    """
    names = axis_names(leaf)
    if names is None:
        return MatrixDims((), (0,), (1,)) if jnp.ndim(leaf) == 2 else None
    lowered = {b.lower() for b in batch_axes}
    batch = tuple(i for i, n in enumerate(names) if n.lower() in lowered)
    rest = [i for i in range(len(names)) if i not in batch]
    if len(rest) != 2:
        return None
    return MatrixDims(batch, (rest[0],), (rest[1],))


def newton_schulz(
    x: jax.Array,
    steps: int = 5,
    coeffs: tuple[float, float, float] = DEFAULT_NS_COEFFS,
    eps: float = 1e-7,
) -> jax.Array:
    """Approximately orthogonalises the last two dims of `x` (in float32): `U S V^T -> U V^T`.

    Each step is `X <- a X + (b A + c A A) X` with `A = X X^T`, on the wide orientation.

    Example (the convergent cubic iteration reaches the exact polar factor):
        >>> import jax, jax.numpy as jnp
        >>> x = jax.random.normal(jax.random.key(0), (3, 5))
        >>> o = newton_schulz(x, steps=40, coeffs=(1.5, -0.5, 0.0))
        >>> bool(jnp.allclose(o @ o.T, jnp.eye(3), atol=1e-4))
        True
    """
    a, b, c = coeffs
    dtype = x.dtype
    x = x.astype(jnp.float32)
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = jnp.swapaxes(x, -1, -2)
    x = x / (jnp.linalg.norm(x, axis=(-2, -1), keepdims=True) + eps)
    for _ in range(steps):
        gram = x @ jnp.swapaxes(x, -1, -2)
        x = a * x + (b * gram + c * gram @ gram) @ x
    if tall:
        x = jnp.swapaxes(x, -1, -2)
    return x.astype(dtype)


def _scale(rows: int, cols: int, scale: str) -> float:
    if scale == "spectral":  # Keller Jordan: unit spectral norm per input dim
        return math.sqrt(max(1.0, rows / cols))
    if scale == "rms":  # Moonshot: match AdamW's update RMS (~0.2) so the lr transfers
        return 0.2 * math.sqrt(max(rows, cols))
    return 1.0


def orthogonalize(
    x: jax.Array,
    dims: MatrixDims,
    *,
    steps: int = 5,
    coeffs: tuple[float, float, float] = DEFAULT_NS_COEFFS,
    scale: MuonScale = "spectral",
) -> jax.Array:
    """Newton-Schulz on each matrix of `x` as described by `dims`, then Muon's shape scaling.

    Example (a stacked batch axis in front: each of the 2 matrices is orthogonalised alone):
        >>> import jax, jax.numpy as jnp
        >>> x = jax.random.normal(jax.random.key(1), (2, 3, 5))
        >>> o = orthogonalize(x, MatrixDims((0,), (1,), (2,)), steps=40,
        ...                   coeffs=(1.5, -0.5, 0.0), scale="none")
        >>> bool(jnp.allclose(o[1] @ o[1].T, jnp.eye(3), atol=1e-4))
        True
    """
    perm = (*dims.batch, *dims.rows, *dims.cols)
    moved = jnp.transpose(x, perm)
    batch_shape = moved.shape[: len(dims.batch)]
    rows = math.prod(x.shape[d] for d in dims.rows)
    cols = math.prod(x.shape[d] for d in dims.cols)
    mats = moved.reshape((*batch_shape, rows, cols))
    out = newton_schulz(mats, steps, coeffs) * _scale(rows, cols, scale)
    out = out.reshape(moved.shape).astype(x.dtype)
    return jnp.transpose(out, tuple(perm.index(i) for i in range(x.ndim)))


class MuonState(NamedTuple):
    """State of `scale_by_muon`: the momentum buffer (same structure as the params)."""

    momentum: Any


def scale_by_muon(
    beta: float = 0.95,
    *,
    nesterov: bool = True,
    ns_steps: int = 5,
    ns_coeffs: tuple[float, float, float] = DEFAULT_NS_COEFFS,
    scale: MuonScale = "spectral",
    matrix_dims: Callable[[Any], MatrixDims | None] = muon_matrix_dims,
) -> optax.GradientTransformation:
    """Momentum (EMA of gradients), Nesterov look-ahead, then per-matrix orthogonalisation.

    Every parameter given to it must be a matrix per `matrix_dims`; `muon` routes the others
    to AdamW.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> tx = scale_by_muon()
        >>> g = {"w": jax.random.normal(jax.random.key(0), (5, 3))}
        >>> u, _ = tx.update(g, tx.init(g))
        >>> u["w"].shape
        (5, 3)
    """
    if scale not in ("spectral", "rms", "none"):
        raise OptimizerConfigError(f"scale={scale!r} is not one of ('spectral', 'rms', 'none')")

    def init_fn(params: Any) -> MuonState:
        return MuonState(jax.tree.map(jnp.zeros_like, params))

    def ortho(leaf: Any) -> Any:
        dims = matrix_dims(leaf)
        if dims is None:
            names = axis_names(leaf)
            raise OptimizerConfigError(
                f"scale_by_muon got a parameter that is not a matrix (shape "
                f"{jnp.shape(raw(leaf))}, axes {names}); route it to AdamW: use `muon(...)`, "
                f"whose labels send non-matrices to the fallback, or pass matrix_dims="
            )
        return rewrap(leaf, orthogonalize(raw(leaf), dims, steps=ns_steps, coeffs=ns_coeffs,
                                          scale=scale))  # fmt: skip

    def update_fn(updates: Any, state: MuonState, params: Any = None):
        del params
        mu = jax.tree.map(lambda m, g: beta * m + (1 - beta) * g, state.momentum, updates)
        if nesterov:
            look = jax.tree.map(lambda m, g: beta * m + (1 - beta) * g, mu, updates)
        else:
            look = mu
        out = jax.tree.map(ortho, look, is_leaf=is_named_array)
        return out, MuonState(mu)

    return optax.GradientTransformation(init_fn, update_fn)


def muon_labels(
    params: Any,
    *,
    adam_patterns: Sequence[str] = DEFAULT_ADAM_PATTERNS,
    matrix_dims: Callable[[Any], MatrixDims | None] = muon_matrix_dims,
) -> Any:
    """`"muon"` for matrices not matching `adam_patterns`, `"adam"` for everything else.

    Example:
        >>> import jax.numpy as jnp
        >>> muon_labels({"embed": jnp.ones((7, 3)), "w": jnp.ones((3, 5)), "b": jnp.ones(5)})
        {'b': 'adam', 'embed': 'adam', 'w': 'muon'}
    """
    compiled = [re.compile(p) for p in adam_patterns]

    def label(path: str, leaf: Any) -> str:
        if any(c.search(path.lower()) for c in compiled):
            return "adam"
        return "muon" if matrix_dims(leaf) is not None else "adam"

    return map_params_with_path(label, params)


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
    lr_max: float | None = None,
    adam_learning_rate: ScalarOrSchedule | None = None,
    adam_b1: float = 0.9,
    adam_b2: float = 0.95,
    adam_eps: float = 1e-8,
    adam_weight_decay: float | None = None,
    batch_axes: Sequence[str] = ("layers",),
    adam_patterns: Sequence[str] = DEFAULT_ADAM_PATTERNS,
    matrix_dims: Callable[[Any], MatrixDims | None] | None = None,
) -> optax.GradientTransformationExtraArgs:
    """Muon on weight matrices, AdamW on the rest, both with decoupled (AdamC-able) decay.

    Args:
        learning_rate: Muon's lr (float or schedule).
        beta, nesterov, ns_steps, ns_coeffs, scale: see `scale_by_muon` / `orthogonalize`.
        weight_decay, mask, adamc, lr_max: see `add_decayed_weights` (shared by both parts).
        adam_learning_rate: the fallback's lr (default: `learning_rate`).
        adam_b1, adam_b2, adam_eps, adam_weight_decay: the fallback AdamW (decay default:
            `weight_decay`).
        batch_axes: NamedArray axis names that index stacked matrices (e.g. `layers`).
        adam_patterns: path regexes of matrices kept on AdamW.
        matrix_dims: overrides `muon_matrix_dims(leaf, batch_axes)`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> tx = muon(0.02, adam_learning_rate=3e-4)
        >>> params = {"w": jnp.ones((3, 5)), "bias": jnp.ones(5)}
        >>> u, _ = tx.update(params, tx.init(params), params)
        >>> sorted(u)
        ['bias', 'w']
    """
    dims_fn = matrix_dims or (lambda leaf: muon_matrix_dims(leaf, batch_axes))
    adam_lr = learning_rate if adam_learning_rate is None else adam_learning_rate
    muon_tx = optax.chain(
        scale_by_muon(
            beta, nesterov=nesterov, ns_steps=ns_steps, ns_coeffs=ns_coeffs, scale=scale,
            matrix_dims=dims_fn,
        ),
        add_decayed_weights(
            weight_decay, mask, adamc=adamc, learning_rate=learning_rate, lr_max=lr_max
        ),
        scale_by_learning_rate(learning_rate),
    )  # fmt: skip
    adam_tx = adamw(
        adam_lr, b1=adam_b1, b2=adam_b2, eps=adam_eps,
        weight_decay=weight_decay if adam_weight_decay is None else adam_weight_decay,
        mask=mask, adamc=adamc, lr_max=None if adam_learning_rate is not None else lr_max,
    )  # fmt: skip
    return optax.multi_transform(
        {"muon": muon_tx, "adam": adam_tx},
        lambda p: muon_labels(p, adam_patterns=adam_patterns, matrix_dims=dims_fn),
    )
