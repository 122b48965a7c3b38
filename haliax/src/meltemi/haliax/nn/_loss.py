"""Cross-entropy with optional z-loss and masking.

>>> import meltemi.haliax as hax
>>> Pos, Vocab = hax.Axis("pos", 3), hax.Axis("vocab", 5)
>>> logits = hax.zeros((Pos, Vocab))
>>> loss = hax.nn.cross_entropy_loss(logits, Vocab, hax.arange(Pos))
>>> round(float(loss.scalar()), 4)  # log(5)
1.6094
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from meltemi.haliax._core import AxisError, AxisSelection, AxisSelector, NamedArray, broadcast_to
from meltemi.haliax._ops import where as where_
from meltemi.haliax._reductions import logsumexp
from meltemi.haliax._reductions import mean as hmean
from meltemi.haliax._reductions import sum as hsum

__all__ = [
    "cross_entropy_loss",
    "cross_entropy_loss_and_log_normalizers",
    "binary_cross_entropy_loss",
    "reduce_loss",
]

Reduction = Callable[..., NamedArray] | str | None


def _gather(logits: NamedArray, Label: AxisSelector, targets: NamedArray) -> NamedArray:
    """`logits[..., targets]` along `Label` (take_along_axis), aligned by name."""
    i = logits.axis_index(Label)
    rest = logits.axes[:i] + logits.axes[i + 1 :]
    for a in targets.axes:
        if not any(a.name == r.name for r in rest):
            raise AxisError(
                f"cross_entropy_loss: target axis {a.name!r} is not an axis of the logits "
                f"{[x.name for x in logits.axes]}"
            )
    t = targets.broadcast_to(rest).array
    t = jnp.expand_dims(t, i)
    picked = jnp.take_along_axis(logits.array, t.astype(jnp.int32), axis=i)
    return NamedArray(jnp.squeeze(picked, i), rest)


def cross_entropy_loss_and_log_normalizers(
    logits: NamedArray,
    Label: AxisSelector,
    targets: NamedArray,
) -> tuple[NamedArray, NamedArray]:
    """Per-example loss `logsumexp(logits) - logits[target]` and the log-normalizers.

    `targets` are integer class ids (axes of the logits minus `Label`) or a distribution over
    `Label` (float, with the `Label` axis).
    """
    log_z = logsumexp(logits, Label)
    if jnp.issubdtype(targets.dtype, jnp.integer):
        if targets.has_axis(Label):
            raise AxisError(
                f"integer targets must not have the label axis {Label!r}; pass class ids, or a "
                f"float distribution over the label axis"
            )
        return log_z - _gather(logits, Label, targets), log_z
    if not targets.has_axis(Label):
        raise AxisError(
            f"float targets must be a distribution over the label axis {Label!r}; got axes "
            f"{[a.name for a in targets.axes]} (pass integer ids for hard labels)"
        )
    log_p = logits - log_z
    return -hsum(targets * log_p, axis=Label), log_z


def reduce_loss(
    arr: NamedArray,
    reduction: Reduction = "mean",
    reduction_axis: AxisSelection | None = None,
    *,
    where: NamedArray | None = None,
    weight: NamedArray | None = None,
) -> NamedArray:
    """Reduces a per-example loss over `reduction_axis` (all axes if None; `()` reduces nothing).

    Args:
        arr: the per-example loss.
        reduction: `"mean"` (or `hax.mean`), `"sum"` (or `hax.sum`), any callable taking
            `(arr, axis=..., where=...)`, or None for no reduction.
        reduction_axis: the axes to reduce.
        where: bool mask (aligned by name); masked-out examples do not count.
        weight: per-example weights (aligned by name). With both, the weight is `weight * where`.
            A weighted mean is `sum(w * loss) / sum(w)`, and 0 where `sum(w)` is 0.

    Returns:
        The reduced loss (a 0-d NamedArray when every axis is reduced).
    """
    w = weight
    if where is not None:
        mask = where.astype(arr.dtype if weight is None else weight.dtype)
        if w is not None:  # each may have only some of `arr`'s axes: give both all of them
            w, mask = (broadcast_to(v, arr.axes, enforce_no_extra_axes=False) for v in (w, mask))
        w = mask if w is None else w * mask
    if w is not None:
        w = broadcast_to(w, arr.axes, enforce_no_extra_axes=False).astype(arr.dtype)
    if reduction is None or reduction == "none" or reduction_axis == ():
        return arr if w is None else arr * w
    if w is None:
        if reduction in ("mean", hmean):
            return hmean(arr, axis=reduction_axis)
        if reduction in ("sum", hsum):
            return hsum(arr, axis=reduction_axis)
        if callable(reduction):
            return reduction(arr, axis=reduction_axis)
    elif reduction in ("mean", hmean):
        num = hsum(arr * w, axis=reduction_axis)
        den = hsum(w, axis=reduction_axis)
        return where_(den != 0, num / where_(den != 0, den, 1.0), 0.0)
    elif reduction in ("sum", hsum):
        return hsum(arr * w, axis=reduction_axis)
    elif callable(reduction):
        return reduction(arr * w, axis=reduction_axis)
    raise ValueError(f"reduction must be 'mean', 'sum', None or a callable, got {reduction!r}")


def cross_entropy_loss(
    logits: NamedArray,
    Label: AxisSelector,
    targets: NamedArray,
    reduction: Reduction = "mean",
    where: NamedArray | None = None,
    weight: NamedArray | None = None,
    reduction_axis: AxisSelection | None = None,
    *,
    z_loss_weight: float = 0.0,
) -> NamedArray:
    """Cross-entropy over `Label`, plus `z_loss_weight * log_z**2` (PaLM's z-loss) if nonzero.

    Args:
        logits: unnormalised log-probabilities with the `Label` axis.
        Label: the class axis.
        targets: integer class ids (the logits' axes minus `Label`) or a float distribution
            over `Label`.
        reduction: see `reduce_loss` (default: mean).
        where: bool mask of the examples that count.
        weight: per-example weights.
        reduction_axis: axes to reduce (all if None).
        z_loss_weight: weight of the z-loss term (0 disables it).

    Returns:
        The (reduced) loss.
    """
    loss, log_z = cross_entropy_loss_and_log_normalizers(logits, Label, targets)
    if z_loss_weight:
        loss = loss + z_loss_weight * log_z * log_z
    return reduce_loss(loss, reduction, reduction_axis, where=where, weight=weight)


def binary_cross_entropy_loss(
    logits: NamedArray,
    targets: NamedArray,
    reduction: Reduction = "mean",
    where: NamedArray | None = None,
    weight: NamedArray | None = None,
    reduction_axis: AxisSelection | None = None,
) -> NamedArray:
    """`-t log sigmoid(x) - (1 - t) log sigmoid(-x)`, computed stably from logits.

    Args:
        logits: one logit per example.
        targets: probabilities of the positive class (0/1 labels or soft), aligned by name.
        reduction: see `reduce_loss` (default: mean).
        where: bool mask of the examples that count.
        weight: per-example weights.
        reduction_axis: axes to reduce (all if None).

    Returns:
        The (reduced) loss.
    """
    t = targets.astype(logits.dtype)
    log_p = NamedArray(jax.nn.log_sigmoid(logits.array), logits.axes)
    log_not_p = NamedArray(jax.nn.log_sigmoid(-logits.array), logits.axes)
    loss = (-t * log_p - (1.0 - t) * log_not_p).rearrange((*(a.name for a in logits.axes), ...))
    return reduce_loss(loss, reduction, reduction_axis, where=where, weight=weight)
