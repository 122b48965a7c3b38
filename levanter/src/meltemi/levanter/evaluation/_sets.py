"""The evaluation sets of `//levanter:eval`: the config's validation sets and `--eval_files`."""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import re

from meltemi import data as md
from meltemi.levanter.config import RunSpec
from meltemi.levanter.config._spec import default_cache_dir
from meltemi.levanter.evaluation._load import EvalError
from meltemi.levanter.trainer._data import source_store
from meltemi.levanter.trainer._eval import fixed_eval_set
from meltemi.levanter.trainer._parts import EvalSet

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclasses.dataclass(frozen=True)
class SetShape:
    """How each set is cut: `num_batches` batches of `batch_size` rows of `seq_len` tokens."""

    seq_len: int
    batch_size: int
    num_batches: int


def parse_eval_files(text: str) -> dict[str, str]:
    """`--eval_files=name=PATH,name2=PATH2` as `{name: path}` (paths may be globs).

    Raises:
        EvalError: an entry without `=`, an empty or repeated name, or a path matching no file.

    Example:
        >>> parse_eval_files("")
        {}
    """
    out: dict[str, str] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, sep, path = entry.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not name or not path:
            raise EvalError(
                f"--eval_files: {entry!r} is not NAME=PATH; e.g. "
                f"--eval_files=wiki=data/wiki_val.jsonl,code=data/code_val.jsonl"
            )
        if not _NAME.match(name):
            raise EvalError(
                f"--eval_files: the set name {name!r} (in {entry!r}) may use only letters, "
                f"digits, '_', '-' and '.'; it names the set in eval.json and the metrics."
            )
        if name in out:
            raise EvalError(f"--eval_files: the set name {name!r} is given twice; rename one.")
        found = list(pathlib.Path().glob(path)) if any(c in path for c in "*?[") else []
        if not found and not pathlib.Path(path).expanduser().exists():
            raise EvalError(f"--eval_files: {name}={path!r}: no such file; check the path.")
        out[name] = str(pathlib.Path(path).expanduser())
    return out


def file_store(
    name: str, path: str, tokenizer: md.Tokenizer, cache_dir: pathlib.Path
) -> md.TokenStore:
    """A token store of one evaluation file (built once, cached by content and tokenizer)."""
    source = md.Files(name, (path,))
    try:
        digest = hashlib.sha256(source.fingerprint().encode()).hexdigest()[:12]
    except md.SourceError as e:
        raise EvalError(f"--eval_files: {name}={path!r}: {e}") from None
    store_dir = cache_dir / f"eval-{name}-{tokenizer.fingerprint()[:12]}-{digest}"
    md.build_store([source], tokenizer, store_dir)
    store = md.TokenStore.open(store_dir, tokenizer)
    if store.num_tokens == 0:
        raise EvalError(f"--eval_files: {name}={path!r} holds no text to evaluate.")
    return store


def config_stores(spec: RunSpec) -> dict[str, md.TokenStore]:
    """The stores of the config's evaluation sets (what the trainer evaluates, same names)."""
    stores = {}
    if spec.data.mixture is not None:
        for c in spec.data.mixture.components:
            if c.validation is not None:
                key = f"data.components.{c.name}.validation"
                stores[c.name] = source_store(spec, key, c.validation, spec.tokenizer)
    for name, source in spec.data.validation:
        stores[name] = source_store(spec, "data.validation_files", source, spec.tokenizer)
    return stores


def set_shape(spec: RunSpec | None, max_seq_len: int) -> SetShape:
    """The config's `data.seq_len` and `eval.*`, or (no config) 1024-token rows (at most the
    model's `max_seq_len`), 8 per batch, 4 batches."""
    if spec is not None:
        return SetShape(spec.data.seq_len, spec.eval.batch_size, spec.eval.num_batches)
    return SetShape(min(1024, max_seq_len), 8, 4)


def eval_sets(
    spec: RunSpec | None,
    tokenizer: md.Tokenizer,
    files: dict[str, str],
    shape: SetShape,
    *,
    use_config_sets: bool = True,
) -> list[EvalSet]:
    """The config's evaluation sets (if any) then one set per `--eval_files` entry.

    Args:
        spec: the run's config (its validation sets and cache directory), or None.
        tokenizer: the model's tokenizer.
        files: `{name: path}` from `parse_eval_files`.
        shape: rows, batch size and batch count of each set.
        use_config_sets: include the config's validation sets.
    """
    stores = config_stores(spec) if spec is not None and use_config_sets else {}
    cache = spec.data.cache_dir if spec is not None else default_cache_dir("")
    for name, path in files.items():
        if name in stores:
            raise EvalError(
                f"--eval_files: the set name {name!r} is already an evaluation set of the "
                f"config; rename it (e.g. {name}_extra=...)."
            )
        stores[name] = file_store(name, path, tokenizer, cache)
    if not stores:
        raise EvalError(
            "nothing to evaluate: the config has no evaluation sets; pass "
            "--eval_files=NAME=PATH (text, JSON lines or Parquet)."
        )
    if shape.num_batches <= 0:
        raise EvalError(
            f"eval.num_batches={shape.num_batches}: nothing would be evaluated; pass "
            f"--num_batches=4 (or --config.eval.num_batches)."
        )
    return [
        fixed_eval_set(n, s, tokenizer, shape.seq_len, shape.batch_size, shape.num_batches)
        for n, s in stores.items()
    ]
