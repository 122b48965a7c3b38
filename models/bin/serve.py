"""Serves a checkpoint over an OpenAI-compatible HTTP API (continuous batching, paged KV cache).

    bazel run //models:serve -- --checkpoint=DIR --port=8000
    bazel run //models:serve -- --checkpoint=RUN_DIR --kv_bytes=1073741824 --max_seqs=16
    MELTEMI_API_KEY=secret bazel run //models:serve -- --checkpoint=DIR --host=0.0.0.0

`--checkpoint` is a Hugging Face directory (config.json, safetensors, tokenizer.json, and a chat
template for /v1/chat/completions) or a training run directory (its newest `hf/step_*` export).
Routes: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics. The server binds
127.0.0.1 unless `--host` says otherwise; with `--api_key` (or MELTEMI_API_KEY) every route but
/health needs `Authorization: Bearer <key>` (the key is never printed). A mistake in the
arguments or the checkpoint prints one `error:` line and exits with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys

API_KEY_ENV = "MELTEMI_API_KEY"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, help="HF checkpoint or training run directory")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model_name", default=None, help="served model name (default: directory name)")
    p.add_argument("--chat_template", default=None, help="a Jinja chat template file")
    p.add_argument(
        "--api_key", default=None, help=f"Bearer token required on every route but /health "
        f"(default: ${API_KEY_ENV}; none when unset)"
    )  # fmt: skip
    p.add_argument("--kv_bytes", type=int, default=256 << 20, help="KV cache pool size in bytes")
    p.add_argument("--page_size", type=int, default=16, help="tokens per KV page")
    p.add_argument("--max_seqs", type=int, default=8, help="decoding slots (the decode batch)")
    p.add_argument("--max_seq_len", type=int, default=None, help="context (default: the model's)")
    p.add_argument("--prefill_chunk", type=int, default=64, help="prompt tokens per prefill step")
    p.add_argument(
        "--max_step_tokens", type=int, default=None, help="token budget of one step: decoding "
        "rows first, the prompt chunk takes the rest (default: a full chunk beside any batch)"
    )  # fmt: skip
    p.add_argument(
        "--max_prefills", type=int, default=4, help="most prompts one step's chunk prefills"
    )
    p.add_argument("--max_waiting", type=int, default=64, help="queued requests before 429s")
    p.add_argument("--max_logprobs", type=int, default=5, help="largest logprobs a request may ask")
    p.add_argument("--cache_dtype", choices=("float32", "bfloat16"), default=None)
    p.add_argument(
        "--prefix_cache", action=argparse.BooleanOptionalAction, default=False,
        help="keep finished prompts' KV pages for requests that start the same way (the "
        "logits may then differ in the last bits from an uncached run's)",
    )  # fmt: skip
    p.add_argument("--log_level", default="info", help="uvicorn log level")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import meltemi.models as mm
    from meltemi.models import hf
    from meltemi.models.engine import EngineConfig

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    try:
        from meltemi.data import TokenizerError
        from meltemi.data.chat import ChatTemplateError
        from meltemi.models.serve import load_app

        config = EngineConfig(
            kv_bytes=args.kv_bytes,
            page_size=args.page_size,
            max_seqs=args.max_seqs,
            max_seq_len=args.max_seq_len,
            prefill_chunk=args.prefill_chunk,
            max_step_tokens=args.max_step_tokens,
            max_prefills=args.max_prefills,
            max_logprobs=args.max_logprobs,
            cache_dtype=args.cache_dtype,
            max_waiting=args.max_waiting,
            prefix_cache=args.prefix_cache,
        )
        app, runner = load_app(
            args.checkpoint,
            config,
            model_name=args.model_name,
            chat_template=args.chat_template,
            api_key=api_key,
        )
    except (
        mm.ConfigError, hf.CheckpointError, mm.SafetensorsError, TokenizerError, ChatTemplateError
    ) as e:  # fmt: skip
        print(f"error: {e}", file=sys.stderr)
        return 2
    import uvicorn

    print(
        f"serving {args.checkpoint} on http://{args.host}:{args.port} "
        f"({'API key required' if api_key else 'no API key'})",
        file=sys.stderr,
    )
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        runner.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
