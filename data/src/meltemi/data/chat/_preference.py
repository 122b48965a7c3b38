"""Preference pairs: a prompt and a chosen and a rejected assistant reply, rendered with the
chat template, loss only on the reply tokens.

A pair is stored as one document: the chosen conversation (prompt + chosen reply) followed by
the rejected one (prompt + rejected reply); its two `turn_ends` are the ends of the two
conversations. `PackedDataset` splits it back into two segments of one row.

Rows come in the shapes of the common preference sets:

- explicit prompt (TRL's conversational format): `prompt` a list of messages (or a string:
  one user turn), `chosen`/`rejected` the replies as message lists or strings;
- implicit prompt (UltraFeedback-binarized, Anthropic HH as messages): `chosen`/`rejected` are
  whole conversations, the prompt being everything up to the last system/developer/user
  message; a `prompt` field, when present, must agree with it (a string: the last user
  message's content).

Bad pairs raise `ChatRowError`, counted by `build_store` under their reason:
`identical_replies`, `empty_reply`, `prompt_mismatch`, `no_prompt`, `no_pair`, plus the reasons
of `encode_chat` (`bad_message`, `unknown_role`, `template_error`, ...).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from meltemi.data._sources import RawDocument, Source, SourceError
from meltemi.data._tokenizer import Tokenizer
from meltemi.data.chat._encode import (
    ROLES,
    ChatRowError,
    EncodedChat,
    check_messages,
    encode_chat,
    render_tracked,
    shorten,
    template_kwargs,
)
from meltemi.data.chat._files import parse_row, parse_tools, read_rows, row_files
from meltemi.data.chat._template import ChatTemplate

__all__ = ["PREFERENCE_REASONS", "EncodedPair", "PreferenceFiles", "encode_preference"]

PREFERENCE_FORMAT_VERSION = 1  # bump when the same rows would encode differently

PROMPT_ROLES = frozenset({"system", "developer", "user"})
"""Roles that end a prompt: a reply is the messages after the last of them."""

PREFERENCE_REASONS = (
    "identical_replies",
    "empty_reply",
    "prompt_mismatch",
    "no_prompt",
    "no_pair",
)
"""Reasons a pair is skipped besides those of `encode_chat` (`ChatRowError.reason`)."""


@dataclasses.dataclass(frozen=True, eq=False)
class EncodedPair:
    """One tokenized preference pair: two conversations sharing a prompt.

    `ids`, `loss_mask` and `turn_ends` are the stored document: chosen then rejected, with
    turn ends `[len(chosen), len(chosen) + len(rejected)]`.
    """

    chosen: EncodedChat
    rejected: EncodedChat
    prompt_tokens: int

    @property
    def ids(self) -> np.ndarray:
        return np.concatenate([self.chosen.ids, self.rejected.ids])

    @property
    def loss_mask(self) -> np.ndarray:
        return np.concatenate([self.chosen.loss_mask, self.rejected.loss_mask])

    @property
    def turn_ends(self) -> np.ndarray:
        n = len(self.chosen)
        return np.asarray([n, n + len(self.rejected)], np.int64)


def _messages(value: Any, field: str, roles: frozenset[str]) -> list[Mapping[str, Any]]:
    """A reply or prompt as messages: a string is one assistant (reply) or user (prompt) turn."""
    if isinstance(value, str):
        role = "user" if field == "prompt" else "assistant"
        return [{"role": role, "content": value}]
    try:
        return check_messages(value, roles)
    except ChatRowError as e:
        if e.reason == "no_messages":
            raise ChatRowError(
                "empty_reply" if field != "prompt" else "no_prompt",
                f"{field} is {shorten(value)}, not a string or a list of messages",
            ) from None
        raise ChatRowError(e.reason, f"{field}: {e.problem}") from None


def _split(messages: list[Mapping[str, Any]]) -> tuple[list, list]:
    """(prompt, reply): the reply is what follows the last system/developer/user message."""
    k = len(messages)
    while k > 0 and messages[k - 1]["role"] not in PROMPT_ROLES:
        k -= 1
    return messages[:k], messages[k:]


def _canonical(messages) -> str:
    return json.dumps(messages, sort_keys=True, ensure_ascii=False, default=str)


def _has_text(reply: list[Mapping[str, Any]]) -> bool:
    """True if an assistant message of the reply says something (text or tool calls)."""
    for m in reply:
        if m["role"] != "assistant":
            continue
        content = m.get("content")
        if m.get("tool_calls") or (content is not None and str(content).strip()):
            return True
    return False


def _prompt_of(prompt: Any, chosen: list, rejected: list, roles: frozenset[str]) -> list:
    """The one prompt of a pair, checked against every place that states it."""
    given = None if prompt is None else _messages(prompt, "prompt", roles)
    pc, _ = _split(chosen)
    pr, _ = _split(rejected)
    stated = [(name, p) for name, p in (("chosen", pc), ("rejected", pr)) if p]
    if given is not None and isinstance(prompt, str) and stated:
        # UltraFeedback: `prompt` is the text of the conversations' last user turn.
        users = [m for m in stated[0][1] if m["role"] == "user"]
        if not users or str(users[-1].get("content")) != prompt:
            raise ChatRowError(
                "prompt_mismatch",
                f"prompt {shorten(prompt)} is not the last user message of chosen "
                f"({shorten(users[-1].get('content') if users else None)})",
            )
        given = None  # the conversations' prompt is the full one (system turns included)
    if given is not None:
        stated.insert(0, ("prompt", given))
    if not stated:
        raise ChatRowError(
            "no_prompt",
            "the pair has no prompt: give a 'prompt' field, or chosen/rejected as whole "
            "conversations that start with the user's turn",
        )
    name0, first = stated[0]
    for name, p in stated[1:]:
        if _canonical(p) != _canonical(first):
            raise ChatRowError(
                "prompt_mismatch",
                f"the prompt of {name} ({shorten(p)}) differs from that of {name0} "
                f"({shorten(first)}); a pair compares two replies to one prompt",
            )
    return first


def encode_preference(
    prompt: Any,
    chosen: Any,
    rejected: Any,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    roles: frozenset[str] = ROLES,
) -> EncodedPair:
    """Renders and tokenizes a preference pair; the loss mask covers only the reply tokens.

    Args:
        prompt: a list of messages, a string (one user turn), or None when `chosen` and
            `rejected` are whole conversations.
        chosen: the preferred reply: a string, assistant messages, or a whole conversation.
        rejected: the other reply, in the same forms.
        tokenizer: an `HfTokenizer` or `ByteTokenizer`.
        template: the chat template.
        tools: JSON-schema tool definitions the template shows the model.
        roles: the accepted message roles.

    Raises:
        ChatRowError: the pair is unusable (`PREFERENCE_REASONS`, or `encode_chat`'s).

    >>> from meltemi.data import ByteTokenizer
    >>> t = ChatTemplate("{% for m in messages %}{{ m.role[0] }}:{{ m.content }}{{ eos_token }}"
    ...                  "{% endfor %}{% if add_generation_prompt %}a:{% endif %}")
    >>> pair = encode_preference("hi", "yo", "go away", ByteTokenizer(), t)
    >>> pair.chosen.ids[pair.chosen.loss_mask == 1].tolist(), pair.turn_ends.tolist()
    ([121, 111, 257], [10, 25])
    """
    if chosen is None or rejected is None:
        missing = "chosen" if chosen is None else "rejected"
        raise ChatRowError("no_pair", f"the pair has no {missing!r} reply")
    chosen_m = _messages(chosen, "chosen", roles)
    rejected_m = _messages(rejected, "rejected", roles)
    prompt_m = _prompt_of(prompt, chosen_m, rejected_m, roles)
    replies = []
    for name, messages in (("chosen", chosen_m), ("rejected", rejected_m)):
        _, reply = _split(messages)
        if not _has_text(reply):
            raise ChatRowError(
                "empty_reply", f"the {name} reply {shorten(reply)} has no assistant text"
            )
        replies.append(reply)
    if _canonical(replies[0]) == _canonical(replies[1]):
        raise ChatRowError(
            "identical_replies", f"chosen and rejected are the same reply ({shorten(replies[0])})"
        )
    kwargs = template_kwargs(tokenizer, template, tools=tools)
    prompt_text = render_tracked(template, prompt_m, add_generation_prompt=True, **kwargs)
    prompt_ids = tokenizer.encode_with_offsets(prompt_text)[0]
    n = len(prompt_ids)
    encoded = []
    for name, reply in (("chosen", replies[0]), ("rejected", replies[1])):
        enc = encode_chat(prompt_m + reply, tokenizer, template, tools=tools, roles=roles)
        if len(enc) < n or not np.array_equal(enc.ids[:n], prompt_ids):
            raise ChatRowError(
                "template_not_incremental",
                f"the tokens of the prompt rendered with the generation prompt are not a prefix "
                f"of the {name} conversation's, so its reply cannot be located",
            )
        mask = enc.loss_mask.copy()
        mask[:n] = 0  # earlier assistant turns of the prompt are context, not the reply
        if not mask.any():
            raise ChatRowError("empty_reply", f"the {name} reply renders no trained tokens")
        encoded.append(EncodedChat(enc.ids, mask, np.asarray([len(enc)], np.int64)))
    if np.array_equal(encoded[0].ids, encoded[1].ids):
        raise ChatRowError("identical_replies", "chosen and rejected render to the same tokens")
    return EncodedPair(encoded[0], encoded[1], n)


@dataclasses.dataclass(frozen=True)
class PreferenceFiles(Source):
    """Preference pairs, one per JSON line or Parquet row: `{"prompt", "chosen", "rejected"}`.

    A source for `build_store`, which builds a preference store from it (meta.json "kind":
    "preference"): each pair is one document, chosen conversation then rejected; unusable
    pairs are counted per reason with their `file:line` and skipped.

    Args:
        name: the source's name.
        paths: files, directories, globs or URLs (`.jsonl[.gz|.zst|...]`, `.parquet`).
        template: the chat template.
        prompt_key: the field holding the prompt (messages or a string; may be absent when
            the replies are whole conversations).
        chosen_key: the field holding the chosen reply.
        rejected_key: the field holding the rejected reply.
        tools_key: the field holding JSON-schema tools (a list, or a JSON string of one).

    >>> import tempfile, pathlib
    >>> from meltemi.data import ByteTokenizer, build_store
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> rows = [{"prompt": "hi", "chosen": "yo", "rejected": "no"},
    ...         {"prompt": "hi", "chosen": "yo", "rejected": "yo"}]
    >>> _ = (d / "p.jsonl").write_text("\\n".join(json.dumps(r) for r in rows))
    >>> t = ChatTemplate("{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}")
    >>> store = build_store([PreferenceFiles("p", [str(d)], template=t)], ByteTokenizer(),
    ...                     d / "s")
    >>> store.is_preference, store.num_documents, store.skipped
    (True, 1, {'identical_replies': 1})
    """

    store_kind: ClassVar[str] = "preference"

    name: str
    paths: tuple[str, ...]
    template: ChatTemplate
    prompt_key: str = "prompt"
    chosen_key: str = "chosen"
    rejected_key: str = "rejected"
    tools_key: str = "tools"

    def __post_init__(self):
        object.__setattr__(self, "paths", tuple(os.fspath(p) for p in self.paths))
        if not isinstance(self.template, ChatTemplate):
            raise SourceError(
                f"PreferenceFiles(name={self.name!r}): template={self.template!r}; pass a "
                f"ChatTemplate (ChatTemplate.from_pretrained(tokenizer_dir) or ChatTemplate(text))"
            )

    def options(self) -> dict:
        return {
            "preference_format": PREFERENCE_FORMAT_VERSION,
            "template": self.template.fingerprint(),
            "prompt_key": self.prompt_key,
            "chosen_key": self.chosen_key,
            "rejected_key": self.rejected_key,
            "tools_key": self.tools_key,
        }

    def files(self) -> list[str]:
        return row_files(self, "preference pairs")

    def read(self, path: str) -> Iterator[RawDocument]:
        columns = (self.prompt_key, self.chosen_key, self.rejected_key, self.tools_key)
        return read_rows(self, path, columns, required=(self.chosen_key, "chosen_key"))

    def encode(self, raw: RawDocument, tokenizer: Tokenizer) -> EncodedPair:
        """The tokenized pair of one row read by `read`.

        Raises:
            ChatRowError: the row is unusable; `.reason` is the key it is counted under and
                `.location` is the row's `file:line`.
        """
        loc = raw.location
        row = parse_row(raw)
        if not isinstance(row, dict):
            raise ChatRowError("no_pair", f"the row is {shorten(row)}, not an object", loc)
        for key, option in ((self.chosen_key, "chosen_key"), (self.rejected_key, "rejected_key")):
            if row.get(key) is None:
                raise ChatRowError("no_pair", f"the row has no {key!r} field (set {option})", loc)
        tools = parse_tools(row, self.tools_key, loc)
        try:
            return encode_preference(
                row.get(self.prompt_key),
                row.get(self.chosen_key),
                row.get(self.rejected_key),
                tokenizer,
                self.template,
                tools=tools or None,
            )
        except ChatRowError as e:
            raise e.at(loc) from None
