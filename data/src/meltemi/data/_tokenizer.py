"""Tokenizers: a dependency-free byte tokenizer and Hugging Face `tokenizer.json` files."""

from __future__ import annotations

import abc
import hashlib
import json
import os
import re
from collections.abc import Iterable

import numpy as np

__all__ = [
    "ByteTokenizer",
    "HfTokenizer",
    "Tokenizer",
    "TokenizerError",
    "load_tokenizer",
    "train_bpe",
]


class TokenizerError(ValueError):
    """A tokenizer file or option is unusable."""


class Tokenizer(abc.ABC):
    """What the store and datasets need from a tokenizer."""

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int: ...

    @property
    @abc.abstractmethod
    def bos_id(self) -> int | None:
        """The id prepended to documents, or None when the tokenizer has no bos token."""

    @property
    @abc.abstractmethod
    def eos_id(self) -> int | None:
        """The id appended to documents, or None when the tokenizer has no eos token."""

    @property
    @abc.abstractmethod
    def pad_id(self) -> int: ...

    @abc.abstractmethod
    def encode(self, text: str) -> np.ndarray:
        """Token ids of `text` (int32, no special tokens added)."""

    @abc.abstractmethod
    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """Text of `ids` (special tokens dropped)."""

    @property
    def bos_token(self) -> str | None:
        """The bos token's string (None when there is none)."""
        return None

    @property
    def eos_token(self) -> str | None:
        """The eos token's string (None when there is none)."""
        return None

    def encode_with_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """(ids int32[n], offsets int64[n, 2]) of `text`, special-token strings becoming their ids.

        This is how chat text is tokenized: a rendered template writes its control tokens
        (`<|im_end|>`, `{{ eos_token }}`) as strings. `offsets[i]` is the `[start, end)` range of
        characters of `text` that token `i` covers (the char-to-token map of chat loss masks).
        """
        raise TokenizerError(
            f"{type(self).__name__} cannot tokenize chat text: implement encode_with_offsets, "
            f"or use HfTokenizer or ByteTokenizer"
        )

    @abc.abstractmethod
    def fingerprint(self) -> str:
        """A hex digest identifying the exact token mapping."""


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as tokens 0..255, then bos=256, eos=257, pad=258 (vocab 259).

    In chat text (`encode_with_offsets`) the strings `<bos>` and `<eos>` are the bos and eos
    ids, so a byte-level chat model can learn to stop; `encode` keeps them as bytes.

    >>> tok = ByteTokenizer()
    >>> ids = tok.encode("héllo")
    >>> ids.tolist(), tok.decode(ids), tok.vocab_size
    ([104, 195, 169, 108, 108, 111], 'héllo', 259)
    >>> tok.encode_with_offsets("é<eos>")[0].tolist()
    [195, 169, 257]
    """

    @property
    def vocab_size(self) -> int:
        return 259

    @property
    def bos_id(self) -> int:
        return 256

    @property
    def eos_id(self) -> int:
        return 257

    @property
    def pad_id(self) -> int:
        return 258

    def encode(self, text: str) -> np.ndarray:
        data = text.encode("utf-8", errors="surrogatepass")
        return np.frombuffer(data, np.uint8).astype(np.int32)

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        arr = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids)
        return bytes(arr[arr < 256].astype(np.uint8)).decode("utf-8", errors="replace")

    @property
    def bos_token(self) -> str:
        return "<bos>"

    @property
    def eos_token(self) -> str:
        return "<eos>"

    def encode_with_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        specials = {self.bos_token: self.bos_id, self.eos_token: self.eos_id}
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        for m in _BYTE_SPECIALS.finditer(text):
            start = m.start()
            if m.group() in specials:
                ids.append(specials[m.group()])
                offsets.append((start, m.end()))
                continue
            for k, ch in enumerate(m.group()):  # each byte of a character covers that character
                data = ch.encode("utf-8", errors="surrogatepass")
                ids.extend(data)
                offsets.extend([(start + k, start + k + 1)] * len(data))
        return np.asarray(ids, np.int32), np.asarray(offsets, np.int64).reshape(-1, 2)

    def fingerprint(self) -> str:
        return hashlib.sha256(b"meltemi.ByteTokenizer/v1:bos=256,eos=257,pad=258").hexdigest()

    def save_pretrained(self, directory: str | os.PathLike) -> list[str]:
        """Writes this mapping as a Hugging Face `tokenizer.json` (byte-level, no merges: byte
        `b` is token `b`; `<bos>`, `<eos>`, `<pad>` are the special tokens 256-258) and a
        `tokenizer_config.json` naming them, so `transformers.AutoTokenizer`, `tokenizers` and
        `HfTokenizer` read an exported byte-level model. Needs `tokenizers` (extra `[hf]`).

        Returns:
            The paths written.
        """
        tk = _tokenizers()
        vocab = {ch: b for b, ch in enumerate(_byte_chars())}
        tok = tk.Tokenizer(tk.models.BPE(vocab, [], fuse_unk=False))
        tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = tk.decoders.ByteLevel()
        specials = (self.bos_token, self.eos_token, "<pad>")
        tok.add_special_tokens([tk.AddedToken(t, special=True, normalized=False) for t in specials])
        os.makedirs(directory, exist_ok=True)
        paths = [os.path.join(directory, n) for n in ("tokenizer.json", "tokenizer_config.json")]
        tok.save(paths[0])
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "pad_token": "<pad>",
            "model_max_length": 1 << 30,
        }
        with open(paths[1], "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)
            f.write("\n")
        return paths

    def __eq__(self, other) -> bool:
        return isinstance(other, ByteTokenizer)

    def __hash__(self) -> int:
        return hash("ByteTokenizer")

    def __repr__(self) -> str:
        return "ByteTokenizer()"


def _byte_chars() -> list[str]:
    """GPT-2's printable stand-in character of each byte 0..255 (what `tokenizers`'
    ByteLevel pre-tokenizer maps byte `b` to)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


