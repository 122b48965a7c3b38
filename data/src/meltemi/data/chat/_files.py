"""`ChatFiles`: conversations in JSON lines (plain or compressed) and Parquet files."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator

from meltemi.data._sources import (
    RawDocument,
    Source,
    SourceError,
    expand_paths,
    file_format,
    open_binary,
)
from meltemi.data._tokenizer import Tokenizer
from meltemi.data.chat._encode import TRAIN_ON, ChatRowError, EncodedChat, encode_chat
from meltemi.data.chat._template import ChatTemplate

__all__ = ["ChatFiles"]

CHAT_FORMAT_VERSION = 1  # bump when the same rows would encode differently


@dataclasses.dataclass(frozen=True)
class ChatFiles(Source):
    """Conversations, one per JSON line or Parquet row: `{"messages": [...], "tools": [...]}`.

    `read` yields each row as JSON text (located `file:line`, or `file:row N` in Parquet);
    `encode` renders it through `template` and tokenizes it (`encode_chat`). Unusable rows
    raise `ChatRowError` from `encode`, with a reason key and the row's location, so a build
    counts and skips them.

    Args:
        name: the source's name.
        paths: files, directories, globs or URLs (`.jsonl[.gz|.zst|...]`, `.parquet`).
        template: the chat template.
        train_on: `"assistant"` or `"all"`.
        messages_key: the field holding the messages.
        tools_key: the field holding the JSON-schema tools (a list, or a JSON string of one).

    >>> import tempfile, pathlib
    >>> from meltemi.data import ByteTokenizer
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "a.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}, '
    ...                                '{"role": "assistant", "content": "yo"}]}\\n{"text": 1}\\n')
    >>> t = ChatTemplate("{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}")
    >>> src = ChatFiles("demo", [str(d)], template=t)
    >>> rows = list(src.read(src.files()[0]))
    >>> src.encode(rows[0], ByteTokenizer()).ids.tolist()
    [104, 105, 257, 121, 111, 257]
    >>> try:
    ...     src.encode(rows[1], ByteTokenizer())
    ... except ChatRowError as e:
    ...     print(e.reason)
    no_messages
    """

    name: str
    paths: tuple[str, ...]
    template: ChatTemplate
    train_on: str = "assistant"
    messages_key: str = "messages"
    tools_key: str = "tools"

    def __post_init__(self):
        object.__setattr__(self, "paths", tuple(os.fspath(p) for p in self.paths))
        if not isinstance(self.template, ChatTemplate):
            raise SourceError(
                f"ChatFiles(name={self.name!r}): template={self.template!r}; pass a ChatTemplate "
                f"(ChatTemplate.from_pretrained(tokenizer_dir) or ChatTemplate(text))"
            )
        if self.train_on not in TRAIN_ON:
            raise SourceError(
                f"ChatFiles(name={self.name!r}): train_on={self.train_on!r}; use one of "
                f"{list(TRAIN_ON)}"
            )

    def options(self) -> dict:
        return {
            "chat_format": CHAT_FORMAT_VERSION,
            "template": self.template.fingerprint(),
            "train_on": self.train_on,
            "messages_key": self.messages_key,
            "tools_key": self.tools_key,
        }

    def files(self) -> list[str]:
        return row_files(self, "conversations")

    def read(self, path: str) -> Iterator[RawDocument]:
        columns = (self.messages_key, self.tools_key)
        return read_rows(self, path, columns, required=(self.messages_key, "messages_key"))

    def encode(self, raw: RawDocument, tokenizer: Tokenizer) -> EncodedChat:
        """The tokenized conversation of one row read by `read`.

        Raises:
            ChatRowError: the row is unusable; `.reason` is the key it is counted under and
                `.location` is the row's `file:line`.
        """
        loc = raw.location
        row = parse_row(raw)
        if not isinstance(row, dict) or row.get(self.messages_key) is None:
            raise ChatRowError(
                "no_messages", f"the row has no {self.messages_key!r} field (set messages_key)", loc
            )
        tools = parse_tools(row, self.tools_key, loc)
        try:
            return encode_chat(
                row[self.messages_key],
                tokenizer,
                self.template,
                train_on=self.train_on,
                tools=tools or None,
            )
        except ChatRowError as e:
            raise e.at(loc) from None


def row_files(source, what: str) -> list[str]:
    """`source.files()` of a row source: its expanded paths, each JSON lines or Parquet.

    Raises:
        SourceError: a file of another format; `what` names the rows it should hold.
    """
    files = source._check_files(expand_paths(source.paths), source.paths)
    for f in files:
        if file_format(f) == "text":
            raise SourceError(
                f"{type(source).__name__}(name={source.name!r}): {f} is neither JSON lines nor "
                f"Parquet; {what} are .jsonl (plain or .gz/.zst/...) or .parquet files"
            )
    return files


def parse_row(raw: RawDocument) -> object:
    """The JSON value of one row read by `read_rows`.

    Raises:
        ChatRowError: the row could not be read, or is not JSON (`malformed_json`).
    """
    loc = raw.location
    if raw.text is None:
        raise ChatRowError(raw.reason or "unreadable", raw.problem or "unreadable row", loc)
    text = raw.text.decode("utf-8", "replace") if isinstance(raw.text, bytes) else raw.text
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ChatRowError(
            "malformed_json", f"malformed JSON ({e.msg} at column {e.colno})", loc
        ) from None


def parse_tools(row: dict, key: str, loc: str) -> object:
    """`row[key]`, the tool schemas: some sets store them as a JSON string, decoded here.

    Raises:
        ChatRowError: a string that is not JSON (`bad_tools`).
    """
    tools = row.get(key)
    if isinstance(tools, str):
        try:
            return json.loads(tools)
        except json.JSONDecodeError as e:
            raise ChatRowError(
                "bad_tools", f"{key!r} is a string but not JSON ({e.msg})", loc
            ) from None
    return tools


def read_rows(
    source: Source, path: str, columns: tuple[str, ...], *, required: tuple[str, str]
) -> Iterator[RawDocument]:
    """The rows of a JSON-lines (plain or compressed) or Parquet file, each as JSON text,
    located `file:line` or `file:row N`; a line that is not UTF-8 is a row with a problem.

    Only `columns` of a Parquet file are read; one without the column `required[0]` is a
    `SourceError` naming the source's option `required[1]` that holds that column's name."""
    if file_format(path) == "parquet":
        return _read_parquet(source, path, columns, required)
    return _read_jsonl(path)


def _read_jsonl(path: str) -> Iterator[RawDocument]:
    with open_binary(path) as f:
        for lineno, line in enumerate(f, start=1):
            if lineno == 1:
                line = line.removeprefix(b"\xef\xbb\xbf")
            if not line.strip():
                continue
            loc = f"{path}:{lineno}"
            try:
                yield RawDocument(loc, line.decode("utf-8").strip())
            except UnicodeDecodeError as e:
                yield RawDocument(loc, None, f"invalid UTF-8 at byte {e.start}", "invalid_utf8")


def _read_parquet(
    source: Source, path: str, columns: tuple[str, ...], required: tuple[str, str]
) -> Iterator[RawDocument]:
    try:
        import pyarrow.parquet as pq
    except ModuleNotFoundError as e:  # pragma: no cover
        raise SourceError(
            "Parquet chat files need pyarrow: pip install 'meltemi-data[parquet]'"
        ) from e
    with open_binary(path) as f:
        pf = pq.ParquetFile(f)
        names = pf.schema_arrow.names
        column, option = required
        if column not in names:
            raise SourceError(
                f"{type(source).__name__}(name={source.name!r}): {path} has no column "
                f"{column!r}; its columns are {names} (set {option})"
            )
        row = 0
        for batch in pf.iter_batches(columns=[c for c in columns if c in names], batch_size=256):
            for record in batch.to_pylist():
                row += 1
                text = json.dumps(record, ensure_ascii=False, default=str)
                yield RawDocument(f"{path}:row {row}", text)
