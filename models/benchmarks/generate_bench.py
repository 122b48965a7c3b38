"""Generation tokens/s against `transformers`' `generate`, measured side by side in one run.

The checkpoint is a random Llama built in `transformers`: `bench.py`'s tiny-llama shape at
hidden 256 (4 layers, 4 query / 2 KV heads of 32, MLP 256, vocab 1024); `WIDER` (4 heads of
64, MLP 768: 2.3x the weights) is measured too. It is saved and read with `hf.load`, so both
sides hold the same weights.
Greedy, prompts of 16 tokens, 128 new tokens (no eos), batch 1 and 8. Each side is warmed up
with a call of the same shape, then the two alternate (so a burst of load on the shared
machine hits both) and the best of `--repeats` calls counts. `transformers` runs at its
default thread count and at one thread, and the faster counts (on a loaded 2-core machine
one thread is often faster). The greedy tokens of both sides are compared too.

    python models/benchmarks/generate_bench.py [--quick]
"""

from __future__ import annotations

import argparse
import json
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


def measure(quick: bool = False, repeats: int | None = None, **overrides) -> dict:
    """Tokens/s of `meltemi.models.generate` and `transformers` at batch 1 and 8."""
    import torch
    import transformers

    import meltemi.models as mm
    from meltemi.models import hf

    transformers.logging.set_verbosity_error()
    repeats = repeats or (2 if quick else 5)
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

        def theirs(threads: int, ids=ids):
            torch.set_num_threads(threads)
            with torch.no_grad():
                return torch_model.generate(
                    ids,
                    max_new_tokens=new_tokens,
                    do_sample=False,
                    eos_token_id=None,
                    pad_token_id=0,
                )

        first_call = _timed(ours)
        same = ours() == theirs(default_threads)[:, PROMPT_LEN:].tolist()
        theirs(1)
        best = {"ours": float("inf"), "hf": float("inf"), "hf_1": float("inf")}
        for _ in range(repeats):
            best["ours"] = min(best["ours"], _timed(ours))
            best["hf"] = min(best["hf"], _timed(lambda: theirs(default_threads)))
            best["hf_1"] = min(best["hf_1"], _timed(lambda: theirs(1)))
        torch.set_num_threads(default_threads)
        tokens = batch * new_tokens
        ref = tokens / min(best["hf"], best["hf_1"])
        out[f"generate_tokens_per_s_bs{batch}"] = round(tokens / best["ours"], 1)
        out[f"transformers_tokens_per_s_bs{batch}"] = round(ref, 1)
        out[f"transformers_threads_bs{batch}"] = (
            default_threads if best["hf"] <= best["hf_1"] else 1
        )
        out[f"generate_vs_transformers_bs{batch}"] = round(tokens / best["ours"] / ref, 2)
        out[f"generate_first_call_s_bs{batch}"] = round(first_call, 2)
        out[f"greedy_tokens_equal_bs{batch}"] = same
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="32 new tokens, 2 repeats")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    out = measure(quick=args.quick, repeats=args.repeats)
    out["wider"] = measure(quick=args.quick, repeats=args.repeats, **WIDER)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
