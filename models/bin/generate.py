"""Generates text from a checkpoint directory (Hugging Face's, or one written by `hf.save`).

    bazel run //models:generate -- --checkpoint=DIR --prompt="Once upon a time"
    bazel run //models:generate -- --checkpoint=DIR --prompt_ids=1,5,9 --temperature=0.8 --top_p=0.9
    bazel run //models:generate -- --checkpoint=DIR --prompt="..." --cache_dtype=bfloat16

Prompts are encoded with the directory's `tokenizer.json`; `--prompt_ids` passes token ids
directly (for checkpoints without a tokenizer). Generation stops at the eos id (or any of the
eos ids) of `generation_config.json` (else `config.json`). One JSON line per prompt is printed.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax

import meltemi.models as mm
from meltemi.models import hf


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, help="checkpoint directory")
    p.add_argument("--prompt", action="append", default=[], help="text prompt (repeatable)")
    p.add_argument(
        "--prompt_ids", action="append", default=[], help="comma-separated token ids (repeatable)"
    )
    p.add_argument("--max_new_tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top_k", type=int, default=None)
    p.add_argument("--top_p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eos_token_id", type=int, default=None, help="default: the checkpoint's")
    p.add_argument("--no_cache", action="store_true", help="recompute every step (slow)")
    p.add_argument(
        "--cache_dtype", choices=("float32", "bfloat16"), default=None, help="KV cache dtype"
    )
    return p


def _eos(directory: pathlib.Path, config: mm.ModelConfig) -> int | list[int] | None:
    gen = directory / "generation_config.json"
    if gen.exists():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        if eos is not None:
            return eos
    return config.eos_token_id


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    directory = pathlib.Path(args.checkpoint)
    if not args.prompt and not args.prompt_ids:
        print("generate: give --prompt=TEXT or --prompt_ids=1,2,3", file=sys.stderr)
        return 2
    tokenizer = None
    if (directory / "tokenizer.json").exists():
        from tokenizers import Tokenizer  # binary-only dependency (not needed by the library)

        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    if args.prompt and tokenizer is None:
        print(
            f"generate: {directory} has no tokenizer.json; pass --prompt_ids instead of --prompt",
            file=sys.stderr,
        )
        return 2
    prompts = [tokenizer.encode(text).ids for text in args.prompt] if args.prompt else []
    prompts += [[int(t) for t in ids.split(",") if t.strip()] for ids in args.prompt_ids]
    model, config = hf.load(directory)
    eos = args.eos_token_id if args.eos_token_id is not None else _eos(directory, config)
    sampling = mm.SamplingConfig(args.temperature, args.top_k, args.top_p)
    outputs = mm.generate(
        model,
        prompts,
        max_new_tokens=args.max_new_tokens,
        sampling=sampling,
        eos_token_id=eos,
        key=jax.random.key(args.seed),
        use_cache=not args.no_cache,
        cache_dtype=args.cache_dtype,
    )
    texts = args.prompt + args.prompt_ids
    for text, prompt, out in zip(texts, prompts, outputs, strict=True):
        line = {"prompt": text, "prompt_ids": prompt, "completion_ids": out}
        if tokenizer is not None:
            line["completion"] = tokenizer.decode(out)
        print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
