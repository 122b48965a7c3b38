"""Optimizer step cost: Meltemi transforms vs optax.adamw, measured in the same run.

Prints one JSON object: per-step milliseconds of a jitted `update + apply_updates` on a small
transformer-shaped parameter tree (~1M parameters, float32, CPU), and ratios to optax.adamw.
Each figure is the best of 3 rounds of 50 steps; rounds interleave the cases, so load on the
machine hits all alike.

Run: ./bazelw run //levanter:optim_bench
"""

from __future__ import annotations

import json
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from meltemi.levanter import optim  # noqa: E402

LAYERS, EMBED, MLP, VOCAB = 4, 128, 512, 1024


def _params():
    keys = iter(jax.random.split(jax.random.key(0), 16))
    return {
        "embed": jax.random.normal(next(keys), (VOCAB, EMBED)) * 0.02,
        "layers": {
            "attn_qkv": jax.random.normal(next(keys), (LAYERS, EMBED, 3 * EMBED)) * 0.02,
            "attn_o": jax.random.normal(next(keys), (LAYERS, EMBED, EMBED)) * 0.02,
            "mlp_up": jax.random.normal(next(keys), (LAYERS, EMBED, MLP)) * 0.02,
            "mlp_down": jax.random.normal(next(keys), (LAYERS, MLP, EMBED)) * 0.02,
            "norm": jnp.ones((LAYERS, EMBED)),
        },
        "lm_head": jax.random.normal(next(keys), (EMBED, VOCAB)) * 0.02,
    }


def _stacked_dims(path, leaf):
    """Plain stacked arrays `[layers, in, out]`: a batch of matrices (no axis names here)."""
    if "embed" in path or "lm_head" in path or leaf.ndim < 2:
        return None
    return optim.MuonDimensionNumbers(leaf.ndim - 2, leaf.ndim - 1)


def _optax_stacked_dims(params):
    return jax.tree_util.tree_map_with_path(
        lambda p, x: _stacked_dims(jax.tree_util.keystr(p), x), params
    )


def _compile(tx, params):
    tx = optax.with_extra_args_support(tx)

    @jax.jit
    def step(p, s, g, loss):
        u, s = tx.update(g, s, p, loss=loss)
        return optax.apply_updates(p, u), s

    grads = jax.tree.map(lambda x: jnp.cos(x) * 1e-2, params)
    state = tx.init(params)
    p, state = step(params, state, grads, jnp.float32(2.0))  # compile
    jax.block_until_ready(p)
    return step, p, state, grads


def _time(case, steps=50):
    step, p, state, grads = case
    start = time.perf_counter()
    for i in range(steps):
        p, state = step(p, state, grads, jnp.float32(2.0 + 0.001 * i))
    jax.block_until_ready(p)
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    params = _params()
    n = sum(x.size for x in jax.tree.leaves(params))
    schedule = optim.wsd_schedule(3e-4, 1000, warmup=0.01, decay=0.4)
    marin, _ = optim.build_optimizer(
        {"learning_rate": 3e-4, "total_steps": 1000, "lr_schedule": "linear", "decay": 0.4,
         "weight_decay": 0.1, "adamc": "decay", "max_grad_norm": 0.2, "update_clip_window": 128,
         "skip_step_window": 128, "ema_beta": 0.995}
    )  # fmt: skip
    cases = {
        "optax_adamw": optax.adamw(
            schedule, b2=0.95, weight_decay=0.1, mask=optim.decay_mask(params)
        ),
        "adamw": optim.adamw(schedule, weight_decay=0.1),
        "adamw_adamc": optim.adamw(schedule, weight_decay=0.1, adamc="decay"),
        "marin_chain": marin,
        "muon": optim.muon(0.02, adam_learning_rate=3e-4, dimension_numbers=_stacked_dims),
        "optax_contrib_muon": optax.contrib.muon(
            0.02,
            adam_learning_rate=3e-4,
            adam_b2=0.95,
            muon_weight_dimension_numbers=_optax_stacked_dims,
        ),
    }
    compiled = {name: _compile(tx, params) for name, tx in cases.items()}
    ms = {name: float("inf") for name in cases}
    for _ in range(3):
        for name, case in compiled.items():
            ms[name] = min(ms[name], _time(case))
    base = ms["optax_adamw"]
    print(
        json.dumps(
            {
                "params": n,
                "step_ms": {k: round(v, 3) for k, v in ms.items()},
                "ratio_to_optax_adamw": {k: round(v / base, 2) for k, v in ms.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
