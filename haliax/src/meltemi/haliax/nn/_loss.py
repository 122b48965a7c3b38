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
from typing import Any

import jax.numpy as jnp

from meltemi.haliax._core import AxisError, AxisSelection, AxisSelector, NamedArray
from meltemi.haliax._reductions import logsumexp
from meltemi.haliax._reductions import mean as hmean
from meltemi.haliax._reductions import sum as hsum

__all__ = ["cross_entropy_loss", "cross_entropy_loss_and_log_normalizers"]

Reduction = Callable[..., NamedArray] | str | None


def _gather(logits: NamedArray, Label: AxisSelector, targets: NamedArray) -> NamedArray:  # noqa: N803
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
    Label: AxisSelector,  # noqa: N803
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


def _reduce(loss: NamedArray, reduction: Reduction, where: Any, axis: AxisSelection | None):
    if reduction is None or reduction == "none":
        return loss if where is None else loss * where
    if reduction in ("mean", hmean):
        return hmean(loss, axis=axis, where=where)
    if reduction in ("sum", hsum):
        return hsum(loss, axis=axis, where=where)
    if callable(reduction):
        return reduction(loss, axis=axis, where=where)
    raise ValueError(f"reduction must be 'mean', 'sum', None or a callable, got {reduction!r}")


def cross_entropy_loss(
    logits: NamedArray,
    Label: AxisSelector,  # noqa: N803
    targets: NamedArray,
    *,
    reduction: Reduction = "mean",
    where: NamedArray | None = None,
    reduction_axis: AxisSelection | None = None,
    z_loss_weight: float = 0.0,
) -> NamedArray:
    """Cross-entropy over `Label`, plus `z_loss_weight * log_z**2` (PaLM's z-loss) if nonzero.

    `where` (bool, aligned by name) masks examples out; with `reduction="mean"` the mean is over
    the unmasked ones. `reduction_axis=None` reduces every remaining axis.
    """
    loss, log_z = cross_entropy_loss_and_log_normalizers(logits, Label, targets)
    if z_loss_weight:
        loss = loss + z_loss_weight * log_z * log_z
    return _reduce(loss, reduction, where, reduction_axis)
