"""Chat generation: a conversation in, the assistant's reply out, token by token.

A conversation (`[{"role": "user", "content": "..."}, ...]`) is rendered with the checkpoint's
own chat template and `add_generation_prompt=True` (`meltemi.data.chat.ChatTemplate`, which
renders exactly as `transformers`' `apply_chat_template`), tokenized with its tokenizer (special
token strings become their ids, as `transformers` does), and continued by `TokenStream`: one
prefill, then one compiled decoding step per token with the KV cache, stopping after any of the
eos ids (`generation_config.json`'s list, else `config.json`'s) or at the token budget. Greedy
decoding gives the tokens of `transformers`' `apply_chat_template` + `generate(do_sample=False)`
on the same export (`tests/test_chat_parity.py`).

This module needs `meltemi.data` with its `tokenizers` and Jinja2 extras (`pip install
'meltemi-models[chat]'`); `import meltemi.models` does not import it.

    >>> from meltemi.models import chat
    >>> c = chat.Chat.from_directory("path/to/hf_export")  # doctest: +SKIP
    >>> for text in c.stream_text([{"role": "user", "content": "Hi!"}]):  # doctest: +SKIP
    ...     print(text, end="", flush=True)
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax

from meltemi.models import hf
from meltemi.models._config import ConfigError
from meltemi.models._generate import GREEDY, TokenStream, generate_stream
from meltemi.models._sampling import SamplingConfig
from meltemi.models._transformer import Transformer

__all__ = [
    "Chat",
    "ChatError",
    "TokenStream",
    "find_checkpoint",
    "generate_stream",
    "is_hf_checkpoint",
    "load_tokenizer",
    "prompt_ids",
    "text_increments",
]

_STEP_DIR = re.compile(r"step_(\d+)$")


class ChatError(ConfigError):
    """A checkpoint or conversation chat generation cannot use (the message says the fix)."""


def is_hf_checkpoint(directory: pathlib.Path) -> bool:
    """Whether `directory` holds a Hugging Face checkpoint (`config.json` and safetensors)."""
    return (directory / "config.json").is_file() and (
        (directory / "model.safetensors").is_file()
        or (directory / "model.safetensors.index.json").is_file()
    )


def find_checkpoint(path: str | os.PathLike) -> pathlib.Path:
    """The Hugging Face checkpoint directory to chat with.

    `path` is such a directory itself (`config.json` and safetensors), or a training run
    directory: then its newest export, `hf/step_XXXXXXXX/` (written with every checkpoint when
    the run's config sets `checkpoint.export_hf=True`).

    Raises:
        ChatError: `path` does not exist, or is neither a checkpoint nor a run holding one.
    """
    directory = pathlib.Path(path).expanduser()
    if not directory.is_dir():
        raise ChatError(f"checkpoint={str(path)!r}: no such directory")
    if is_hf_checkpoint(directory):
        return directory
    exports = []
    if (directory / "hf").is_dir():
        for sub in (directory / "hf").iterdir():
            match = _STEP_DIR.match(sub.name)
            if match and is_hf_checkpoint(sub):
                exports.append((int(match.group(1)), sub))
    if exports:
        return max(exports)[1]
    raise ChatError(
        f"checkpoint={str(path)!r} holds no Hugging Face checkpoint (config.json + "
        "safetensors) and no run export hf/step_*/ of one; train with "
        "--config.checkpoint.export_hf=True (an export with every checkpoint) or export the "
        "final model with --export_hf=DIR, and pass that directory"
    )


def _special_token(value: Any) -> str | None:
    """A tokenizer_config.json special token: a string, or `{"content": ...}` (older files)."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def prompt_ids(
    template: Any, tokenizer: Any, messages: Sequence[Mapping[str, Any]], **kwargs: Any
) -> list[int]:
    """The token ids of `messages` rendered by `template` (a `meltemi.data.chat.ChatTemplate`)
    with the generation prompt; special-token strings become their ids (`encode_with_offsets`)."""
    text = template.render(list(messages), add_generation_prompt=True, **kwargs)
    ids, _ = tokenizer.encode_with_offsets(text)
    return [int(i) for i in ids]


