"""Generation tokens/s against `transformers`' `generate`, measured side by side in one run.

The checkpoint is a random Llama built in `transformers`: `bench.py`'s tiny-llama shape at
hidden 256 (4 layers, 4 query / 2 KV heads of 32, MLP 256, vocab 1024); `WIDER` (4 heads of
64, MLP 768: 2.3x the weights) is measured too. It is saved and read with `hf.load`, so both
sides hold the same weights.
Greedy, prompts of 16 tokens, 128 new tokens (no eos), batch 1 and 8. Each side is warmed up
with a call of the same shape. A single timing on the shared 2-core VM swings by 2x with the
other jobs' load, so the estimate is paired: each of `--repeats` rounds times our call and
`transformers`' call back to back (the order alternating between rounds, so a burst of load
hits both), and `generate_vs_transformers_bs*` is the median over rounds of that round's
tokens/s ratio (with its interquartile range, `*_iqr`); the tokens/s figures are medians and
`*_best_of` is the ratio of the two sides' best calls. `transformers` runs at whichever of its
default thread count and one thread was faster in two warm-up calls each (on a loaded 2-core
machine one thread usually wins; `transformers_threads_bs*`). The greedy tokens of both sides
are compared too.

    python models/benchmarks/generate_bench.py [--quick]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import tempfile
import time

import numpy as np

HF_CONFIG = dict(
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=256,
    vocab_size=1024,
    max_position_embeddings=1024,
)
WIDER = dict(num_attention_heads=4, num_key_value_heads=4, head_dim=64, intermediate_size=768)
PROMPT_LEN, NEW_TOKENS = 16, 128


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = np.percentile(values, [25, 50, 75])
    return float(q1), float(q2), float(q3)


def measure(quick: bool = False, repeats: int | None = None, **overrides) -> dict:
    """Tokens/s of `meltemi.models.generate` and `transformers` at batch 1 and 8."""
    import torch
    import transformers

    import meltemi.models as mm
    from meltemi.models import hf

    transformers.logging.set_verbosity_error()
    repeats = repeats or (3 if quick else 11)
    new_tokens = 32 if quick else NEW_TOKENS
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**(HF_CONFIG | overrides))
    torch_model = transformers.LlamaForCausalLM(config).eval()
    with tempfile.TemporaryDirectory() as tmp:
        torch_model.save_pretrained(tmp)
        model, _ = hf.load(tmp)
    default_threads = torch.get_num_threads()
    rng = np.random.default_rng(0)
    out: dict = {"new_tokens": new_tokens, "prompt_len": PROMPT_LEN, "repeats": repeats}
    for batch in (1, 8):
        prompts = rng.integers(1, HF_CONFIG["vocab_size"], (batch, PROMPT_LEN)).tolist()
        ids = torch.tensor(prompts)

        def ours(prompts=prompts):
            return mm.generate(model, prompts, max_new_tokens=new_tokens, eos_token_id=None)

        def theirs(threads: int = 1, ids=ids):
            torch.set_num_threads(threads)
            try:
                with torch.no_grad():
                    return torch_model.generate(
                        ids,
                        max_new_tokens=new_tokens,
                        do_sample=False,
                        eos_token_id=None,
                        pad_token_id=0,
                    )
            finally:
                torch.set_num_threads(default_threads)

        first_call = _timed(ours)
        same = ours() == theirs()[:, PROMPT_LEN:].tolist()
        default = min(_timed(lambda: theirs(default_threads)) for _ in range(2))
        single = min(_timed(theirs) for _ in range(2))
        threads = default_threads if default < single else 1
        times: dict[str, list[float]] = {"ours": [], "hf": []}
        for r in range(repeats):
            for side in ("ours", "hf") if r % 2 == 0 else ("hf", "ours"):
                call = ours if side == "ours" else functools.partial(theirs, threads)
                times[side].append(_timed(call))
        tokens = batch * new_tokens
        ratios = [h / o for o, h in zip(times["ours"], times["hf"])]
        q1, median, q3 = _quartiles(ratios)
        out[f"generate_tokens_per_s_bs{batch}"] = round(tokens / float(np.median(times["ours"])), 1)
        out[f"transformers_tokens_per_s_bs{batch}"] = round(
            tokens / float(np.median(times["hf"])), 1
        )
        out[f"generate_vs_transformers_bs{batch}"] = round(median, 2)
        out[f"generate_vs_transformers_bs{batch}_iqr"] = [round(q1, 2), round(q3, 2)]
        out[f"generate_vs_transformers_bs{batch}_best_of"] = round(
            min(times["hf"]) / min(times["ours"]), 2
        )
        out[f"transformers_threads_bs{batch}"] = threads
        out[f"generate_first_call_s_bs{batch}"] = round(first_call, 2)
        out[f"greedy_tokens_equal_bs{batch}"] = same
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="32 new tokens, 3 rounds")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--no_wider", action="store_true", help="skip the wider checkpoint")
    args = parser.parse_args()
    out = {"load_average_before": round(os.getloadavg()[0], 1)}
    out |= measure(quick=args.quick, repeats=args.repeats)
    if not args.no_wider:
        out["wider"] = measure(quick=args.quick, repeats=args.repeats, **WIDER)
    out["load_average_after"] = round(os.getloadavg()[0], 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
