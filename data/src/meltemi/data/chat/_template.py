"""Chat templates rendered exactly as `transformers`' `apply_chat_template` renders them.

The Jinja environment is a copy of `transformers.utils.chat_template_utils._compile_jinja_template`
(version 5.x): an immutable sandbox with `trim_blocks`, `lstrip_blocks`, `loopcontrols`, the
`{% generation %}` tag, transformers' `tojson` (no HTML escaping, `indent`/`separators`/
`sort_keys`), `raise_exception`, `strftime_now`, a restricted `dict` and `namespace`. Inputs
go through the same normalisation (keys whose value is None dropped, plain JSON data,
reasoning-field aliases) and the tokenizer's special-token strings are template variables.
`transformers` itself is never imported.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

__all__ = ["CONFIG_KEY", "ChatTemplate", "ChatTemplateError", "SPECIAL_TOKEN_KEYS"]

CONFIG_KEY = "data.chat_template"
"""The config key that names a template file (quoted in errors)."""

SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
"""transformers' `SPECIAL_TOKENS_ATTRIBUTES`: the special-token variables a template sees."""

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
_GENERATION_TAG = re.compile(r"\{\%-?\s*generation\s*-?\%\}")  # transformers' own test


class ChatTemplateError(ValueError):
    """A chat template is missing, unreadable or does not compile."""


def _jinja():
    try:
        import jinja2
        import jinja2.ext
        import jinja2.sandbox
    except ModuleNotFoundError as e:  # pragma: no cover - exercised by the wheel test
        raise ModuleNotFoundError(
            "chat templates need Jinja2: pip install 'meltemi-data[chat]'", name="jinja2"
        ) from e
    return jinja2


