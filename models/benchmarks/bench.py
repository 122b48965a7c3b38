"""Model benchmarks, measured in one run (print JSON; not a test).

    bazel run //models:bench            # or: python models/benchmarks/bench.py --quick

* forward+backward tokens/s of small Llama, Qwen3 and MoE configs;
* model FLOPs per token from XLA's `cost_analysis` of the train step (lowered with unrolled
  layers) vs the analytic `6N + attention` count (`meltemi.models.flops_per_token`);
* MoE dropless vs capacity path (tokens/s, same weights);
* decode tokens/s with the KV cache vs recomputing the sequence each step;
* compiled `generate` tokens/s against `transformers`' eager `generate` and its static cache +
  `torch.compile` recipe at batch 1 and 8, on three Llama shapes up to 162M parameters
  (`generate_bench.py`; headline `generate_vs_fastest_transformers_bs{1,8}` at the largest,
  per shape under `generate_shapes`);
* `hf.load` of a 1.7 GB bfloat16 Llama onto 8 CPU devices (FSDP): peak host memory over the
  checkpoint's bytes and time, against `transformers`' `from_pretrained` (`hf_load_bench.py`),
  and by two `jax.distributed` processes of 4 devices each (bytes fetched per process);
* collective bytes per device of an MoE forward pass at expert parallelism 1-8, all-to-all
  dispatch vs the gather-based layout (`moe_ep_bench.py`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time

import equinox as eqx
import generate_bench
import hf_load_bench
import jax
import moe_ep_bench
import numpy as np

import meltemi.models as mm

BATCH, SEQ = 4, 128


def _config(name: str, quick: bool) -> mm.ModelConfig:
    base = mm.get_preset(name)
    size = dict(hidden_dim=128, num_heads=4, num_kv_heads=2, head_dim=32, num_layers=4)
    if quick:
        size.update(num_layers=2, hidden_dim=64, head_dim=16)
    cfg = base.replace(vocab_size=1024, intermediate_dim=256, max_seq_len=512, **size)
    if cfg.moe is not None:
        cfg = cfg.replace(moe=cfg.moe.replace(num_experts=8, top_k=2, expert_dim=128))
    return cfg


def _model(cfg: mm.ModelConfig) -> mm.Transformer:
    return mm.init(cfg, key=jax.random.key(0))


def _best_time(fn, repeats: int) -> float:
    fn()  # compile + warm up
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t)
    return best


def train_step(cfg: mm.ModelConfig, tokens: np.ndarray, repeats: int) -> dict:
    model = _model(cfg)
    step = eqx.filter_jit(eqx.filter_value_and_grad(lambda m, t: m.loss(t)))
    seconds = _best_time(lambda: step(model, tokens), repeats)
    analytic = mm.flops_per_token(cfg, tokens.shape[1])
    xla_flops = _xla_flops_per_token(cfg, tokens)
    return {
        "params": mm.param_count(cfg),
        "tokens_per_s": round(tokens.size / seconds, 1),
        "xla_flops_per_token": round(xla_flops),
        "analytic_6n_attention_flops_per_token": round(analytic),
        "xla_over_analytic": round(xla_flops / analytic, 3),
        "xla_over_analytic_remat_none": round(
            _xla_flops_per_token(cfg.replace(remat="none"), tokens) / analytic, 3
        ),
    }


def _xla_flops_per_token(cfg: mm.ModelConfig, tokens: np.ndarray) -> float:
    # XLA's cost analysis counts a scan body once, so count FLOPs on the unrolled model.
    unrolled = eqx.filter_eval_shape(
        mm.Transformer.init, cfg.replace(scan_layers=False), key=jax.random.key(0)
    )
    grad = jax.jit(jax.value_and_grad(lambda m, t: m.loss(t)))
    cost = grad.lower(unrolled, tokens).cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost.get("flops", float("nan"))) / tokens.size


def decode(cfg: mm.ModelConfig, repeats: int, new_tokens: int) -> dict:
    model = _model(cfg)
    prompts = [list(range(1, 33)), list(range(5, 21))]
    out = {}
    for use_cache in (True, False):
        seconds = _best_time(
            lambda uc=use_cache: mm.generate(
                model, prompts, max_new_tokens=new_tokens, eos_token_id=None, use_cache=uc
            ),
            repeats,
        )
        out["cached" if use_cache else "recompute"] = round(len(prompts) * new_tokens / seconds, 1)
    out["cache_speedup"] = round(out["cached"] / out["recompute"], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller configs, one repeat")
    args = parser.parse_args()
    repeats = 1 if args.quick else 3
    tokens = np.random.default_rng(0).integers(0, 1024, (BATCH, SEQ)).astype(np.int32)
    results: dict = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()} {jax.device_count()}x{jax.default_backend()}",
        "batch": BATCH,
        "seq": SEQ,
        "train_step": {},
    }
    for name in ("tiny-llama", "tiny-qwen3", "tiny-mixtral"):
        results["train_step"][name] = train_step(_config(name, args.quick), tokens, repeats)
    moe = _config("tiny-mixtral", args.quick)
    capacity = moe.replace(moe=moe.moe.replace(dispatch="capacity", capacity_factor=1.25))
    results["moe_capacity"] = train_step(capacity, tokens, repeats)
    results["moe_dropless_over_capacity_tokens_per_s"] = round(
        results["train_step"]["tiny-mixtral"]["tokens_per_s"]
        / results["moe_capacity"]["tokens_per_s"],
        3,
    )
    results["decode_tokens_per_s"] = decode(
        _config("tiny-llama", args.quick), repeats, 16 if args.quick else 48
    )
    results.update(generate_bench.measure(quick=args.quick))
    results["hf_load"] = hf_load_bench.measure(quick=args.quick)
    results["hf_load_2proc"] = hf_load_bench.measure_distributed(quick=args.quick)
    results["moe_ep"] = moe_ep_bench.measure()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