_BYTE_SPECIALS = re.compile(r"<bos>|<eos>|(?:(?!<bos>|<eos>).)+", re.DOTALL)


def _tokenizers():
    try:
        import tokenizers
    except ModuleNotFoundError as e:  # pragma: no cover - exercised by the wheel test
        raise ModuleNotFoundError(
            "HfTokenizer needs the `tokenizers` package: pip install 'meltemi-data[hf]'",
            name="tokenizers",
        ) from e
    return tokenizers


class HfTokenizer(Tokenizer):
    """A Hugging Face `tokenizer.json` loaded with the `tokenizers` package (extra `[hf]`).

    Special tokens are found by name. For each of bos, eos and pad: a token string names it
    (an error if the tokenizer has no such token), `""` means none, and None (the default)
    tries common spellings. By default a tokenizer without a bos token (GPT-2 and Qwen style)
    gets no bos (`bos_id is None`: documents are not prefixed), a missing eos is an error
    (pass `eos=""` to build without separators), and pad falls back to eos.

    Args:
        path: a `tokenizer.json` file, or a directory containing one.
        bos: the bos token string, `""` for none, or None to look for a common one.
        eos: the eos token string, `""` for none, or None to look for a common one.
        pad: the pad token string, or None to look for one (else eos).

    Raises:
        TokenizerError: the file is missing or a named special token is not in it.
    """

    _BOS = ("<|begin_of_text|>", "<s>", "<bos>", "<|bos|>", "<|endoftext|>")
    _EOS = ("<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "<|endoftext|>")
    _PAD = ("<pad>", "<|pad|>", "[PAD]", "<|padding|>")

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        bos: str | None = None,
        eos: str | None = None,
        pad: str | None = None,
    ):
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(path):
            raise TokenizerError(
                f"HfTokenizer(path={path!r}): no such file; pass a tokenizer.json "
                f"(train one with `bazel run //data:train_tokenizer`)"
            )
        for what, value in (("bos", bos), ("eos", eos), ("pad", pad)):
            if value is not None and not isinstance(value, str):
                raise TokenizerError(
                    f"HfTokenizer({what}={value!r}): pass a token string, '' for none, or None "
                    f"to look for a common one"
                )
        if pad == "":
            raise TokenizerError(
                "HfTokenizer(pad=''): rows need a pad token; pass its string, or None to use eos"
            )
        with open(path, encoding="utf-8") as f:
            self._json = f.read()
        self._path = path
        self._names = (bos, eos, pad)
        self._load()

    def _load(self) -> None:
        tk = _tokenizers()
        self._tok = tk.Tokenizer.from_str(self._json)
        bos, eos, pad = self._names
        self._bos = self._find("bos", bos, self._BOS, required=False)
        self._eos = self._find("eos", eos, self._EOS, required=True)
        pad_id = self._find("pad", pad, self._PAD, required=False)
        if pad_id is None:
            pad_id = self._eos
        if pad_id is None:
            raise TokenizerError(
                f"HfTokenizer({self._path!r}): no pad token among {list(self._PAD)} and no eos "
                f"to pad with; pass pad='<the token string>'"
            )
        self._pad = pad_id

    def _find(self, what: str, name: str | None, candidates, *, required: bool) -> int | None:
        """The id of a named special token; None for `""`, or when none of the candidates is
        there and the token is not `required`."""
        if name == "":
            return None
        names = (name,) if name is not None else candidates
        for n in names:
            i = self._tok.token_to_id(n)
            if i is not None:
                return int(i)
        if name is None and not required:
            return None
        hint = f"{what}='<the token string>' naming one of its special tokens"
        if name is None:
            hint += f", or {what}='' for none"
        raise TokenizerError(f"HfTokenizer({self._path!r}): no {what} token among {list(names)}; "
                             f"pass {hint}")  # fmt: skip

    @property
    def bos_token(self) -> str | None:
        """The bos token string (None when there is none)."""
        return None if self._bos is None else self._tok.id_to_token(self._bos)

    @property
    def eos_token(self) -> str | None:
        """The eos token string (None when there is none)."""
        return None if self._eos is None else self._tok.id_to_token(self._eos)

    def __getstate__(self):
        return {"json": self._json, "path": self._path, "names": self._names}

    def __setstate__(self, state):
        self._json, self._path, self._names = state["json"], state["path"], state["names"]
        self._load()

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def bos_id(self) -> int | None:
        return self._bos

    @property
    def eos_id(self) -> int | None:
        return self._eos

    @property
    def pad_id(self) -> int:
        return self._pad

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, np.int32)

    def encode_with_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        # The `tokenizers` encoding `transformers` uses: added tokens in the text are matched,
        # offsets are characters (post-processor trimming included, as `char_to_token` sees them).
        enc = self._tok.encode(text, add_special_tokens=False)
        offsets = np.asarray(enc.offsets, np.int64).reshape(-1, 2)
        return np.asarray(enc.ids, np.int32), offsets

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        encs = self._tok.encode_batch(texts, add_special_tokens=False)
        return [np.asarray(e.ids, np.int32) for e in encs]

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def fingerprint(self) -> str:
        canon = json.dumps(json.loads(self._json), sort_keys=True, separators=(",", ":"))
        specials = f"|{self._bos},{self._eos},{self._pad}"
        return hashlib.sha256((canon + specials).encode()).hexdigest()

    def __repr__(self) -> str:
        return f"HfTokenizer({self._path!r})"


