"""The engine's prefix cache on requests that share a system prompt: the same requests through
one engine with `EngineConfig.prefix_cache` and one without, same weights, same process.

Each request is a shared start (a system prompt) and a short question of its own; they arrive
together, more than the decoding slots hold, so later ones are admitted as earlier ones end
(as a chat server or an eval harness sees them). Reported per side: wall time, prompt tokens
prefilled and read from the cache, mean time to first token; and the ratio. Greedy tokens must
agree between the sides (the run fails otherwise).

    ./bazelw run //models:prefix_bench [-- --quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import tempfile
import time

import generate_bench
import numpy as np
import serve_bench

# (shared prompt tokens, own tokens, new tokens, requests, decoding slots, prefill chunk)
WORKLOADS = {"large": (256, 16, 16, 16, 8, 64), "quick": (24, 5, 4, 6, 2, 8)}


def _model(hf_config: dict):
    """`serve_bench`'s random checkpoint (seed 0), read with `hf.load`."""
    from meltemi.models import hf

    with tempfile.TemporaryDirectory() as tmp:
        serve_bench.write_checkpoint(hf_config, pathlib.Path(tmp), 1024)
        model, _ = hf.load(tmp)
    return model


def _side(model, config, prompts: list[list[int]], new_tokens: int) -> tuple[dict, list]:
    from meltemi.models.engine import Engine, Request

    engine = Engine(model, config)
    engine.warmup()
    start = time.perf_counter()
    ids = [engine.submit(Request(p, new_tokens, stop_ids=())) for p in prompts]
    first: dict[int, float] = {}
    out: dict[int, list[int]] = {i: [] for i in ids}
    while engine.has_work:
        for e in engine.step():
            first.setdefault(e.request_id, time.perf_counter() - start)
            out[e.request_id].append(e.token)
    wall = time.perf_counter() - start
    total = sum(len(p) for p in prompts)
    figures = {
        "wall_s": wall,
        "prompt_tokens": total,
        "cached_prompt_tokens": engine.num_cached_tokens,
        "prefilled_prompt_tokens": total - engine.num_cached_tokens,
        "ttft_mean_s": float(np.mean(list(first.values()))),
        "output_tokens_per_s": len(prompts) * new_tokens / wall,
    }
    return figures, [out[i] for i in ids]


def measure(quick: bool = False) -> dict:
    """Both sides on the workload (`quick`: the toy model and a short one) and their ratios."""
    from meltemi.models.engine import EngineConfig

    shape = "quick" if quick else "large"
    hf_config = (generate_bench.QUICK_SHAPES if quick else generate_bench.SHAPES)[shape]
    shared, own, new_tokens, requests, slots, chunk = WORKLOADS[shape]
    rng = np.random.default_rng(0)
    vocab = hf_config["vocab_size"]
    start = rng.integers(1, vocab, shared).tolist()
    prompts = [start + rng.integers(1, vocab, own).tolist() for _ in range(requests)]
    page = 16 if not quick else 4
    ctx = shared + own + new_tokens
    pages = slots * -(-ctx // page) + -(-ctx // page) + 1  # the slots, one cached prompt, null
    heads, layers = hf_config["num_key_value_heads"], hf_config["num_hidden_layers"]
    page_bytes = 2 * layers * page * heads * hf_config["head_dim"] * 4
    config = EngineConfig(
        kv_bytes=pages * page_bytes, page_size=page, max_seqs=slots, max_seq_len=ctx,
        prefill_chunk=chunk,
    )  # fmt: skip
    model = _model(hf_config)
    out: dict = {
        "shape": shape,
        "workload": dict(
            shared_prompt_tokens=shared,
            own_prompt_tokens=own,
            new_tokens=new_tokens,
            requests=requests,
            max_seqs=slots,
            prefill_chunk=chunk,
            page_size=page,
        ),  # fmt: skip
        "load_average_before": round(os.getloadavg()[0], 1),
    }
    tokens = {}
    for side, cached in (("uncached", False), ("prefix_cache", True)):
        side_config = dataclasses.replace(config, prefix_cache=cached)
        out[side], tokens[side] = _side(model, side_config, prompts, new_tokens)
    if tokens["uncached"] != tokens["prefix_cache"]:
        raise AssertionError("greedy tokens differ between the cached and uncached engines")
    out["greedy_tokens_equal"] = True
    u, c = out["uncached"], out["prefix_cache"]
    out["prefix_cache_vs_uncached_wall"] = u["wall_s"] / c["wall_s"]
    out["prefix_cache_vs_uncached_ttft"] = u["ttft_mean_s"] / c["ttft_mean_s"]
    out["load_average_after"] = round(os.getloadavg()[0], 1)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="the toy model and a short workload")
    args = p.parse_args(argv)
    print(json.dumps(measure(args.quick), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
