"""The server under a trace: throughput and latency against serving it one request at a time.

A fixed trace (seeded): requests with mixed prompt and output lengths arriving at a fixed rate,
each sent by its own client thread (the official `openai` client, streaming; the threads run in
a child process, so their SSE parsing does not hold the server's GIL) to
`meltemi.models.serve` on a loopback port. The same trace is then served one request at a time
(each sent when the previous one finished) by the same server, and, where `transformers` is
installed, generated one request at a time by `transformers` on the same weights (same
process; torch at the faster of its default threads and one thread, as `generate_bench`), in
its two modes: eager `generate` (dynamic cache; for continuity) and its documented fast recipe,
static cache + `torch.compile(forward, mode="reduce-overhead", fullgraph=True, dynamic=False)`.
With `dynamic=False` every new input shape compiles, so that side left-pads each prompt to a
power of two (at least 16 tokens, with its attention mask) and keeps one static cache of the
context length for every request: it compiles one prefill per prompt bucket and one decoding
step, all before timing (`transformers_static_compile_warmup_s`; graphs compiled during the
timed trace: `transformers_static_compile_recompiles`, the goal is 0). Greedy, `ignore_eos`,
so every request yields exactly its `max_tokens`.

Reported (JSON): output tokens/s of each side and the ratios `concurrent_vs_sequential`,
`concurrent_vs_transformers_{eager,static_compile}_sequential` and
`concurrent_vs_fastest_transformers_sequential` (against the faster of the two); time to first
token (from the request's arrival) and inter-token latency p50/p99 of each side (the
`transformers` sides through a streamer); `itl_p99_vs_sequential_itl_p50` (the goal: at most
2) and `itl_p99_vs_sequential_itl_p99`; the engine's own step times under each side
(`steps`, `step_p50_s`, `step_p99_s`: the server's share of the inter-token gaps);
compilations in the server after the engine's warm-up (`compiles_during_trace`: the HTTP
warm-up requests and both timed traces; the goal is 0); the load average before and after.
Models are `generate_bench`'s random Llamas: `quick` (toy, for the test) and `large` (12
layers, hidden 768, 162M parameters with the untied vocabulary of 32000).

    python models/benchmarks/serve_bench.py [--quick] [--requests=32] [--rate=8.0]
        [--prefill_chunk=16] [--max_seqs=4] [--max_step_tokens=12] [--no_transformers]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import pathlib
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.append(str(pathlib.Path(__file__).resolve().parent))
import generate_bench  # noqa: E402 - the same random checkpoints and shapes

NAME = "bench"
# (requests, arrivals per second, prompt lengths, output lengths, max_seqs, max_seq_len,
# prefill chunk, step token budget). `large`: 8 decoding rows and at most 16 tokens a step (an
# 8-row step with an 8-token chunk costs 1.35x a 1-row step at 162M with the native paged
# attention, measured with the other jobs stopped), 32 requests at 8 arrivals/s. The rate must
# offer more than the server can take, or it measures the arrivals: a request is ~0.96 s of
# one-at-a-time serving, so at 4/s the concurrent side makes at most ~3.8x, less the ramp and
# drain (2.97x expected over 24 requests); at 8/s the 8 slots stay full.
TRACES = {
    "quick": dict(requests=8, rate=20.0, prompts=(3, 17), outputs=(4, 12), max_seqs=4, ctx=64,
                  chunk=64, budget=None),
    "large": dict(requests=32, rate=8.0, prompts=(8, 96), outputs=(16, 64), max_seqs=8, ctx=256,
                  chunk=16, budget=16),
}  # fmt: skip


def make_trace(requests: int, rate: float, prompts: tuple, outputs: tuple, vocab: int, seed=0):
    """`[(arrival_s, prompt_ids, max_tokens)]`, arrivals `1/rate` apart."""
    rng = np.random.default_rng(seed)
    return [
        (
            i / rate,
            rng.integers(2, vocab, int(rng.integers(prompts[0], prompts[1] + 1))).tolist(),
            int(rng.integers(outputs[0], outputs[1] + 1)),
        )
        for i in range(requests)
    ]


def write_checkpoint(hf_config: dict, directory: pathlib.Path, ctx: int):
    """A random transformers Llama saved in `directory` with a word-level tokenizer covering
    its vocabulary ("t2", "t3", ...); returns the torch model."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**hf_config, max_position_embeddings=ctx)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(directory)
    vocab = {"<unk>": 0, "</s>": 1, **{f"t{i}": i for i in range(2, hf_config["vocab_size"])}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return model


def _percentiles(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    p50, p99 = np.percentile(values, [50, 99])
    return float(p50), float(p99)


def run_trace(url: str, trace: list, *, concurrent_clients: bool) -> dict:
    """Sends `trace` (all at their arrival times, or one after another); returns figures."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="bench", max_retries=0, timeout=3600)
    start = time.perf_counter()
    lock = threading.Lock()
    ttft: list[float] = []
    itl: list[float] = []
    tokens = [0]
    ends: list[float] = []

    def one(arrival: float, prompt: list[int], max_tokens: int) -> None:
        if concurrent_clients:
            time.sleep(max(0.0, start + arrival - time.perf_counter()))
        sent = time.perf_counter()
        times = []
        stream = client.completions.create(
            model=NAME, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        for chunk in stream:
            if chunk.choices:
                times.append(time.perf_counter())
        with lock:
            tokens[0] += len(times)
            ttft.append(times[0] - sent)
            itl.extend(np.diff(times).tolist())
            ends.append(times[-1])

    if concurrent_clients:
        with concurrent.futures.ThreadPoolExecutor(len(trace)) as pool:
            for f in [pool.submit(one, *r) for r in trace]:
                f.result()
    else:
        for r in trace:
            one(*r)
    wall = max(ends) - start
    (t50, t99), (i50, i99) = _percentiles(ttft), _percentiles(itl)
    return {
        "output_tokens": tokens[0],
        "wall_s": wall,
        "tokens_per_s": tokens[0] / wall,
        "ttft_p50_s": t50,
        "ttft_p99_s": t99,
        "itl_p50_s": i50,
        "itl_p99_s": i99,
    }


def _client_process() -> concurrent.futures.ProcessPoolExecutor:
    """One child process to run `run_trace` in: the clients' threads (SSE parsing) do not share
    the server's GIL, as real clients would not."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    return concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx)


def _time_steps(engine) -> list[float]:
    """Wraps `engine.step` (this instance only) to record each step's wall time; returns the
    list it appends to."""
    times: list[float] = []
    step = engine.step

    def timed():
        t = time.perf_counter()
        out = step()
        times.append(time.perf_counter() - t)
        return out

    engine.step = timed
    return times


def prompt_bucket(length: int, smallest: int = 16) -> int:
    """The padded prompt width of the static-cache side: a power of two, at least `smallest`."""
    return max(smallest, 1 << (length - 1).bit_length())


class _Clock:
    """A `transformers` streamer that records when each new token arrives (the first `put`
    is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value) -> None:
        if self._prompt_seen:
            self.times.append(time.perf_counter())
        self._prompt_seen = True

    def end(self) -> None:
        pass


def transformers_sequential(
    model, trace: list, threads: int | None = None, *, static_cache=None
) -> dict:
    """`transformers`' `generate`, one request after another, at `threads` torch threads
    (default: torch's): tokens/s, TTFT and inter-token latency. With `static_cache` (a
    `StaticCache` of the context length, reused), prompts are left-padded to `prompt_bucket`."""
    import torch

    default = torch.get_num_threads()
    torch.set_num_threads(threads or default)
    tokens, ttft, itl = 0, [], []
    t = time.perf_counter()
    with torch.no_grad():
        for _, prompt, max_tokens in trace:
            ids = torch.tensor([prompt])
            extra = {}
            if static_cache is not None:
                width = prompt_bucket(len(prompt))
                ids = torch.tensor([[0] * (width - len(prompt)) + prompt])
                mask = torch.zeros_like(ids)
                mask[:, width - len(prompt) :] = 1
                static_cache.reset()
                extra = dict(attention_mask=mask, past_key_values=static_cache)
            clock, sent = _Clock(), time.perf_counter()
            out = model.generate(
                ids, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False,
                eos_token_id=None, pad_token_id=0, streamer=clock, **extra,
            )  # fmt: skip
            tokens += out.shape[1] - ids.shape[1]
            ttft.append(clock.times[0] - sent)
            itl.extend(np.diff(clock.times).tolist())
    wall = time.perf_counter() - t
    torch.set_num_threads(default)
    (t50, t99), (i50, i99) = _percentiles(ttft), _percentiles(itl)
    return {"output_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "threads": threads or default, "ttft_p50_s": t50, "ttft_p99_s": t99,
            "itl_p50_s": i50, "itl_p99_s": i99}  # fmt: skip


def _graphs() -> int:
    """Graphs `torch.compile` has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _static_compile_baseline(directory, trace: list, ctx: int, compile_backend: str) -> dict:
    """The static cache + `torch.compile` side: compiles every prompt bucket of `trace` and the
    decoding step first (timed apart), then serves `trace` one request at a time."""
    import torch
    import transformers
    from transformers import StaticCache

    torch.compiler.reset()
    # Dynamo's default of 8 graphs per frame is hit at 162M (prompt buckets x its own guards):
    # allow more here, and count what compiles during the timed trace instead.
    torch._dynamo.config.recompile_limit = 64
    model = transformers.LlamaForCausalLM.from_pretrained(directory).eval()
    model.forward = torch.compile(model.forward, **generate_bench._compile_kwargs(compile_backend))
    cache = StaticCache(config=model.config, max_cache_len=ctx)
    widths = sorted({prompt_bucket(len(p)) for _, p, _ in trace})
    # Warm-up requests per prompt bucket, one filling it and one padded (a full attention mask
    # takes another graph), of three tokens (a prefill and two decoding steps, the first on a
    # fresh cache): every graph the trace needs is compiled here. Dynamo guards on torch's
    # thread count, so the buckets are warmed again at the thread count chosen.
    warm = [(0.0, [2] * n, 3) for w in widths for n in (w, w // 2 + 1)]
    t = time.perf_counter()
    transformers_sequential(model, warm, static_cache=cache)
    warmup_s = time.perf_counter() - t
    speed = {n: transformers_sequential(model, warm[:1], n, static_cache=cache)["wall_s"]
             for n in (torch.get_num_threads(), 1)}  # fmt: skip
    threads = min(speed, key=speed.get)
    transformers_sequential(model, warm, threads, static_cache=cache)
    graphs = _graphs()
    out = transformers_sequential(model, trace, threads, static_cache=cache)
    out["recompiles"] = _graphs() - graphs
    out["warmup_s"] = warmup_s
    out["prompt_buckets"] = widths
    return out


def _compiles(url: str) -> float:
    import httpx

    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("meltemi_compiles_total "):
            return float(line.split()[1])
    raise AssertionError("no meltemi_compiles_total in /metrics")


def measure(quick: bool = False, *, requests: int | None = None, rate: float | None = None,
            transformers_baseline: bool = True, compile_backend: str = "inductor",
            prefill_chunk: int | None = None, max_seqs: int | None = None,
            max_step_tokens: int | None = None) -> dict:  # fmt: skip
    """Runs the trace on one shape (`quick`: the toy) and returns the figures
    (`compile_backend`: of the static-cache baseline; the test passes `"eager"`;
    `prefill_chunk`, `max_seqs`, `max_step_tokens`: the engine's, instead of the trace's)."""
    import os

    from meltemi.models.engine import EngineConfig
    from meltemi.models.serve import BackgroundServer, load_app

    shape = "quick" if quick else "large"
    hf_config = (generate_bench.QUICK_SHAPES if quick else generate_bench.SHAPES)[shape]
    spec = dict(TRACES[shape])
    spec["requests"] = requests or spec["requests"]
    spec["rate"] = rate or spec["rate"]
    spec["chunk"] = prefill_chunk or spec["chunk"]
    spec["max_seqs"] = max_seqs or spec["max_seqs"]
    spec["budget"] = max_step_tokens or spec["budget"]
    trace = make_trace(spec["requests"], spec["rate"], spec["prompts"], spec["outputs"],
                       hf_config["vocab_size"])  # fmt: skip
    ctx, max_seqs = spec["ctx"], spec["max_seqs"]
    heads, layers = hf_config["num_key_value_heads"], hf_config["num_hidden_layers"]
    page = 16
    page_bytes = 2 * layers * page * heads * hf_config["head_dim"] * 4
    config = EngineConfig(
        kv_bytes=(max_seqs * (ctx // page) + 1) * page_bytes, page_size=page, max_seqs=max_seqs,
        max_seq_len=ctx, prefill_chunk=spec["chunk"], max_step_tokens=spec["budget"],
        max_waiting=len(trace),
    )  # fmt: skip
    out: dict = {"shape": shape, "trace": {k: v for k, v in spec.items() if k != "ctx"},
                 "load_average_before": round(os.getloadavg()[0], 1)}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        directory = pathlib.Path(tmp)
        torch_model = write_checkpoint(hf_config, directory, ctx)
        out["params"] = sum(p.numel() for p in torch_model.parameters())
        t = time.perf_counter()
        app, runner = load_app(directory, config, model_name=NAME)
        out["load_and_compile_s"] = time.perf_counter() - t
        try:
            with BackgroundServer(app) as url:
                # Everything after the engine's warm-up counts, the HTTP warm-up included.
                compiles = _compiles(url)
                run_trace(url, trace[:2], concurrent_clients=True)  # warm the HTTP path
                steps = _time_steps(runner.engine)
                with _client_process() as clients:
                    clients.submit(len, ()).result()  # started before the timed traces
                    for side, together in (("concurrent", True), ("sequential", False)):
                        steps.clear()
                        out[side] = clients.submit(
                            run_trace, url, trace, concurrent_clients=together
                        ).result()
                        # The engine's own step times (the server side of the gaps).
                        p50, p99 = _percentiles(steps)
                        out[side].update(steps=len(steps), step_p50_s=p50, step_p99_s=p99)
                out["compiles_during_trace"] = _compiles(url) - compiles
        finally:
            runner.stop()
        if transformers_baseline:
            # As generate_bench: the faster of torch's default threads and one thread.
            import torch

            warm = {n: transformers_sequential(torch_model, trace[:2], n)["wall_s"]
                    for n in (torch.get_num_threads(), 1)}  # fmt: skip
            threads = min(warm, key=warm.get)
            out["transformers_eager_sequential"] = transformers_sequential(
                torch_model, trace, threads
            )
            static = _static_compile_baseline(directory, trace, ctx, compile_backend)
            out["transformers_static_compile_warmup_s"] = static.pop("warmup_s")
            out["transformers_static_compile_recompiles"] = static.pop("recompiles")
            out["transformers_static_compile_prompt_buckets"] = static.pop("prompt_buckets")
            out["transformers_static_compile_sequential"] = static
    c, s = out["concurrent"], out["sequential"]
    out["concurrent_vs_sequential"] = c["tokens_per_s"] / s["tokens_per_s"]
    out["itl_p99_vs_sequential_itl_p50"] = c["itl_p99_s"] / s["itl_p50_s"]
    out["itl_p99_vs_sequential_itl_p99"] = c["itl_p99_s"] / s["itl_p99_s"]
    if transformers_baseline:
        for side in ("eager", "static_compile"):
            base = out[f"transformers_{side}_sequential"]["tokens_per_s"]
            out[f"concurrent_vs_transformers_{side}_sequential"] = c["tokens_per_s"] / base
            out[f"sequential_vs_transformers_{side}_sequential"] = s["tokens_per_s"] / base
        speeds = {x: out[f"transformers_{x}_sequential"]["tokens_per_s"] for x in
                  ("eager", "static_compile")}  # fmt: skip
        fastest = max(speeds, key=speeds.get)
        out["fastest_transformers_sequential"] = f"transformers_{fastest}"
        for k in ("concurrent", "sequential"):
            out[f"{k}_vs_fastest_transformers_sequential"] = out[
                f"{k}_vs_transformers_{fastest}_sequential"
            ]
    out["load_average_after"] = round(os.getloadavg()[0], 1)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="the toy model and a short trace")
    p.add_argument("--requests", type=int, default=None, help="requests in the trace")
    p.add_argument("--rate", type=float, default=None, help="arrivals per second")
    p.add_argument("--no_transformers", action="store_true", help="skip the transformers side")
    p.add_argument("--compile_backend", default="inductor", help="of the static-cache side")
    p.add_argument("--prefill_chunk", type=int, default=None, help="the engine's prefill chunk")
    p.add_argument("--max_seqs", type=int, default=None, help="the engine's decoding slots")
    p.add_argument("--max_step_tokens", type=int, default=None, help="the engine's step budget")
    args = p.parse_args(argv)
    result = measure(
        args.quick, requests=args.requests, rate=args.rate,
        transformers_baseline=not args.no_transformers, compile_backend=args.compile_backend,
        prefill_chunk=args.prefill_chunk, max_seqs=args.max_seqs,
        max_step_tokens=args.max_step_tokens,
    )  # fmt: skip
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
