"""The train step: one jitted function from (state, batch) to (state, metrics).

forward -> loss (with z-loss) -> `value_and_grad` (accumulated over microbatches) ->
optimizer update (clipping, skip-step, EMA live in the optimizer chain) -> new state.
The state's buffers are donated, so parameters and optimizer state are updated in place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from meltemi.levanter.runtime import cast_floating

Batch = Mapping[str, jax.Array]
# loss_fn(model, batch) -> mean loss over the batch's loss tokens (a scalar).
LossFn = Callable[[Any, Batch], jax.Array]


class TrainState(eqx.Module):
    """Everything a step changes: the step count, the parameters and the optimizer state.

    Attributes:
        step: completed steps (int32 scalar); the next step reads the batch of this index.
        params: the model's arrays (`eqx.partition(model, eqx.is_array)[0]`).
        opt_state: the optimizer's state (EMA, skip-step history, ... included).
        reference: a frozen reference model's arrays (DPO/IPO with `trainer.reference=
            "live"`), passed to the loss with gradients stopped and never updated; None
            otherwise. Checkpointed with the state, so a resumed run needs no reload.
    """

    step: jax.Array
    params: Any
    opt_state: Any
    reference: Any = None


def init_state(
    params: Any, optimizer: optax.GradientTransformation, *, reference: bool = False
) -> TrainState:
    """The state before the first step (with `reference`, a copy of `params` is the frozen
    reference model).

    Example:
        >>> import jax.numpy as jnp, optax
        >>> state = init_state({"w": jnp.zeros(3)}, optax.sgd(0.1))
        >>> int(state.step)
        0
    """
    ref = jax.tree.map(jnp.copy, params) if reference else None
    return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params), ref)


def token_weight(batch: Batch) -> jax.Array:
    """How many loss tokens a (micro)batch holds: the weight of its mean loss (for a batch of
    preference pairs, how many pairs: its loss is a mean over pairs)."""
    if "pair_ids" in batch:
        ids = batch["pair_ids"]
        starts = (ids > 0) & (ids != jnp.pad(ids, [(0, 0)] * (ids.ndim - 1) + [(1, 0)])[..., :-1])
        return jnp.sum(starts.astype(jnp.float32))
    if "loss_mask" in batch:
        return jnp.sum(batch["loss_mask"].astype(jnp.float32))
    return jnp.asarray(batch["tokens"].size, jnp.float32)


def split_microbatches(batch: Batch, microbatches: int) -> Batch:
    """Reshapes every (B, ...) array to (microbatches, B / microbatches, ...).

    Row `i * microbatches + j` goes to microbatch `j`, so each device (which holds a contiguous
    block of rows) contributes equally to every microbatch and no data moves between devices.

    Example:
        >>> import jax.numpy as jnp
        >>> split_microbatches({"tokens": jnp.arange(6)[:, None]}, 2)["tokens"][:, :, 0].tolist()
        [[0, 2, 4], [1, 3, 5]]
    """

    def split(x):
        rows = x.shape[0]
        x = x.reshape((rows // microbatches, microbatches) + x.shape[1:])
        return jnp.swapaxes(x, 0, 1)

    return {k: split(v) for k, v in batch.items()}


def loss_and_grads(
    loss_fn: LossFn,
    static: Any,
    params: Any,
    batch: Batch,
    *,
    microbatches: int = 1,
    compute_dtype: Any = jnp.float32,
    has_aux: bool = False,
    reference: Any = None,
) -> tuple[jax.Array, Any] | tuple[jax.Array, Any, dict[str, jax.Array]]:
    """Mean loss over the batch's loss tokens and its gradient in the parameters' dtype.

    With `microbatches > 1` the batch is processed in a `scan`, accumulating gradients in
    float32 weighted by each microbatch's loss-token count, so the result is the gradient of
    the whole batch's mean loss (up to summation order).

    With `has_aux`, `loss_fn` returns `(loss, metrics)` and so does this, as `(loss, grads,
    metrics)` (metrics weighted like the loss). With `reference` (arrays of a frozen model),
    `loss_fn(model, batch, reference_model)` gets that model cast like the policy, with its
    gradients stopped.
    """

    def micro_loss(p, micro):
        model = eqx.combine(cast_floating(p, compute_dtype), static)
        if reference is None:
            out = loss_fn(model, micro)
        else:
            ref = jax.lax.stop_gradient(cast_floating(reference, compute_dtype))
            out = loss_fn(model, micro, eqx.combine(ref, static))
        loss, aux = out if has_aux else (out, {})
        return loss.astype(jnp.float32), aux

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)
    if microbatches == 1:
        (loss, aux), grads = grad_fn(params, batch)
        return (loss, grads, aux) if has_aux else (loss, grads)

    micro = split_microbatches(batch, microbatches)
    total = token_weight(batch)

    def body(carry, mb):
        loss_acc, grad_acc, aux_acc = carry
        (loss, aux), grads = grad_fn(params, mb)
        w = token_weight(mb) / jnp.maximum(total, 1.0)
        grad_acc = jax.tree.map(lambda a, g: a + w * g.astype(jnp.float32), grad_acc, grads)
        aux_acc = jax.tree.map(lambda a, m: a + w * m.astype(jnp.float32), aux_acc, aux)
        return (loss_acc + w * loss, grad_acc, aux_acc), None

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    first = jax.tree.map(lambda x: x[0], micro)
    aux_zeros = jax.tree.map(
        lambda s: jnp.zeros(s.shape, jnp.float32), jax.eval_shape(grad_fn, params, first)[0][1]
    )
    init = (jnp.zeros((), jnp.float32), zeros, aux_zeros)
    (loss, grads, aux), _ = jax.lax.scan(body, init, micro)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    return (loss, grads, aux) if has_aux else (loss, grads)


def make_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    static: Any,
    *,
    microbatches: int = 1,
    compute_dtype: Any = jnp.float32,
    metrics_fn: Callable[[Any], Mapping[str, jax.Array]] | None = None,
    state_sharding: Any = None,
    batch_sharding: Any = None,
    mesh: Any = None,
    jit: bool = True,
    has_aux: bool = False,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]:
    """Builds the jitted step `(state, batch) -> (state, metrics)`, donating `state`.

    Args:
        loss_fn: `loss_fn(model, batch)` -> mean loss (z-loss included) over loss tokens.
        optimizer: the optax transform (called with `loss=` when it accepts extra args).
        static: the model's non-array part (`eqx.partition(model, eqx.is_array)[1]`).
        microbatches: gradient accumulation factor; must divide the batch size.
        compute_dtype: dtype the parameters are cast to for the forward/backward pass
            (parameters, gradients and optimizer state stay in their own dtype).
        metrics_fn: extracts logged scalars from the new optimizer state.
        state_sharding: shardings of the state (in and out); None lets jit decide.
        batch_sharding: shardings of the batch.
        mesh: the mesh (metrics are replicated on it); needed with `state_sharding`.
        jit: return the un-jitted function (for `jax.eval_shape` or composition).
        has_aux: `loss_fn` returns `(loss, metrics)`; the metrics are logged as `train/<k>`.
            A state holding a `reference` passes its model to `loss_fn` (see
            `loss_and_grads`).

    Returns:
        The step. Metrics: `train/loss`, `optim/grad_norm` (of this step's gradients, before
        any clipping), `optim/update_norm` (of the update applied: 0 on a skipped step),
        `optim/skipped`, plus whatever `metrics_fn` reports (prefixed `optim/`; the step's own
        four names always hold the step's own values).

    Example:
        >>> import equinox as eqx, jax, jax.numpy as jnp, optax
        >>> model = eqx.nn.Linear(3, 1, key=jax.random.key(0))
        >>> params, static = eqx.partition(model, eqx.is_array)
        >>> loss = lambda m, b: jnp.mean((jax.vmap(m)(b["x"])[:, 0] - b["y"]) ** 2)
        >>> step = make_train_step(loss, optax.sgd(0.1), static)
        >>> batch = {"x": jnp.ones((5, 3)), "y": jnp.zeros(5)}
        >>> state, metrics = step(init_state(params, optax.sgd(0.1)), batch)
        >>> int(state.step), sorted(metrics)[:2]
        (1, ['optim/grad_norm', 'optim/skipped'])
    """
    takes_extra = isinstance(optimizer, optax.GradientTransformationExtraArgs)

    def step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        out = loss_and_grads(
            loss_fn,
            static,
            state.params,
            batch,
            microbatches=microbatches,
            compute_dtype=compute_dtype,
            has_aux=has_aux,
            reference=state.reference,
        )
        loss, grads = out[:2]
        aux = out[2] if has_aux else {}
        if takes_extra:
            updates, opt_state = optimizer.update(grads, state.opt_state, state.params, loss=loss)
        else:
            updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        extra = dict(metrics_fn(opt_state)) if metrics_fn is not None else {}
        skipped = jnp.asarray(extra.pop("skip/skipped", 0), jnp.float32)
        metrics = {f"optim/{k}": v for k, v in extra.items()}
        metrics.update({f"train/{k}": v for k, v in aux.items()})
        # The step's own measurements go last: an optimizer metric of the same name (e.g. a
        # norm held in a state that a skipped step froze) must never replace them.
        metrics.update(
            {
                "train/loss": loss,
                "optim/grad_norm": optax.tree.norm(grads),
                "optim/update_norm": optax.tree.norm(updates),
                "optim/skipped": skipped,
            }
        )
        return TrainState(state.step + 1, params, opt_state, state.reference), metrics

    if not jit:
        return step
    if state_sharding is None:
        return jax.jit(step, donate_argnums=(0,))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return jax.jit(
        step,
        donate_argnums=(0,),
        in_shardings=(state_sharding, batch_sharding),
        out_shardings=(state_sharding, replicated),
    )