def load_tokenizer(directory: pathlib.Path):
    """`meltemi.data.HfTokenizer` of a checkpoint, its special tokens named as its
    `tokenizer_config.json` names them (so a chat tokenizer's eos is not guessed)."""
    from meltemi.data import HfTokenizer

    if not (directory / "tokenizer.json").is_file():
        raise ChatError(
            f"{directory} has no tokenizer.json; export the model with its tokenizer "
            "(hf.save(..., tokenizer=DIR), or a run's --export_hf, which writes it)"
        )
    cfg_path = directory / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    bos, eos, pad = (_special_token(cfg.get(k)) for k in ("bos_token", "eos_token", "pad_token"))
    return HfTokenizer(
        directory,
        bos=bos if bos is not None else ("" if "bos_token" in cfg else None),
        eos=eos if eos is not None else ("" if "eos_token" in cfg else None),
        pad=pad if pad is not None else eos,
    )


def text_increments(tokenizer: Any, ids: Iterable[int]) -> Iterator[str]:
    """The text of `ids` piece by piece as they arrive (special tokens dropped).

    A piece is what decoding all ids so far adds to the text already yielded; a byte-level
    token that ends in the middle of a UTF-8 character is held back until the character is
    complete, so no replacement character is ever printed for a split one.
    """
    seen: list[int] = []
    shown = ""
    for i in ids:
        seen.append(int(i))
        text = tokenizer.decode(seen)
        if text.endswith("\ufffd") or not text.startswith(shown):
            continue
        if len(text) > len(shown):
            yield text[len(shown) :]
            shown = text
    text = tokenizer.decode(seen)
    if text.startswith(shown) and len(text) > len(shown):
        yield text[len(shown) :]


class Chat:
    """A model, its tokenizer and chat template, and the eos ids generation stops on.

    Args:
        model: the model.
        tokenizer: a `meltemi.data.Tokenizer` (special-token strings in rendered chat text
            become their ids).
        template: a `meltemi.data.chat.ChatTemplate`.
        eos_token_id: stop after any of these ids; default: `model.config.eos_token_id`
            (`hf.load` reads `generation_config.json`'s list into it).
        cache_dtype: dtype of the KV cache (see `meltemi.models.generate`).
    """

    def __init__(
        self,
        model: Transformer,
        tokenizer: Any,
        template: Any,
        *,
        eos_token_id: int | Sequence[int] | None = None,
        cache_dtype: Any = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.template = template
        eos = model.config.eos_token_id if eos_token_id is None else eos_token_id
        self.eos_token_ids: tuple[int, ...] = (
            () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)
        )
        self._stream = TokenStream(model, cache_dtype=cache_dtype)

    @classmethod
    def from_directory(
        cls,
        directory: str | os.PathLike,
        *,
        template_file: str | os.PathLike | None = None,
        cache_dtype: Any = None,
    ) -> Chat:
        """Loads a Hugging Face checkpoint directory (`hf.load`), its `tokenizer.json` and its
        chat template (`tokenizer_config.json` / `chat_template.jinja`, or `template_file`).

        Raises:
            ChatError: no tokenizer.json.
            meltemi.data.chat.ChatTemplateError: no chat template and no `template_file`.
        """
        from meltemi.data.chat import ChatTemplate

        directory = pathlib.Path(directory)
        tokenizer = load_tokenizer(directory)
        template = ChatTemplate.from_pretrained(directory, template_file=template_file)
        model, _ = hf.load(directory)
        return cls(model, tokenizer, template, cache_dtype=cache_dtype)

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> list[int]:
        """The token ids of `messages` rendered with the generation prompt (the text the
        assistant's reply continues); `kwargs` go to the template (e.g. `tools=[...]`)."""
        return prompt_ids(self.template, self.tokenizer, messages, **kwargs)

    def stream(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        max_new_tokens: int = 256,
        sampling: SamplingConfig = GREEDY,
        key: jax.Array | None = None,
    ) -> Iterator[int]:
        """The reply's token ids as they are generated (the eos id that ends it included).

        Raises `ConfigError` before the first token when the conversation and the budget do
        not fit in `max_seq_len`, or sampling has no key.
        """
        return self._stream(
            self.prompt_ids(messages),
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            eos_token_id=list(self.eos_token_ids) or None,
            key=key,
        )

    def stream_text(self, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> Iterator[str]:
        """The reply's text as it is generated (see `stream` and `text_increments`)."""
        return text_increments(self.tokenizer, self.stream(messages, **kwargs))

    def reply(self, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> str:
        """The whole reply's text (arguments as in `stream`)."""
        return self.tokenizer.decode(list(self.stream(messages, **kwargs)))
