"""Chat evaluation: greedy replies to held-out conversations, the share in a trained format,
and the ids a chat model stops at."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

import meltemi.models as mm
from meltemi import data as md
from meltemi.data import chat as mdc

Message = Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class ChatReply:
    """One generated assistant reply.

    Attributes:
        text: the reply, decoded without the stop token.
        ids: the generated token ids (the stop token included when it came).
        stopped: the reply ended with a stop id (else it ran into the token budget).
    """

    text: str
    ids: tuple[int, ...]
    stopped: bool


def chat_eos_ids(tokenizer: md.Tokenizer, template: mdc.ChatTemplate,
                 special_ids: set[int]) -> tuple[int, ...]:  # fmt: skip
    """The ids generation stops at: the tokenizer's eos, and the special token that ends an
    assistant turn in `template` (e.g. `<|im_end|>`, `<|eot_id|>`).

    The end of a turn is read off the template itself: the last trained token of the reply in
    a rendered user/assistant probe, when it is one of `special_ids` (a trailing newline is
    not a stop token).

    Example:
        >>> t = mdc.ChatTemplate("{% for m in messages %}{{ m.content }}{% if m.role == "
        ...     "'assistant' %}{% generation %}<|end|>{% endgeneration %}{% endif %}"
        ...     "{% endfor %}")
        >>> chat_eos_ids(md.ByteTokenizer(), t, {256, 257, 258})
        (257,)
    """
    ids = {tokenizer.eos_id} if tokenizer.eos_id is not None else set()
    probe = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    encoded = mdc.encode_chat(probe, tokenizer, template, train_on="assistant")
    trained = encoded.ids[encoded.loss_mask.astype(bool)]
    if len(trained) and int(trained[-1]) in special_ids:
        ids.add(int(trained[-1]))
    return tuple(sorted(ids))


def prompt_of(conversation: Sequence[Message]) -> list[Message]:
    """The conversation up to its last assistant turn (what the model is asked to answer)."""
    last = max((i for i, m in enumerate(conversation) if m["role"] == "assistant"), default=None)
    return list(conversation if last is None else conversation[:last])


def chat_replies(
    model: mm.Transformer,
    tokenizer: md.Tokenizer,
    template: mdc.ChatTemplate,
    conversations: Sequence[Sequence[Message]],
    *,
    eos_ids: Sequence[int],
    max_new_tokens: int = 32,
) -> list[ChatReply]:
    """Greedy replies to each conversation's last assistant turn (removed from the prompt).

    Each prompt is rendered with `add_generation_prompt=True` and tokenized as chat text
    (special-token strings become their ids), then all are generated in one batch.

    Args:
        model: the model.
        tokenizer: its tokenizer.
        template: the chat template it was trained with.
        conversations: held-out conversations (`{"role", "content"}` messages).
        eos_ids: the stop ids (`chat_eos_ids`).
        max_new_tokens: the token budget of a reply.
    """
    prompts = []
    for conversation in conversations:
        text = template.render(prompt_of(conversation), add_generation_prompt=True)
        prompts.append(tokenizer.encode_with_offsets(text)[0].tolist())
    stops = set(int(i) for i in eos_ids)
    outputs = mm.generate(
        model,
        prompts,
        max_new_tokens=max_new_tokens,
        eos_token_id=sorted(stops),
        pad_token_id=tokenizer.pad_id,
    )
    replies = []
    for out in outputs:
        stopped = bool(out) and out[-1] in stops
        body = out[:-1] if stopped else out
        replies.append(ChatReply(tokenizer.decode(np.asarray(body, np.int32)), tuple(out), stopped))
    return replies


def format_rate(replies: Sequence[ChatReply], pattern: str | re.Pattern) -> float:
    """The share of replies in the trained format: the whole text matches `pattern` and the
    reply ended at a stop id.

    Example:
        >>> format_rate([ChatReply("a-b", (97, 45, 98, 257), True),
        ...              ChatReply("a-b", (97, 45, 98), False)], r"[a-z](-[a-z])+")
        0.5
    """
    pattern = re.compile(pattern) if isinstance(pattern, str) else pattern
    ok = [r.stopped and pattern.fullmatch(r.text) is not None for r in replies]
    return sum(ok) / max(len(ok), 1)
