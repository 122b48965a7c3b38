"""Forward+backward time of an MLP block and an attention block: named vs hand-written jnp.

Run: `bazel run //haliax:bench` (add `-- --quick` for a short run). Prints one JSON object.

Estimator (the machine is shared, so single timings swing by 10%): every round times, back to
back and in an order that cycles through all 6 permutations (rounds are a multiple of 6), the
named step, the jnp step, and the jnp step again (an A/A control, same executable). Rounds are
short (4 calls) so the two sides of a pair see the same load. A round's ratio is named / jnp
for that round, so load that changes between rounds cancels. `overhead_ratio` (the goal,
<= 1.005) is the MEDIAN over rounds of (named MLP + named attention) / (jnp MLP + jnp
attention). Best-of ratios are reported too, and
`aa_ratio` (jnp / jnp again) shows the noise floor: a named/jnp gap inside the A/A spread is not
a measured difference. `hlo_ops` lists compiled op counts side by side, so a real slowdown (an
extra transpose or copy) shows there whatever the timings say.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import named_vs_jnp as B

GOAL = 1.005


def _timer(fn, args, inner: int):
    def run():
        t0 = time.perf_counter()
        for _ in range(inner):
            out = fn(*args)
        jax.block_until_ready(out)
        return (time.perf_counter() - t0) / inner

    run()  # compile + warm up
    return run


def _quartiles(xs: list[float]) -> list[float]:
    q = statistics.quantiles(xs, n=4)
    return [round(q[0], 4), round(q[2], 4)]


def _steps(sizes: B.Sizes) -> dict:
    """Per block: (named jitted step, its args, jnp jitted step, its args)."""
    mlp, attn, x = B.make(sizes)
    steps = {}
    for name, block, fn, params in (
        ("mlp", mlp, B.jnp_mlp_block, B.mlp_params),
        ("attention", attn, B.jnp_attn_block, B.attn_params),
    ):
        named_loss = jax.value_and_grad(B.named_loss)
        jnp_loss = jax.value_and_grad(B.jnp_loss(fn))
        steps[name] = (named_loss, (block, x), jnp_loss, (params(block), jnp.asarray(x.array)))
    return steps


def _measure(steps: dict, rounds: int, inner: int) -> dict:
    """Interleaved rounds: per block and round, named, jnp and jnp-again times (seconds)."""
    timers = {
        name: (_timer(jax.jit(nf), na, inner), _timer(jax.jit(mf), ma, inner))
        for name, (nf, na, mf, ma) in steps.items()
    }
    times = {name: {"named": [], "jnp": [], "jnp_again": []} for name in steps}
    kinds = ("named", "jnp", "jnp_again")
    for r in range(rounds):
        order = kinds[r % 3 :] + kinds[: r % 3]
        if (r // 3) % 2:
            order = order[::-1]
        for name, (tn, tm) in timers.items():
            for k in order:
                times[name][k].append((tn if k == "named" else tm)())
    return times


def _summarise(times: dict) -> dict:
    out = {}
    for name, t in times.items():
        ratios = [n / m for n, m in zip(t["named"], t["jnp"])]
        aa = [a / m for a, m in zip(t["jnp_again"], t["jnp"])]
        out[name] = {
            "named_best_ms": round(min(t["named"]) * 1e3, 4),
            "jnp_best_ms": round(min(t["jnp"]) * 1e3, 4),
            "best_of_ratio": round(min(t["named"]) / min(t["jnp"]), 4),
            "median_ratio": round(statistics.median(ratios), 4),
            "ratio_iqr": _quartiles(ratios),
            "aa_median_ratio": round(statistics.median(aa), 4),
            "aa_iqr": _quartiles(aa),
        }
    return out


def _total_ratios(times: dict, a: str, b: str) -> list[float]:
    rounds = len(next(iter(times.values()))[a])
    return [
        sum(t[a][r] for t in times.values()) / sum(t[b][r] for t in times.values())
        for r in range(rounds)
    ]


def _hlo_ops(steps: dict) -> dict:
    return {
        name: {"named": B.hlo_op_counts(nf, *na), "jnp": B.hlo_op_counts(mf, *ma)}
        for name, (nf, na, mf, ma) in steps.items()
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes and few repetitions")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 60)")
    a = p.parse_args()
    if a.quick:
        sizes, rounds, inner = B.Sizes(), 6, 5
    else:
        sizes = B.Sizes(batch=4, pos=128, embed=256, mlp=704, heads=8, kv_heads=4, head_size=32)
        rounds, inner = 60, 4
    if a.rounds is not None:
        if a.rounds < 6 or a.rounds % 6:
            raise SystemExit(
                f"error: --rounds={a.rounds}: use a multiple of 6 (>= 6), e.g. --rounds=60, so "
                f"every order of named/jnp/jnp-again is timed equally often"
            )
        rounds = a.rounds
    steps = _steps(sizes)
    times = _measure(steps, rounds, inner)
    blocks = _summarise(times)
    total = _total_ratios(times, "named", "jnp")
    aa_total = _total_ratios(times, "jnp_again", "jnp")
    best_n = sum(min(t["named"]) for t in times.values())
    best_m = sum(min(t["jnp"]) for t in times.values())
    tiny = _summarise(_measure(_steps(B.Sizes()), 6, 20))
    overhead = round(statistics.median(total), 4)
    print(
        json.dumps(
            {
                "bench": "haliax named vs jnp, forward+backward",
                "date": datetime.datetime.now().isoformat(timespec="minutes"),
                "machine": f"{platform.machine()} {jax.default_backend()} x{jax.device_count()}",
                "load_avg_1m": round(os.getloadavg()[0], 2),
                "sizes": sizes.__dict__,
                "rounds": rounds,
                "calls_per_round": inner,
                "blocks": blocks,
                "overhead_ratio": overhead,
                "overhead_ratio_statistic": "median over rounds of named/jnp (MLP+attention)",
                "overhead_ratio_iqr": _quartiles(total),
                "best_of_ratio": round(best_n / best_m, 4),
                "aa_ratio": round(statistics.median(aa_total), 4),
                "aa_ratio_iqr": _quartiles(aa_total),
                "goal": f"overhead_ratio <= {GOAL}",
                "goal_met": overhead <= GOAL,
                "hlo_ops": _hlo_ops(steps),
                # Per-call Python dispatch cost (flattening the module pytree), visible only
                # when the compiled work is tiny (3x13x32): per jitted call, not per op.
                "dispatch_overhead_us_per_call": round(
                    sum(r["named_best_ms"] - r["jnp_best_ms"] for r in tiny.values())
                    / len(tiny)
                    * 1e3,
                    1,
                ),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
