"""Generation tokens/s against two `transformers` baselines, measured side by side in one run.

Three random Llama checkpoints, built in `transformers`, saved and read with `hf.load` (so every
side holds the same weights), untied embeddings:

* `small`: `bench.py`'s tiny-llama shape at hidden 256 (4 layers, 4 query / 2 KV heads of 32,
  MLP 256, vocab 1024; 1.7M parameters);
* `wider`: the same with 4/4 heads of 64 and MLP 768 (2.3x the weights);
* `large`: 12 layers, hidden 768, 12/12 heads of 64, MLP 3072, vocab 32000 (162M parameters).

Baselines: `transformers`' eager `generate` (dynamic cache), and its documented fast recipe:
`cache_implementation="static"` with the model's forward compiled by
`torch.compile(model.forward, mode="reduce-overhead", fullgraph=True, dynamic=False)` (inductor;
on CPU `reduce-overhead` adds no CUDA graphs). Greedy, prompts of 16 tokens, no eos, batch 1 and
8; 128 new tokens and 11 rounds (`large`: 32 new tokens and 5 rounds, as one of its calls takes
seconds on two cores). Every side is warmed up at each shape and batch first; `torch.compile`'s
first call (tracing + compiling) is reported apart (`*_first_call_s_*`) and never timed.

A single timing on the shared 2-core VM swings by 2x with the other jobs' load, so the estimate
is paired: each round times the three calls back to back (order rotating between rounds, so a
burst of load hits all), and `generate_vs_<baseline>_bs*` is the median over rounds of that
round's tokens/s ratio (`*_iqr`: its interquartile range; `*_best_of`: the ratio of the two
sides' best calls). Each baseline runs at whichever of torch's default thread count and one
thread was faster in warm-up calls (`*_threads_bs*`). `fastest_transformers_bs*` names the
strongest baseline of the run, the one our paired ratio is lowest against (the less flattering
choice when the two are within noise), and `generate_vs_fastest_transformers_bs*` is that
ratio; the top-level keys of that name are the largest shape's. The greedy
tokens of all three are compared.

The engine (`meltemi.models.engine`) runs the same prompts as a side of its own
(`engine_steps{k}`: `decode_steps=k`, `max_seqs` = the batch, all prompts prefilled in one
chunk, as `generate` prefills them in one pass), timed in the same rounds;
`greedy_tokens_equal_engine_steps{k}` compares its tokens with ours.

Roofline, measured in the same run before each shape's timed rounds and again after each batch's
(`read_bandwidth_gb_s_probes`, with `probe_load_averages`), each figure the best over those
probes: the read bandwidth a jitted `jnp.sum` over a float32 buffer far larger than the caches
reaches (`read_bandwidth_gb_s`, best of 9 per probe) and the float32 matmul peak of a jitted
square matmul (`matmul_peak_gflop_s`, best of 9). Beside them, not in the bound, the read
bandwidth of a decoding-shaped product, a weight-first matvec over half that buffer
(`matvec_read_gb_s`). A call's
bound (`roofline_seconds`) is its prefill plus `new_tokens - 1` decoding steps, each taking the
longer of reading every weight but the (untied) embedding table once (`weight_bytes_per_token`)
and doing its FLOPs (2 per weight and token, plus attention) at the peak;
`roofline_fraction_{side}_bs*` is that bound over the side's median call time (1.0 = at the
roofline). The machine's read bandwidth moves by up to 1.5x within minutes (the VM's host is
shared), so a call can be slow only because the memory was: `roofline_fraction_paired_*` sets
each call against the bound at a read probe taken just before it (`jnp.sum` over half the probe
buffer, best of 3; `read_bandwidth_gb_s_paired_{side}_bs*`: their median) and reports the
median over rounds (`_iqr`: quartiles). The strict fraction uses the run's fastest probe for
every call, so it is the lower of the two whenever the bandwidth moved.

    python models/benchmarks/generate_bench.py [--quick] [--shapes small,large]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import tempfile
import time
from collections.abc import Callable

import numpy as np

SHAPES: dict[str, dict] = {
    "small": dict(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=256,
        vocab_size=1024,
    ),
    "wider": dict(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=64,
        intermediate_size=768,
        vocab_size=1024,
    ),
    "large": dict(
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=12,
        head_dim=64,
        intermediate_size=3072,
        vocab_size=32000,
    ),
}
# `--quick`: one tiny shape (odd sizes) that a test can afford.
QUICK_SHAPES: dict[str, dict] = {
    "quick": dict(
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=80,
        vocab_size=211,
    ),
}
# (new tokens, rounds) per shape; the default for the others.
BUDGET: dict[str, tuple[int, int]] = {"large": (32, 5)}
DEFAULT_BUDGET, QUICK_BUDGET = (128, 11), (8, 1)
PROMPT_LEN, BATCHES = 16, (1, 8)
BASELINES = ("transformers_eager", "transformers_static_compile")
ENGINE_STEPS = (1, 8)
# Roofline probes: (read buffer bytes, matmul size); quick: small enough for a test.
PROBE, QUICK_PROBE = (1 << 30, 2048), (64 << 20, 256)


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _best(repeats: int, fn: Callable, *args) -> float:
    """Seconds of the fastest of `repeats` calls of a jitted `fn(*args)`, after a warm-up."""
    import jax

    jax.block_until_ready(fn(*args))
    return min(_timed(lambda: jax.block_until_ready(fn(*args))) for _ in range(repeats))


def _sig(x: float) -> float:
    """`x` to 4 significant digits."""
    return float(f"{x:.4g}")


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = np.percentile(values, [25, 50, 75])
    return float(q1), float(q2), float(q3)


def machine_roofline(buffer_bytes: int, matmul_size: int, repeats: int = 9) -> dict:
    """Read bandwidth (GB/s) of a jitted float32 `sum` over `buffer_bytes`, float32 matmul
    peak (GFLOP/s) of a jitted `matmul_size` square product, each the best of `repeats`, and
    beside them (not part of the bound) the read bandwidth of a decoding-shaped product: a
    jitted weight-first matvec `w[N, 1024] @ x` over a `buffer_bytes / 2` weight."""
    import jax
    import jax.numpy as jnp

    buffer = jnp.ones(buffer_bytes // 4, jnp.float32)
    read = _best(repeats, jax.jit(jnp.sum), buffer)
    del buffer
    weight = jnp.ones((buffer_bytes // 8 // 1024, 1024), jnp.float32)
    matvec = _best(repeats, jax.jit(jnp.matmul), weight, jnp.ones(1024, jnp.float32))
    a = jnp.ones((matmul_size, matmul_size), jnp.float32)
    mm_s = _best(repeats, jax.jit(jnp.matmul), a, a)
    return {
        "read_bandwidth_gb_s": round(buffer_bytes / read / 1e9, 2),
        "matmul_peak_gflop_s": round(2 * matmul_size**3 / mm_s / 1e9, 1),
        "matvec_read_gb_s": round(weight.nbytes / matvec / 1e9, 2),
    }


def combine_probes(probes: list[dict]) -> dict:
    """The run's roofline from several `machine_roofline` probes: each figure's best (the
    fastest the machine was seen to be, so the tightest bound and the least flattering
    fractions), with every probe's read bandwidth and the load average listed beside.

    >>> combine_probes([{"read_bandwidth_gb_s": 9.0, "matmul_peak_gflop_s": 90.0,
    ...                  "matvec_read_gb_s": 8.0, "load": 5.0},
    ...                 {"read_bandwidth_gb_s": 30.0, "matmul_peak_gflop_s": 80.0,
    ...                  "matvec_read_gb_s": 20.0, "load": 0.5}])["read_bandwidth_gb_s"]
    30.0
    """
    keys = ("read_bandwidth_gb_s", "matmul_peak_gflop_s", "matvec_read_gb_s")
    out = {k: max(p[k] for p in probes) for k in keys}
    out["read_bandwidth_gb_s_probes"] = [p["read_bandwidth_gb_s"] for p in probes]
    out["matvec_read_gb_s_probes"] = [p["matvec_read_gb_s"] for p in probes]
    out["probe_load_averages"] = [p["load"] for p in probes]
    return out


def _probe(probe: tuple[int, int]) -> dict:
    return {**machine_roofline(*probe), "load": round(os.getloadavg()[0], 1)}


def weight_bytes_per_token(model) -> int:
    """Bytes of the weights one decoding step reads: every array but the embedding tables
    that are only gathered from (the input table when the head is untied, learned positions)."""
    import equinox as eqx
    import jax

    total = sum(x.nbytes for x in jax.tree.leaves(eqx.filter(model, eqx.is_array)))
    gathered = [model.pos_embed] if model.pos_embed is not None else []
    if model.lm_head is not None:
        gathered.append(model.embed)
    return total - sum(e.weight.array.nbytes for e in gathered)


def flops_per_token(model, context: float) -> float:
    """FLOPs of one token: 2 per matmul weight, plus attention's two products over `context`
    keys (embedding gathers and norms left out)."""
    cfg = model.config
    weights = weight_bytes_per_token(model) / model.embed.weight.array.dtype.itemsize
    attention = 4 * cfg.num_layers * cfg.num_heads * cfg.head_size * context
    return 2 * weights + attention


def roofline_seconds(
    *,
    weight_bytes: float,
    flops: float,
    batch: int,
    prompt_len: int,
    new_tokens: int,
    bandwidth: float,
    peak: float,
) -> float:
    """The fastest a generate call can be: the prefill, then `new_tokens - 1` decoding steps,
    each the longer of reading `weight_bytes` at `bandwidth` (bytes/s) and doing its FLOPs
    (`flops` per token) at `peak` (FLOP/s).

    >>> roofline_seconds(weight_bytes=10.0, flops=1.0, batch=2, prompt_len=8, new_tokens=3,
    ...                  bandwidth=10.0, peak=4.0)  # prefill 16 / 4 = 4 s, steps 1 s each
    6.0
    """
    read = weight_bytes / bandwidth
    prefill = max(read, batch * prompt_len * flops / peak)
    return prefill + (new_tokens - 1) * max(read, batch * flops / peak)


def _compile_kwargs(backend: str) -> dict:
    # `mode` is an inductor option; other backends (the test's "eager") take none.
    if backend == "inductor":
        return dict(backend=backend, mode="reduce-overhead", fullgraph=True, dynamic=False)
    return dict(backend=backend, fullgraph=True, dynamic=False)


def measure_shape(
    hf_config: dict,
    *,
    new_tokens: int,
    repeats: int,
    compile_backend: str = "inductor",
    batches: tuple[int, ...] = BATCHES,
    probe: tuple[int, int] = PROBE,
) -> dict:
    """Tokens/s of `meltemi.models.generate`, the engine and both `transformers` baselines on
    one shape, and each side's fraction of the roofline.

    Args:
        hf_config: `transformers.LlamaConfig` fields of the random checkpoint.
        new_tokens: greedy tokens generated per row (no eos).
        repeats: paired rounds per batch size.
        compile_backend: `torch.compile` backend of the static-cache baseline (`"inductor"` in
            the bench; the test uses `"eager"` to skip inductor's minutes of C++ compilation).
        batches: batch sizes to measure.
        probe: `machine_roofline`'s buffer bytes and matmul size.

    Returns:
        A flat dict of figures, keys suffixed `_bs{batch}`.
    """
    import jax
    import jax.numpy as jnp
    import torch
    import transformers

    import meltemi.models as mm
    from meltemi.models import hf
    from meltemi.models.engine import Engine, EngineConfig, Request

    transformers.logging.set_verbosity_error()
    torch.compiler.reset()  # each shape compiles afresh (and stays under dynamo's recompile limit)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**hf_config, max_position_embeddings=1024)
    eager_model = transformers.LlamaForCausalLM(config).eval()
    with tempfile.TemporaryDirectory() as tmp:
        eager_model.save_pretrained(tmp)
        model, _ = hf.load(tmp)
        static_model = transformers.LlamaForCausalLM.from_pretrained(tmp).eval()
    # transformers' documented recipe: static cache + compiled forward (prefill and decode
    # steps each get their own static-shape graph).
    static_model.forward = torch.compile(static_model.forward, **_compile_kwargs(compile_backend))
    default_threads = torch.get_num_threads()
    rng = np.random.default_rng(0)
    probes = [_probe(probe)]  # and again after each batch's timed rounds
    out: dict = {
        "params": sum(p.numel() for p in eager_model.parameters()),
        "new_tokens": new_tokens,
        "prompt_len": PROMPT_LEN,
        "repeats": repeats,
        "compile_backend": compile_backend,
        "weight_bytes_per_token": weight_bytes_per_token(model),
        "flops_per_token": flops_per_token(model, PROMPT_LEN + new_tokens / 2),
    }
    timed: dict[int, dict[str, list[float]]] = {}
    paired: dict[int, dict[str, list[float]]] = {}  # read bandwidth probed before each call
    paired_buffer = jnp.ones(probe[0] // 8, jnp.float32)
    paired_sum = jax.jit(jnp.sum)

    def paired_probe() -> float:
        return paired_buffer.nbytes / _best(3, paired_sum, paired_buffer)

    context = PROMPT_LEN + new_tokens
    page = 16
    page_bytes = 2 * model.config.num_layers * page * model.config.num_kv_heads
    page_bytes *= model.config.head_size * model.embed.weight.array.dtype.itemsize
    for batch in batches:
        prompts = rng.integers(1, hf_config["vocab_size"], (batch, PROMPT_LEN)).tolist()
        ids = torch.tensor(prompts)

        def ours(prompts=prompts):
            return mm.generate(model, prompts, max_new_tokens=new_tokens, eos_token_id=None)

        def theirs(side: str, threads: int, ids=ids):
            torch.set_num_threads(threads)
            extra = {"cache_implementation": "static"} if side.endswith("compile") else {}
            torch_model = static_model if side.endswith("compile") else eager_model
            try:
                with torch.no_grad():
                    return torch_model.generate(
                        ids,
                        max_new_tokens=new_tokens,
                        do_sample=False,
                        eos_token_id=None,
                        pad_token_id=0,
                        **extra,
                    )[:, PROMPT_LEN:].tolist()
            finally:
                torch.set_num_threads(default_threads)

        def engine_call(engine, prompts=prompts):
            ids = [engine.submit(Request(p, new_tokens, stop_ids=())) for p in prompts]
            done = engine.run_until_done()
            return [done[i][0] for i in ids]

        engines = {
            f"engine_steps{k}": Engine(
                model,
                EngineConfig(
                    kv_bytes=(batch * -(-context // page) + 1) * page_bytes,
                    page_size=page,
                    max_seqs=batch,
                    max_seq_len=context,
                    prefill_chunk=batch * PROMPT_LEN,
                    max_prefills=batch,
                    decode_steps=k,
                ),
            )
            for k in ENGINE_STEPS
        }

        # Warm-up: every side at this shape and batch, first calls (compiles) reported apart.
        first: dict[str, float] = {}
        tokens: dict[str, list] = {}
        t = time.perf_counter()
        tokens["generate"] = ours()
        first["generate"] = time.perf_counter() - t
        for side, engine in engines.items():
            t = time.perf_counter()
            tokens[side] = engine_call(engine)
            first[side] = time.perf_counter() - t
        threads: dict[str, int] = {}
        for side in BASELINES:
            t = time.perf_counter()
            tokens[side] = theirs(side, default_threads)
            first[side] = time.perf_counter() - t
            default = min(_timed(lambda s=side: theirs(s, default_threads)) for _ in range(2))
            single = min(_timed(lambda s=side: theirs(s, 1)) for _ in range(2))
            threads[side] = default_threads if default < single else 1
        calls: dict[str, Callable[[], object]] = {"generate": ours}
        for side, engine in engines.items():
            calls[side] = functools.partial(engine_call, engine)
        for side in BASELINES:
            calls[side] = functools.partial(theirs, side, threads[side])

        times: dict[str, list[float]] = {side: [] for side in calls}
        paired_bw: dict[str, list[float]] = {side: [] for side in calls}
        order = list(calls)
        for r in range(repeats):
            k = r % len(order)
            for side in order[k:] + order[:k]:
                paired_bw[side].append(paired_probe())
                times[side].append(_timed(calls[side]))

        probes.append(_probe(probe))
        timed[batch] = times
        paired[batch] = paired_bw
        n = batch * new_tokens
        b = f"_bs{batch}"
        out[f"generate_tokens_per_s{b}"] = round(n / float(np.median(times["generate"])), 1)
        out[f"generate_first_call_s{b}"] = round(first["generate"], 2)
        for side in engines:
            ratios = [gen / eng for eng, gen in zip(times[side], times["generate"])]
            q1, median, q3 = _quartiles(ratios)
            out[f"{side}_tokens_per_s{b}"] = round(n / float(np.median(times[side])), 1)
            out[f"{side}_vs_generate{b}"] = round(median, 2)
            out[f"{side}_vs_generate{b}_iqr"] = [round(q1, 2), round(q3, 2)]
            out[f"{side}_first_call_s{b}"] = round(first[side], 2)
            out[f"greedy_tokens_equal_{side}{b}"] = tokens[side] == tokens["generate"]
        for side in BASELINES:
            ratios = [h / o for o, h in zip(times["generate"], times[side])]
            q1, median, q3 = _quartiles(ratios)
            out[f"{side}_tokens_per_s{b}"] = round(n / float(np.median(times[side])), 1)
            out[f"generate_vs_{side}{b}"] = round(median, 2)
            out[f"generate_vs_{side}{b}_iqr"] = [round(q1, 2), round(q3, 2)]
            out[f"generate_vs_{side}{b}_best_of"] = round(
                min(times[side]) / min(times["generate"]), 2
            )
            out[f"{side}_threads{b}"] = threads[side]
            out[f"{side}_first_call_s{b}"] = round(first[side], 2)
            out[f"greedy_tokens_equal_{side}{b}"] = tokens[side] == tokens["generate"]
        # The strongest baseline: our paired ratio is lowest against it (when the two baselines'
        # medians are within noise, the less flattering of the two).
        fastest = min(BASELINES, key=lambda s: out[f"generate_vs_{s}{b}"])
        out[f"fastest_transformers{b}"] = fastest
        out[f"generate_vs_fastest_transformers{b}"] = out[f"generate_vs_{fastest}{b}"]
        out[f"generate_vs_fastest_transformers{b}_iqr"] = out[f"generate_vs_{fastest}{b}_iqr"]
    # The bound uses the fastest probe of the shape (one before the rounds, one after each
    # batch): a single probe read 28-43 GB/s on a quiet machine from run to run.
    roof = combine_probes(probes)
    out.update(roof)
    for batch, times in timed.items():
        b = f"_bs{batch}"
        bound_at = functools.partial(
            roofline_seconds,
            weight_bytes=out["weight_bytes_per_token"],
            flops=out["flops_per_token"],
            batch=batch,
            prompt_len=PROMPT_LEN,
            new_tokens=new_tokens,
            peak=roof["matmul_peak_gflop_s"] * 1e9,
        )
        bound = bound_at(bandwidth=roof["read_bandwidth_gb_s"] * 1e9)
        out[f"roofline_tokens_per_s{b}"] = _sig(batch * new_tokens / bound)
        for side in times:
            out[f"roofline_fraction_{side}{b}"] = _sig(bound / float(np.median(times[side])))
            # Paired: each call against the bound at the bandwidth probed just before it.
            fractions = [
                bound_at(bandwidth=bw) / t for bw, t in zip(paired[batch][side], times[side])
            ]
            q1, median, q3 = _quartiles(fractions)
            out[f"roofline_fraction_paired_{side}{b}"] = _sig(median)
            out[f"roofline_fraction_paired_{side}{b}_iqr"] = [_sig(q1), _sig(q3)]
            bw = float(np.median(paired[batch][side])) / 1e9
            out[f"read_bandwidth_gb_s_paired_{side}{b}"] = _sig(bw)
    return out


def measure(
    quick: bool = False,
    shapes: tuple[str, ...] | None = None,
    repeats: int | None = None,
    compile_backend: str = "inductor",
) -> dict:
    """Runs `measure_shape` on each shape; the headline keys are the largest shape's.

    Args:
        quick: one tiny shape, 8 new tokens, one round (for the test and `bench.py --quick`).
        shapes: names from `SHAPES` (default all; ignored when `quick`).
        repeats: rounds per batch size, overriding each shape's budget.
        compile_backend: `torch.compile` backend of the static-cache baseline.

    Returns:
        `{"generate_shapes": {name: figures}, ...}` with `generate_vs_fastest_transformers_bs*`
        (and `_iqr`), `fastest_transformers_bs*`, `roofline_fraction_*` and
        `generate_headline_shape` at the top level.
    """
    table = QUICK_SHAPES if quick else {name: SHAPES[name] for name in shapes or SHAPES}
    out: dict = {"load_average_before": round(os.getloadavg()[0], 1), "generate_shapes": {}}
    for name, hf_config in table.items():
        new_tokens, rounds = QUICK_BUDGET if quick else BUDGET.get(name, DEFAULT_BUDGET)
        out["generate_shapes"][name] = measure_shape(
            hf_config,
            new_tokens=new_tokens,
            repeats=repeats or rounds,
            compile_backend=compile_backend,
            probe=QUICK_PROBE if quick else PROBE,
        )
    headline = max(out["generate_shapes"], key=lambda s: out["generate_shapes"][s]["params"])
    out["generate_headline_shape"] = headline
    for key, value in out["generate_shapes"][headline].items():
        if key.startswith(
            ("generate_vs_fastest_transformers", "fastest_transformers", "roofline_fraction")
        ):
            out[key] = value
    out["load_average_after"] = round(os.getloadavg()[0], 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one tiny shape, 8 tokens, 1 round")
    parser.add_argument("--repeats", type=int, default=None, help="rounds per batch size")
    parser.add_argument(
        "--shapes", default=",".join(SHAPES), help=f"comma-separated, of {sorted(SHAPES)}"
    )
    parser.add_argument("--compile_backend", default="inductor")
    args = parser.parse_args()
    shapes = tuple(s for s in args.shapes.split(",") if s)
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"--shapes={args.shapes}: unknown {unknown}; choose from {sorted(SHAPES)}")
    out = measure(
        quick=args.quick,
        shapes=shapes,
        repeats=args.repeats,
        compile_backend=args.compile_backend,
    )
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
