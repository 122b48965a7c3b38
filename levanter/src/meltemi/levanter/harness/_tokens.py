"""The tokenizer side of the harness adapter: what lm-eval's `hf` model does with a tokenizer.

A Hugging Face `tokenizer.json` is used through `tokenizers` with the special tokens its
`tokenizer_config.json` names (as `transformers.AutoTokenizer` would); the byte tokenizer of
`meltemi.data` is used as is.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from meltemi import data as md


def _token_name(value: Any) -> str | None:
    if isinstance(value, dict):  # {"content": "<s>", ...}
        value = value.get("content")
    return value if isinstance(value, str) and value else None


class HarnessTokenizer:
    """Encoding and decoding as lm-eval's `hf` model does them.

    Args:
        tokenizer: the model's `meltemi.data` tokenizer (ids of bos/eos when no
            tokenizer_config.json names them; the byte tokenizer is used directly).
        tokenizer_json: the `tokenizer.json` behind it, if any.
    """

    def __init__(self, tokenizer: md.Tokenizer, tokenizer_json: str | pathlib.Path | None):
        self.base = tokenizer
        self._tok = None
        self.bos_id = tokenizer.bos_id
        self.eos_id = tokenizer.eos_id
        if tokenizer_json is not None:
            import tokenizers

            path = pathlib.Path(tokenizer_json)
            self._tok = tokenizers.Tokenizer.from_file(str(path))
            config = path.with_name("tokenizer_config.json")
            if config.is_file():
                data = json.loads(config.read_text())
                for attr, key in (("bos_id", "bos_token"), ("eos_id", "eos_token")):
                    name = _token_name(data.get(key))
                    if key in data:  # the config decides, `null` included (as transformers)
                        setattr(self, attr, self._tok.token_to_id(name) if name else None)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids; `add_special_tokens` adds what the tokenizer's post-processor adds."""
        if self._tok is None:
            return [int(i) for i in self.base.encode(text)]
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if self._tok is None:
            return self.base.decode(ids)
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)


def tokenizer_json_of(path: pathlib.Path, kind: str, spec: Any) -> pathlib.Path | None:
    """The tokenizer.json of a checkpoint: the Hugging Face directory's, or the run's
    `data.tokenizer` (None for the byte tokenizer)."""
    if kind == "hf" and (path / "tokenizer.json").is_file():
        return path / "tokenizer.json"
    if spec is not None and spec.data.tokenizer != "byte":
        found = pathlib.Path(spec.data.tokenizer).expanduser()
        return found / "tokenizer.json" if found.is_dir() else found
    return None