def train_bpe(
    texts: Iterable[str],
    vocab_size: int,
    output: str | os.PathLike,
    *,
    min_frequency: int = 2,
) -> HfTokenizer:
    """Trains a byte-level BPE tokenizer on `texts` and saves it as `output` (a tokenizer.json).

    Special tokens `<bos>`, `<eos>`, `<pad>` are added first (ids 0, 1, 2).

    Raises:
        TokenizerError: if `vocab_size` is too small for the 256 byte tokens plus specials.
    """
    if vocab_size < 259 + 1:
        raise TokenizerError(
            f"train_bpe(vocab_size={vocab_size}): need at least 260 (256 bytes, 3 specials "
            f"and one merge); try vocab_size=4096"
        )
    tk = _tokenizers()
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=["<bos>", "<eos>", "<pad>"],
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    output = os.fspath(output)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    tok.save(output)
    return HfTokenizer(output, bos="<bos>", eos="<eos>", pad="<pad>")


def load_tokenizer(spec: str | os.PathLike) -> Tokenizer:
    """`"byte"` -> `ByteTokenizer()`; anything else is a tokenizer.json path (`HfTokenizer`).

    >>> load_tokenizer("byte")
    ByteTokenizer()
    """
    if os.fspath(spec) == "byte":
        return ByteTokenizer()
    return HfTokenizer(spec)
