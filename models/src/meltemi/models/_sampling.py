"""Next-token choice from logits: greedy, temperature, top-k and top-p (nucleus) sampling."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from meltemi.models._config import ConfigError


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How `generate` picks each token.

    Attributes:
        temperature: `0` means greedy (argmax); otherwise logits are divided by it.
        top_k: keep only the `top_k` most likely tokens (`None`: all).
        top_p: keep the smallest set of most likely tokens whose probability reaches `top_p`
            (`None` or `1.0`: all).

    >>> SamplingConfig().greedy, SamplingConfig(temperature=0.7, top_p=0.9).greedy
    (True, False)
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError(
                f"SamplingConfig.temperature={self.temperature!r}: must be >= 0 "
                "(0 means greedy). Fix: temperature=0.7"
            )
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"SamplingConfig.top_k={self.top_k!r}: must be >= 1 or None")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError(f"SamplingConfig.top_p={self.top_p!r}: must be in (0, 1] or None")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def filter_logits(logits: jax.Array, *, top_k: int | None, top_p: float | None) -> jax.Array:
    """Sets the logits outside the top-k / top-p set of each row (last axis) to -inf.

    >>> import jax.numpy as jnp
    >>> x = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    >>> jnp.isfinite(filter_logits(x, top_k=None, top_p=0.75)).tolist()
    [[True, True, False, False]]
    >>> jnp.isfinite(filter_logits(x, top_k=1, top_p=None)).tolist()
    [[True, False, False, False]]
    """
    neg_inf = jnp.asarray(-jnp.inf, logits.dtype)
    if top_k is not None and top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, neg_inf, logits)
    if top_p is not None and top_p < 1.0:
        order = jnp.argsort(-logits, axis=-1)
        sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        # Keep a token if the mass strictly before it is below top_p (the first always stays).
        before = jnp.cumsum(probs, axis=-1) - probs
        keep_sorted = before < top_p
        keep = (
            jnp.zeros_like(keep_sorted)
            .at[jnp.arange(logits.shape[0])[:, None], order]
            .set(keep_sorted)
        )
        logits = jnp.where(keep, logits, neg_inf)
    return logits


def argmax(logits: jax.Array) -> jax.Array:
    """`jnp.argmax` over the last axis (the first maximal index; a NaN counts as maximal), as
    int32, computed as a max and then the first index holding it.

    Two plain reductions: XLA's CPU backend runs `argmax`'s (value, index) pair reduction as a
    scalar loop, about as slow as the rest of a small model's decoding step at batch 8.

    >>> import jax.numpy as jnp
    >>> argmax(jnp.array([[0.0, 3.0, 3.0, 1.0], [jnp.nan, 1.0, jnp.nan, 2.0]])).tolist()
    [1, 0]
    """
    top = jnp.max(logits, axis=-1, keepdims=True)
    index = jnp.arange(logits.shape[-1], dtype=jnp.int32)
    hit = (logits == top) | jnp.isnan(logits)
    return jnp.min(jnp.where(hit, index, logits.shape[-1]), axis=-1).astype(jnp.int32)


def sample(logits: jax.Array, key: jax.Array | None, sampling: SamplingConfig) -> jax.Array:
    """One token id per row of `logits` (batch, vocab).

    >>> import jax, jax.numpy as jnp
    >>> sample(jnp.array([[0.0, 3.0, 1.0]]), None, SamplingConfig()).tolist()
    [1]
    """
    logits = logits.astype(jnp.float32)
    if sampling.greedy:
        return argmax(logits)
    if key is None:
        raise ConfigError(
            f"sampling with temperature={sampling.temperature} needs a PRNG key: "
            "generate(..., key=jax.random.key(0))"
        )
    logits = filter_logits(
        logits / sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p
    )
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def sample_rows(
    logits: jax.Array, key: jax.Array, step: jax.Array | int, sampling: SamplingConfig
) -> jax.Array:
    """One token id per row of `logits` (batch, vocab) at decoding step `step`.

    Row `b` draws with `fold_in(fold_in(key, step), b)`: a row's tokens depend only on the
    key, the step and its own index, never on how many rows share the batch (generation pads
    the batch to a bucket).

    >>> import jax, jax.numpy as jnp
    >>> x = jnp.log(jnp.array([[0.1, 0.9], [0.9, 0.1]]))
    >>> sample_rows(x, jax.random.key(0), 0, SamplingConfig()).tolist()
    [1, 0]
    """
    if sampling.greedy:
        return sample(logits, None, sampling)
    step_key = jax.random.fold_in(key, step)
    keys = jax.vmap(lambda b: jax.random.fold_in(step_key, b))(jnp.arange(logits.shape[0]))
    return jax.vmap(lambda row, k: sample(row[None], k, sampling)[0])(logits, keys)
