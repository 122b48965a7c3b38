"""AdamW with decoupled weight decay, a path-pattern decay mask, and AdamC.

`adamw` is `optax.chain(optax.scale_by_adam, add_decayed_weights, scale_by_learning_rate)`, the
same recipe as `optax.adamw` (so numerics match it), with two additions: the decay mask
defaults to "no decay on norms, biases and embeddings" by parameter path, and the decay can be
AdamC's `wd * lr_t / lr_max`, so the decay applied per step, `lr_t * wd_t`, scales with
`lr_t ** 2 / lr_max`, either always or only during decay phases.

AdamC is from A. Defazio, "Why Gradients Rapidly Increase Near the End of Training", 2025
(arXiv:2506.02285). Its argument holds for weights followed by a normalisation layer, so the
paper corrects the hidden linear layers and not the output layer: by default the correction
skips the paths in `DEFAULT_NO_ADAMC_PATTERNS` (the output head and, when tied, the
embedding), which keep plain decay; `adamc_mask=` chooses otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax

from meltemi.levanter.optim._errors import OptimizerConfigError
from meltemi.levanter.optim._metrics import register_metrics
from meltemi.levanter.optim._named import map_params_with_path

ScalarOrSchedule = float | Callable[[jax.Array], jax.Array]
AdamCMode = Literal["off", "always", "decay"]
ADAMC_MODES: tuple[str, ...] = ("off", "always", "decay")

#: Parameters whose `/`-joined path matches one of these (re.search, lower-cased) get no decay.
DEFAULT_NO_DECAY_PATTERNS: tuple[str, ...] = (
    r"norm",
    r"bias",
    r"embed",
    r"(^|/)ln(_[^/]*)?(/|$)",
    r"(^|/)w[pt]e(/|$)",
)


#: Decayed parameters whose path matches one of these keep plain decay under AdamC: the output
#: layer (and embeddings, the output layer when tied), as in Defazio 2025 (arXiv:2506.02285).
DEFAULT_NO_ADAMC_PATTERNS: tuple[str, ...] = (
    r"lm_head",
    r"embed",
    r"(^|/)w[pt]e(/|$)",
)


def decay_mask(params: Any, no_decay: Sequence[str] = DEFAULT_NO_DECAY_PATTERNS) -> Any:
    """True for parameters that get weight decay: those whose path matches no `no_decay` regex.

    Paths are `/`-joined keys, attribute names and indices, lower-cased
    (`layers/0/attn/q_proj/weight`); a NamedArray is one parameter.

    Example:
        >>> import jax.numpy as jnp
        >>> p = {"attn": {"weight": jnp.ones((3, 5)), "bias": jnp.ones(5)},
        ...      "final_norm": {"weight": jnp.ones(5)}, "embed": jnp.ones((7, 5))}
        >>> decay_mask(p)
        {'attn': {'bias': False, 'weight': True}, 'embed': False, 'final_norm': {'weight': False}}
    """
    compiled = [re.compile(pat) for pat in no_decay]
    return map_params_with_path(
        lambda path, _: not any(c.search(path.lower()) for c in compiled), params
    )


def _resolve_mask(
    mask: Any, params: Any, default: Sequence[str] = DEFAULT_NO_DECAY_PATTERNS
) -> Any:
    if mask is None:
        return decay_mask(params, default)
    if isinstance(mask, str):
        raise OptimizerConfigError(
            f"mask={mask!r} is a string; pass a tuple of path regexes, e.g. mask=({mask!r},)"
        )
    if isinstance(mask, (list, tuple)) and all(isinstance(m, str) for m in mask):
        return decay_mask(params, mask)
    if callable(mask):
        return mask(params)
    return mask


def _lr_max(learning_rate: ScalarOrSchedule, lr_max: float | None, field: str) -> float:
    if lr_max is not None:
        if lr_max <= 0:
            raise OptimizerConfigError(f"lr_max={lr_max!r} must be > 0")
        return float(lr_max)
    if not callable(learning_rate):
        return float(learning_rate)
    peak = getattr(learning_rate, "peak", None)
    if peak is None:
        raise OptimizerConfigError(
            f"{field}: AdamC needs the schedule's peak learning rate; this schedule has no "
            f"`.peak`, so pass it: lr_max=3e-4 (or use a meltemi.levanter.optim.Schedule)"
        )
    return float(peak)


@register_metrics
class WeightDecayState(NamedTuple):
    """State of `add_decayed_weights`: the step count and the decay applied at the last step."""

    count: jax.Array
    weight_decay: jax.Array

    def _metrics(self) -> dict[str, jax.Array]:
        return {"weight_decay": self.weight_decay}


def add_decayed_weights(
    weight_decay: float,
    mask: Any = None,
    *,
    adamc: AdamCMode = "off",
    adamc_mask: Any = None,
    learning_rate: ScalarOrSchedule | None = None,
    lr_max: float | None = None,
) -> optax.GradientTransformation:
    """Adds `wd_t * param` to the update (decoupled decay when followed by the lr scaling).

    Args:
        weight_decay: the decay rate `wd`.
        mask: None (default patterns: no decay on norms, biases, embeddings), a sequence of
            path regexes to exclude, a bool pytree (prefix of params), or `params -> pytree`.
        adamc: "off": `wd_t = wd`; "always": `wd_t = wd * lr_t / lr_max`; "decay": AdamC only
            where `learning_rate.in_decay(t)` (a `Schedule`), plain `wd` elsewhere.
        adamc_mask: which decayed parameters AdamC corrects (the others keep `wd`): None
            (default: all but `DEFAULT_NO_ADAMC_PATTERNS`, the output head, as in Defazio
            2025), path regexes to exclude, a bool pytree or `params -> pytree`.
        learning_rate: the schedule the chain applies afterwards (needed by AdamC).
        lr_max: AdamC's reference lr; default the schedule's `.peak`.

    Example:
        >>> import jax.numpy as jnp
        >>> tx = add_decayed_weights(0.5, mask=())
        >>> u, _ = tx.update({"w": jnp.zeros(2)}, tx.init(None), {"w": jnp.array([2.0, 4.0])})
        >>> u["w"].tolist()
        [1.0, 2.0]
    """
    if adamc not in ADAMC_MODES:
        raise OptimizerConfigError(f"adamc={adamc!r} is not one of {ADAMC_MODES}")
    if adamc != "off":
        if learning_rate is None:
            raise OptimizerConfigError(
                f"adamc={adamc!r} needs the learning rate: "
                f"add_decayed_weights(wd, adamc={adamc!r}, learning_rate=schedule)"
            )
        peak = _lr_max(learning_rate, lr_max, "add_decayed_weights")
        if adamc == "decay" and not hasattr(learning_rate, "in_decay"):
            raise OptimizerConfigError(
                "adamc='decay' needs a schedule that knows its decay phases "
                "(a meltemi.levanter.optim.Schedule, e.g. wsd_schedule(...)); "
                "got a plain callable; use adamc='always' for it"
            )
    lr_fn = learning_rate if callable(learning_rate) else (lambda _: learning_rate)

    def effective_wd(count: jax.Array) -> jax.Array:
        wd = jnp.float32(weight_decay)
        if adamc == "off":
            return wd
        corrected = wd * jnp.asarray(lr_fn(count), jnp.float32) / jnp.float32(peak)
        if adamc == "always":
            return corrected
        return jnp.where(learning_rate.in_decay(count), corrected, wd)

    def init_fn(params: Any) -> WeightDecayState:
        del params
        return WeightDecayState(jnp.zeros((), jnp.int32), jnp.zeros((), jnp.float32))

    def update_fn(updates: Any, state: WeightDecayState, params: Any = None):
        if params is None:
            raise ValueError(
                "add_decayed_weights needs params: call tx.update(updates, state, params)"
            )
        wd = effective_wd(state.count)
        plain = jnp.float32(weight_decay)
        mask_tree = _resolve_mask(mask, params)
        if adamc == "off":
            adamc_tree = jax.tree.map(lambda _: False, mask_tree)
        else:
            adamc_tree = _resolve_mask(adamc_mask, params, DEFAULT_NO_ADAMC_PATTERNS)

        def decay(m: bool, corrected: bool, g: Any, p: Any) -> Any:
            if not m:
                return g
            rate = wd if corrected else plain
            return jax.tree.map(lambda a, b: a + rate.astype(b.dtype) * b, g, p)

        updates = jax.tree.map(decay, mask_tree, adamc_tree, updates, params)
        count = optax.safe_increment(state.count)
        return updates, WeightDecayState(count, wd)

    return optax.GradientTransformation(init_fn, update_fn)


@register_metrics
class LearningRateState(NamedTuple):
    """State of `scale_by_learning_rate`: the step count and the lr applied at the last step."""

    count: jax.Array
    learning_rate: jax.Array

    def _metrics(self) -> dict[str, jax.Array]:
        return {"learning_rate": self.learning_rate}


def scale_by_learning_rate(learning_rate: ScalarOrSchedule) -> optax.GradientTransformation:
    """Multiplies updates by `-learning_rate(count)` (as optax's) and records the lr used.

    Example:
        >>> import jax.numpy as jnp
        >>> tx = scale_by_learning_rate(0.1)
        >>> u, s = tx.update({"w": jnp.ones(2)}, tx.init(None))
        >>> u["w"].tolist(), round(float(s.learning_rate), 6)
        ([-0.10000000149011612, -0.10000000149011612], 0.1)
    """
    lr_fn = learning_rate if callable(learning_rate) else (lambda _: learning_rate)

    def init_fn(params: Any) -> LearningRateState:
        del params
        return LearningRateState(jnp.zeros((), jnp.int32), jnp.zeros((), jnp.float32))

    def update_fn(updates: Any, state: LearningRateState, params: Any = None):
        del params
        step_size = -1 * lr_fn(state.count)
        updates = jax.tree.map(lambda g: jnp.array(step_size, dtype=g.dtype) * g, updates)
        lr = jnp.asarray(lr_fn(state.count), jnp.float32)
        return updates, LearningRateState(optax.safe_increment(state.count), lr)

    return optax.GradientTransformation(init_fn, update_fn)


def adamw(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.95,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    mask: Any = None,
    *,
    adamc: AdamCMode = "off",
    adamc_mask: Any = None,
    lr_max: float | None = None,
    eps_root: float = 0.0,
    mu_dtype: Any = None,
    nesterov: bool = False,
) -> optax.GradientTransformation:
    """AdamW: Adam scaling, decoupled (optionally AdamC) weight decay, then `-lr`.

    Numerically the recipe of `optax.adamw` (given the same mask); see `add_decayed_weights`
    for `mask`, `adamc`, `adamc_mask` and `lr_max`; `mu_dtype` is the first moment's dtype.

    Example:
        >>> import jax.numpy as jnp
        >>> tx = adamw(1e-2, weight_decay=0.1)
        >>> params = {"w": jnp.ones((3, 5)), "norm": jnp.ones(5)}
        >>> updates, state = tx.update(params, tx.init(params), params)
        >>> round(float(updates["w"][0, 0]), 6), round(float(updates["norm"][0]), 6)
        (-0.011, -0.01)
    """
    return optax.chain(
        optax.scale_by_adam(
            b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype, nesterov=nesterov
        ),
        add_decayed_weights(
            weight_decay, mask, adamc=adamc, adamc_mask=adamc_mask, learning_rate=learning_rate,
            lr_max=lr_max,
        ),
        scale_by_learning_rate(learning_rate),
    )  # fmt: skip