def _environment():
    """A Jinja environment identical to the one transformers compiles chat templates in."""
    jinja2 = _jinja()

    class AssistantTracker(jinja2.ext.Extension):
        # Records the character spans `{% generation %}` blocks render to, as transformers does:
        # the offset is the length of everything the top-level render has yielded so far.
        tags = {"generation"}

        def __init__(self, environment):
            super().__init__(environment)
            environment.extend(activate_tracker=self.activate_tracker)
            self._rendered_blocks = None
            self._generation_indices = None

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            call = self.call_method("_generation_support")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        @jinja2.pass_eval_context
        def _generation_support(self, context, caller) -> str:
            rv = caller()
            if self._rendered_blocks is not None:
                start = len("".join(self._rendered_blocks))
                self._generation_indices.append((start, start + len(rv)))
            return rv

        @contextlib.contextmanager
        def activate_tracker(self, rendered_blocks: list, generation_indices: list):
            if self._rendered_blocks is not None:
                raise RuntimeError("ChatTemplate: one render at a time per template")
            try:
                self._rendered_blocks = rendered_blocks
                self._generation_indices = generation_indices
                yield
            finally:
                self._rendered_blocks = None
                self._generation_indices = None

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format):
        return datetime.now().strftime(format)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, "
                    f"but got {name!r}. Please rename the attribute."
                )

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[AssistantTracker, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


def _plain(value: Any) -> Any:
    """Plain JSON data, as transformers' `_plain_template_data` rebuilds every input."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if hasattr(value, "item") and hasattr(value, "dtype"):  # numpy scalars (from Parquet rows)
        return _plain(value.item())
    return f"<{type(value).__name__}>"


def _alias_reasoning(chat: list) -> list:
    out = []
    for message in chat:
        if isinstance(message, dict):
            reasoning = next(
                (message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None
            )
            if reasoning is not None:
                message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def _token_string(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


class ChatTemplate:
    """A Jinja chat template, rendered as `transformers`' `apply_chat_template` renders it.

    Args:
        source: the template text.
        name: where it came from (shown in errors).
        special_tokens: `bos_token`, `eos_token`, ... strings the template sees as variables
            (transformers passes the tokenizer's `special_tokens_map`).

    Raises:
        ChatTemplateError: the template does not compile.

    >>> t = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    >>> t.render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    '<user>hi<assistant>yo'
    """

    def __init__(
        self,
        source: str,
        *,
        name: str = "inline",
        special_tokens: Mapping[str, str] | None = None,
    ):
        if not isinstance(source, str) or not source:
            raise ChatTemplateError(
                f"ChatTemplate(name={name!r}): the template is {source!r}; pass the Jinja text "
                f"(or set {CONFIG_KEY} to a template file)"
            )
        self.source = source
        self.name = name
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        self._compiled = None
        self._compile()

    def _compile(self):
        if self._compiled is None:
            jinja2 = _jinja()
            try:
                self._compiled = _environment().from_string(self.source)
            except jinja2.exceptions.TemplateSyntaxError as e:
                raise ChatTemplateError(
                    f"chat template {self.name}: line {e.lineno}: {e.message}; fix the template "
                    f"or set {CONFIG_KEY} to another file"
                ) from None
        return self._compiled

    def __getstate__(self):
        return {"source": self.source, "name": self.name, "special_tokens": self.special_tokens}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._compiled = None

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r}, fingerprint={self.fingerprint()[:12]!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, ChatTemplate) and self.fingerprint() == other.fingerprint()

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    @property
    def has_generation_tag(self) -> bool:
        """Whether the template marks assistant text with `{% generation %}` blocks."""
        return _GENERATION_TAG.search(self.source) is not None

    def fingerprint(self) -> str:
        """A hex digest of the template text and its special-token variables."""
        blob = json.dumps([self.source, sorted(self.special_tokens.items())])
        return hashlib.sha256(blob.encode()).hexdigest()

    @classmethod
    def from_pretrained(
        cls,
        directory: str | os.PathLike | None,
        *,
        template_file: str | os.PathLike | None = None,
        name: str | None = None,
    ) -> ChatTemplate:
        """The chat template of a Hugging Face tokenizer directory, as transformers loads it.

        `chat_template.jinja` (and `additional_chat_templates/*.jinja`) take priority over the
        `chat_template` of `tokenizer_config.json` (a string, or a list of `{"name",
        "template"}`). Of several named templates, `name` is used, else `"default"`. The
        special-token strings come from `tokenizer_config.json` (then `special_tokens_map.json`).

        Args:
            directory: the tokenizer directory (None: only `template_file`).
            template_file: a Jinja file that replaces the directory's template.
            name: which of several named templates to use.

        Raises:
            ChatTemplateError: no template found (the message names `data.chat_template`), or
                the file or config is unreadable.
        """
        directory = None if directory is None else os.fspath(directory)
        config: dict = {}
        if directory is not None:
            config = _read_json(os.path.join(directory, "tokenizer_config.json"))
            legacy = _read_json(os.path.join(directory, "special_tokens_map.json"))
            for key, value in legacy.items():
                config.setdefault(key, value)
        special = {k: s for k in SPECIAL_TOKEN_KEYS if (s := _token_string(config.get(k)))}
        if template_file is not None:
            path = os.fspath(template_file)
            try:
                with open(path, encoding="utf-8") as f:
                    return cls(f.read(), name=path, special_tokens=special)
            except OSError as e:
                raise ChatTemplateError(
                    f"{CONFIG_KEY}={path!r}: cannot read the template file ({e.strerror}); "
                    f"set it to an existing Jinja file"
                ) from None
        templates = _directory_templates(directory) if directory is not None else {}
        if not templates:
            value = config.get("chat_template")
            if isinstance(value, str):
                templates = {"default": value}
            elif isinstance(value, list):
                templates = {t["name"]: t["template"] for t in value if isinstance(t, dict)}
        where = directory if directory is not None else "(no tokenizer directory)"
        if not templates:
            raise ChatTemplateError(
                f"the tokenizer at {where} has no chat template (no chat_template.jinja and no "
                f"'chat_template' in tokenizer_config.json); set {CONFIG_KEY} to a Jinja "
                f"template file"
            )
        chosen = name if name is not None else "default"
        if chosen not in templates:
            if name is None and len(templates) == 1:
                chosen = next(iter(templates))
            else:
                raise ChatTemplateError(
                    f"the tokenizer at {where} has chat templates {sorted(templates)} and no "
                    f"{chosen!r}; pick one by name, or set {CONFIG_KEY} to a template file"
                )
        label = f"{where}:{chosen}" if len(templates) > 1 else where
        return cls(templates[chosen], name=label, special_tokens=special)

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Writes the template as `chat_template` into `directory/tokenizer_config.json`.

        Other keys of an existing config are kept; special-token strings the config lacks are
        added. A `chat_template.jinja` left in the directory would win over the config when
        transformers loads it, so it is rewritten with the same text.
        """
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, "tokenizer_config.json")
        config = _read_json(path)
        config["chat_template"] = self.source
        for key, value in self.special_tokens.items():
            config.setdefault(key, value)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, ensure_ascii=False)
            f.write("\n")
        jinja_file = os.path.join(directory, "chat_template.jinja")
        if os.path.exists(jinja_file):
            with open(jinja_file, "w", encoding="utf-8") as f:
                f.write(self.source)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        **kwargs: Any,
    ) -> str:
        """The text `apply_chat_template(messages, tokenize=False, ...)` returns.

        Args:
            messages: `{"role", "content", ...}` dicts (keys whose value is None are dropped).
            tools: JSON-schema tool definitions (dicts), or None.
            documents: `{"title", "text"}` dicts for retrieval templates, or None.
            add_generation_prompt: end with the header of a new assistant turn.
            continue_final_message: end inside the final message (True: its `content`, or
                the name of the field to continue), so generation continues it.
            **kwargs: extra template variables (they override the special-token strings).

        Raises:
            jinja2.TemplateError: the template raised (`raise_exception`) or failed.
            TypeError, ValueError: malformed inputs (as transformers raises them).
        """
        return self._render(
            messages, tools, documents, add_generation_prompt, continue_final_message, kwargs
        )[0]

    def render_with_spans(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and the `[start, end)` character spans of its `{% generation %}`
        blocks (what `return_assistant_tokens_mask=True` maps to tokens)."""
        return self._render(messages, tools, documents, add_generation_prompt, False, kwargs, True)

    def _render(
        self, messages, tools, documents, add_generation_prompt, continue_final, kwargs, track=False
    ) -> tuple[str, list[tuple[int, int]]]:
        if continue_final and add_generation_prompt:
            raise ValueError(
                "continue_final_message and add_generation_prompt are not compatible: pick one"
            )
        if tools is not None:
            tools = list(tools)
            for tool in tools:
                if not isinstance(tool, Mapping):
                    raise TypeError(f"tools must be JSON-schema dicts, got {tool!r}")
        if documents is not None:
            for doc in documents:
                if not isinstance(doc, Mapping):
                    raise TypeError(
                        "Documents should be a list of dicts with 'title' and 'text' keys!"
                    )
        chat = []
        for message in messages:
            if not isinstance(message, Mapping):
                raise TypeError(f"Chat messages should be dicts, but got {message!r}.")
            chat.append({k: v for k, v in message.items() if v is not None})
        chat = _alias_reasoning(_plain(chat))
        variables = {**self.special_tokens, **_plain(kwargs)}
        final = None
        if continue_final:
            final, chat = self._tag_final(chat, continue_final)
        compiled = self._compile()
        context = dict(
            messages=chat,
            tools=_plain(tools),
            documents=_plain(documents),
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
        spans: list[tuple[int, int]] = []
        if track:
            blocks: list[str] = []
            with compiled.environment.activate_tracker(blocks, spans):
                for block in compiled.generate(**context):
                    blocks.append(block)
                text = "".join(blocks)
        else:
            text = compiled.render(**context)
        if final is not None:
            text = _cut_at_tag(text, final)
        return text, spans

    def _tag_final(self, chat: list, field: bool | str) -> tuple[str, list]:
        if not chat:
            raise ValueError("continue_final_message is set but the conversation is empty!")
        field = field if isinstance(field, str) else "content"
        final = chat[-1].get(field)
        if final is None:
            raise ValueError(
                f'continue_final_message is set but the final message has no "{field}" to continue!'
            )
        fields = [field]
        if field in _REASONING_FIELDS:
            fields = [f for f in _REASONING_FIELDS if chat[-1].get(f) == final]
        if not any(f in self.source for f in fields):
            raise ValueError(
                f'continue_final_message is set to "{field}" but this is not an accepted field '
                f"in the chat_template"
            )
        if isinstance(final, list | tuple):
            for block in reversed(final):
                if "text" in block:
                    final = block["text"]
                    block["text"] = block["text"] + _CONTINUE_TAG
                    break
            else:
                raise ValueError(
                    "continue_final_message is set but we could not find any text to continue in "
                    "the final message!"
                )
        else:
            for f in fields:
                chat[-1][f] = chat[-1][f] + _CONTINUE_TAG
        return final, chat


def _cut_at_tag(text: str, final: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in text or tag not in text:
        raise ValueError(
            "continue_final_message is set but the final message does not appear in the chat "
            "after applying the chat template"
        )
    loc = text.rindex(tag)
    if text[loc : loc + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return text[:loc]
    return text[:loc].rstrip()


def _read_json(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ChatTemplateError(
            f"cannot read {path} ({e}); fix the file or set {CONFIG_KEY} to a template file"
        ) from None
    return value if isinstance(value, dict) else {}


def _directory_templates(directory: str) -> dict[str, str]:
    """`chat_template.jinja` as "default" plus `additional_chat_templates/NAME.jinja`."""
    found = {}
    main = os.path.join(directory, "chat_template.jinja")
    if os.path.isfile(main):
        with open(main, encoding="utf-8") as f:
            found["default"] = f.read()
    extra = os.path.join(directory, "additional_chat_templates")
    if os.path.isdir(extra):
        for fname in sorted(os.listdir(extra)):
            if fname.endswith(".jinja"):
                with open(os.path.join(extra, fname), encoding="utf-8") as f:
                    found[fname.removesuffix(".jinja")] = f.read()
    return found
