"""A conversation as token ids, a per-token loss mask and the token offsets of its turn ends.

The mask follows `transformers`' `apply_chat_template(..., return_assistant_tokens_mask=True)`:
a character span of the rendered text becomes the tokens from the one holding its first
character to the one holding its last (`char_to_token`). Where the template has
`{% generation %}` blocks, their spans are the assistant text. Where it has none, the span of
assistant message `i` is derived from renders of message prefixes:

- it starts where `render(messages[:i], add_generation_prompt=True)` ends (the text before the
  message, with the assistant header), which must be a prefix of the full render;
- it ends where `render(messages[:i + 1])` stops agreeing with the full render, with trailing
  whitespace dropped (the newline after `<|im_end|>` or `<end_of_turn>` is not the model's).

So the model learns the message's text and the end-of-turn token the template writes after it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from meltemi.data._tokenizer import Tokenizer
from meltemi.data.chat._template import ChatTemplate

__all__ = ["ROLES", "TRAIN_ON", "ChatRowError", "EncodedChat", "encode_chat"]

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "ipython"})
"""Message roles a conversation may use (`ipython` is Llama 3's tool-output role)."""

TRAIN_ON = ("assistant", "all")
"""`train_on` values: the assistant's tokens only, or every token."""


class ChatRowError(ValueError):
    """A conversation that cannot be trained on; `reason` is the short key it is counted under.

    Reasons: `malformed_json`, `no_messages`, `bad_message`, `unknown_role`, `bad_tools`,
    `template_error`, `template_not_incremental`, `no_assistant_tokens`.
    """

    def __init__(self, reason: str, message: str, location: str | None = None):
        self.reason = reason
        self.problem = message
        self.location = location
        super().__init__(f"{location}: {message}" if location else message)

    def at(self, location: str) -> ChatRowError:
        """The same error, reported at `location` (`file:line`)."""
        return ChatRowError(self.reason, self.problem, location)


@dataclasses.dataclass(frozen=True, eq=False)
class EncodedChat:
    """One tokenized conversation.

    Attributes:
        ids: int32[n] token ids, as `apply_chat_template(tokenize=True)` returns them.
        loss_mask: uint8[n], 1 where the token itself is trained on.
        turn_ends: int64[k] ascending token offsets just after each assistant turn: the
            places a conversation may be cut without splitting a turn.
    """

    ids: np.ndarray
    loss_mask: np.ndarray
    turn_ends: np.ndarray

    def __len__(self) -> int:
        return int(self.ids.shape[0])


def check_messages(messages: Any, roles: frozenset[str] = ROLES) -> list[Mapping[str, Any]]:
    """The messages of a row, or a `ChatRowError` saying what is wrong with them."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise ChatRowError("no_messages", f"messages is {shorten(messages)}, not a list of turns")
    for k, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise ChatRowError(
                "bad_message", f"message {k} is {shorten(m)}, not a {{'role', 'content'}} object"
            )
        if m["role"] not in roles:
            raise ChatRowError(
                "unknown_role", f"message {k} has role {m['role']!r}; known roles: {sorted(roles)}"
            )
    return list(messages)


def shorten(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render_tracked(template: ChatTemplate, messages, *, track: bool = False, **kwargs):
    """Renders, turning anything the template raises into a `template_error` row error."""
    try:
        if track:
            return template.render_with_spans(messages, **kwargs)
        return template.render(messages, **kwargs)
    except Exception as e:  # the template is user code: any failure is this row's
        raise ChatRowError(
            "template_error", f"chat template {template.name} failed: {type(e).__name__}: {e}"
        ) from None


def _derived_spans(template: ChatTemplate, messages, text: str, **kwargs) -> list[tuple[int, int]]:
    """Character spans of the assistant messages, from renders of message prefixes."""
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = render_tracked(template, messages[:i], add_generation_prompt=True, **kwargs)
        if not text.startswith(before):
            raise ChatRowError(
                "template_not_incremental",
                f"the render of messages[:{i}] with the generation prompt is not a prefix of the "
                f"conversation's, so the assistant text of message {i} cannot be located; mark "
                f"it with {{% generation %}} ... {{% endgeneration %}} in the template",
            )
        through = render_tracked(template, messages[: i + 1], **kwargs)
        end = 0
        limit = min(len(through), len(text))
        while end < limit and through[end] == text[end]:
            end += 1
        while end > len(before) and text[end - 1].isspace():
            end -= 1
        spans.append((len(before), end))
    return spans


def _token_spans(offsets: np.ndarray, spans, n_chars: int) -> list[tuple[int, int]]:
    """[first, stop) token ranges of character spans, as transformers maps them: from the
    token holding the span's first character to the one holding its last (the first token
    that covers a character, `char_to_token`). Characters no token covers (offsets trimmed
    by the tokenizer) are skipped inwards, where transformers would stop or run to the end."""
    owner = np.full(n_chars + 1, -1, np.int64)
    for t in range(len(offsets) - 1, -1, -1):
        s, e = offsets[t]
        owner[s:e] = t
    out = []
    for s, e in spans:
        covered = np.flatnonzero(owner[s:e] >= 0)
        if covered.size == 0:
            continue
        first = int(owner[s + covered[0]])
        last = int(owner[s + covered[-1]])
        if last >= first:
            out.append((first, last + 1))
    return out


def template_kwargs(
    tokenizer: Tokenizer, template: ChatTemplate, *, tools=None, documents=None
) -> dict[str, Any]:
    """The render arguments `encode_chat` uses: tools, documents, and the tokenizer's
    `bos_token`/`eos_token` unless the template brings its own."""
    kwargs: dict[str, Any] = {"tools": tools, "documents": documents}
    for key in ("bos_token", "eos_token"):
        value = getattr(tokenizer, key)
        if value is not None and key not in template.special_tokens:
            kwargs[key] = value
    return kwargs


def encode_chat(
    messages: Sequence[Mapping[str, Any]],
    tokenizer: Tokenizer,
    template: ChatTemplate,
    *,
    train_on: str = "assistant",
    tools: Sequence[Mapping[str, Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    roles: frozenset[str] = ROLES,
) -> EncodedChat:
    """Renders and tokenizes a conversation, with its loss mask and turn ends.

    The ids are `apply_chat_template(messages, tools=tools, tokenize=True)`'s: special-token
    strings the template writes become their ids. The tokenizer's `bos_token`/`eos_token` are
    template variables unless the template brings its own (`ChatTemplate.special_tokens`).

    Args:
        messages: `{"role", "content", ...}` dicts (tool calls as transformers takes them).
        tokenizer: an `HfTokenizer` or `ByteTokenizer` (its `<bos>`/`<eos>` become ids).
        template: the chat template.
        train_on: `"assistant"` (only assistant text carries loss) or `"all"`.
        tools: JSON-schema tool definitions the template shows the model.
        documents: retrieval documents for templates that take them.
        roles: the accepted message roles.

    Raises:
        ChatRowError: the conversation is unusable (see `ChatRowError` for the reasons).
        ValueError: `train_on` is not one of `TRAIN_ON`.

    >>> from meltemi.data import ByteTokenizer
    >>> t = ChatTemplate("{% for m in messages %}{{ m.role[0] }}:{% if m.role == 'assistant' %}"
    ...                  "{% generation %}{{ m.content }}{% endgeneration %}"
    ...                  "{% else %}{{ m.content }}{% endif %}{% endfor %}")
    >>> enc = encode_chat([{"role": "user", "content": "hi"},
    ...                    {"role": "assistant", "content": "yo"}], ByteTokenizer(), t)
    >>> enc.loss_mask.tolist(), enc.turn_ends.tolist()
    ([0, 0, 0, 0, 0, 0, 1, 1], [8])
    """
    if train_on not in TRAIN_ON:
        raise ValueError(f"train_on={train_on!r}: use one of {list(TRAIN_ON)}")
    messages = check_messages(messages, roles)
    if tools is not None and (
        not isinstance(tools, Sequence) or not all(isinstance(t, Mapping) for t in tools)
    ):
        raise ChatRowError("bad_tools", f"tools is {shorten(tools)}, not a list of JSON schemas")
    kwargs = template_kwargs(tokenizer, template, tools=tools, documents=documents)
    if template.has_generation_tag:
        text, spans = render_tracked(template, messages, track=True, **kwargs)
    else:
        text = render_tracked(template, messages, **kwargs)
        spans = _derived_spans(template, messages, text, **kwargs)
    ids, offsets = tokenizer.encode_with_offsets(text)
    token_spans = _token_spans(offsets, spans, len(text))
    n = len(ids)
    assistant = np.zeros(n, np.uint8)
    for first, stop in token_spans:
        assistant[first:stop] = 1
    turn_ends = np.unique(np.asarray([stop for _, stop in token_spans], np.int64))
    if train_on == "all":
        loss_mask = np.ones(n, np.uint8)
    elif not assistant.any():
        raise ChatRowError(
            "no_assistant_tokens",
            "the conversation has no assistant tokens to train on (no assistant message, or "
            "the template renders none); use train_on='all' to train on every token",
        )
    else:
        loss_mask = assistant
    return EncodedChat(np.asarray(ids, np.int32), loss_mask, turn_ends)
