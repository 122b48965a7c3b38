"""Talks to a chat model: tokens are printed as they are generated.

    bazel run //models:chat -- --checkpoint=DIR                    # interactive, multi-turn
    bazel run //models:chat -- --checkpoint=DIR --prompt="Hello!"  # one answer, then exit
    bazel run //models:chat -- --checkpoint=RUN_DIR --system="Be brief." --temperature=0.7

`--checkpoint` is a Hugging Face directory (config.json, safetensors, tokenizer.json and a chat
template in tokenizer_config.json or chat_template.jinja), or a training run directory: its
newest export `hf/step_XXXXXXXX/` (`checkpoint.export_hf=True`). The conversation is rendered
with the checkpoint's chat template (`--chat_template=FILE` replaces it) and generation stops at
any eos id of `generation_config.json` (else `config.json`). In the interactive mode the whole
conversation is kept and sent again at each turn; `/reset` clears it, `/exit` or end of input
(Ctrl-D) quits. A mistake in the arguments or the checkpoint prints one `error:` line and exits
with status 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

import jax

import meltemi.models as mm
from meltemi.models import chat, hf


class _Usage(Exception):
    """A user mistake: one `error:` line, exit status 2."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, help="HF checkpoint or training run directory")
    p.add_argument("--prompt", default=None, help="one user message: print the answer and exit")
    p.add_argument("--system", default=None, help="system message that starts the conversation")
    p.add_argument(
        "--chat_template", default=None, help="a Jinja chat template file (replaces the model's)"
    )
    p.add_argument("--max_new_tokens", type=int, default=256, help="length bound of one answer")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top_k", type=int, default=None)
    p.add_argument("--top_p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0, help="PRNG seed of the sampling")
    p.add_argument(
        "--cache_dtype", choices=("float32", "bfloat16"), default=None, help="KV cache dtype"
    )
    return p


def _load(args: argparse.Namespace) -> chat.Chat:
    from meltemi.data import TokenizerError
    from meltemi.data.chat import ChatTemplateError

    directory = chat.find_checkpoint(args.checkpoint)
    try:
        return chat.Chat.from_directory(
            directory, template_file=args.chat_template, cache_dtype=args.cache_dtype
        )
    except ChatTemplateError as e:
        if args.chat_template is None:
            raise _Usage(
                f"{directory} has no chat template (no chat_template in tokenizer_config.json, "
                "no chat_template.jinja); pass --chat_template=FILE, a Jinja chat template file"
            ) from e
        raise _Usage(f"--chat_template={args.chat_template}: {e}") from e
    except TokenizerError as e:
        raise _Usage(f"{directory}: {e}") from e


def _answer(
    model: chat.Chat, messages: list[dict], args: argparse.Namespace, key: jax.Array, out: TextIO
) -> str:
    """Streams one answer to `out` and returns its text."""
    import jinja2  # the template's own errors (`raise_exception`) are jinja2.TemplateError

    sampling = mm.SamplingConfig(args.temperature, args.top_k, args.top_p)
    try:
        ids = model.stream(messages, max_new_tokens=args.max_new_tokens, sampling=sampling, key=key)
        text = ""
        for piece in chat.text_increments(model.tokenizer, ids):
            out.write(piece)
            out.flush()
            text += piece
    except jinja2.TemplateError as e:  # e.g. a template that forbids a system turn
        raise _Usage(f"the chat template refused this conversation: {e}") from e
    out.write("\n")
    out.flush()
    return text


def _turn_key(args: argparse.Namespace, turn: int) -> jax.Array:
    return jax.random.fold_in(jax.random.key(args.seed), turn)


def _repl(model: chat.Chat, args: argparse.Namespace, inp: TextIO, out: TextIO) -> None:
    base = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(base)
    turn = 0
    while True:
        out.write("> ")
        out.flush()
        line = inp.readline()
        if not line or line.strip() == "/exit":
            out.write("\n" if not line else "")
            return
        line = line.rstrip("\n")
        if line.strip() == "/reset":
            messages = list(base)
            continue
        if not line.strip():
            continue
        asked = [*messages, {"role": "user", "content": line}]
        try:
            text = _answer(model, asked, args, _turn_key(args, turn), out)
        except (_Usage, mm.ConfigError) as e:  # this turn fails; the conversation goes on
            print(f"error: {e}", file=sys.stderr)
            continue
        messages = [*asked, {"role": "assistant", "content": text}]
        turn += 1


def main(argv: list[str] | None = None, *, stdin: TextIO | None = None) -> int:
    args = _parser().parse_args(argv)
    inp, out = stdin or sys.stdin, sys.stdout
    try:
        if args.max_new_tokens < 1:
            raise _Usage(f"--max_new_tokens={args.max_new_tokens}: must be >= 1, e.g. 256")
        model = _load(args)
        if args.prompt is not None:
            messages = [{"role": "system", "content": args.system}] if args.system else []
            messages.append({"role": "user", "content": args.prompt})
            _answer(model, messages, args, _turn_key(args, 0), out)
        else:
            _repl(model, args, inp, out)
    except (_Usage, mm.ConfigError, hf.CheckpointError, mm.SafetensorsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
