"""Token stores of evaluation sources, cached under one key by the trainer and `//levanter:eval`.

`cached_store` is the one way a source becomes a store: its directory is named by the source's
name, the tokenizer's fingerprint and the source's fingerprint, process 0 builds it (or
reopens the cached one) while the other processes wait, then every process opens it. The
trainer's validation sets, a mixture's components and `--eval_files` all go through it, so
`//levanter:eval` on a run's checkpoint reopens the validation stores the run built.
"""

from __future__ import annotations

import hashlib
import os
import pathlib

import jax
from jax.experimental import multihost_utils

from meltemi import data as md
from meltemi.levanter.config import ConfigError, MixtureConfigError, RunSpec
from meltemi.levanter.evaluation._errors import EvalError
from meltemi.levanter.runtime import display_path


def skipped_line(store: md.TokenStore, cwd: str | None = None) -> str | None:
    """`TokenStore.skipped_summary()` with its paths shown relative to the working directory.

    Example: `data: cache/train skipped 3 inputs (empty_document 3); 120 documents kept;
    details in cache/train/meta.json`. None when the build skipped and altered nothing.
    """
    line = store.skipped_summary()
    if line is None:
        return None
    line = line.replace(str(store.path), display_path(pathlib.Path(store.path), cwd))
    # The example input file too (`e.g. /abs/corpus.jsonl:31: ...`).
    cwd = cwd or os.environ.get("BUILD_WORKING_DIRECTORY") or os.getcwd()
    return line.replace(os.path.join(cwd, ""), "")


def open_store(path: pathlib.Path, source: md.Source, tokenizer: md.Tokenizer) -> md.TokenStore:
    """The store of `source` at `path`: process 0 builds it (or reopens the cached one), the
    other processes wait for it, then every process opens it.

    The skipped-inputs line is printed only by the process that built it.
    """
    built = False
    if jax.process_index() == 0:
        built = not (path / "meta.json").exists()  # else the cached store is reopened
        md.build_store([source], tokenizer, path)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"meltemi store {path}")
    store = md.TokenStore.open(path, tokenizer)
    line = skipped_line(store) if built else None
    if line is not None:  # only when this run built it: a reused store was reported then
        print(line, flush=True)
    return store


def cached_store(
    cache_dir: pathlib.Path,
    source: md.Source,
    tokenizer: md.Tokenizer,
    *,
    where: str,
    error: type[ConfigError] = ConfigError,
) -> md.TokenStore:
    """The store of one source under `cache_dir`, keyed by its name, tokenizer and contents.

    Args:
        cache_dir: `data.cache_dir`.
        source: the source (its `fingerprint()` changes with its files' contents).
        tokenizer: the tokenizer.
        where: the key or flag that named the source (the start of an error message).
        error: the error type a source that cannot be read raises.

    Raises:
        ConfigError: (`error`) the source's files cannot be read, naming `where`.
    """
    try:
        digest = hashlib.sha256(source.fingerprint().encode()).hexdigest()[:12]
    except md.SourceError as e:
        raise error(f"{where}: {e}") from None
    path = pathlib.Path(cache_dir) / f"source-{source.name}-{tokenizer.fingerprint()[:12]}-{digest}"
    return open_store(path, source, tokenizer)


def source_store(
    spec: RunSpec, key: str, source: md.Source, tokenizer: md.Tokenizer
) -> md.TokenStore:
    """A mixture component's store (or its validation set's), cached in `data.cache_dir`."""
    return cached_store(spec.data.cache_dir, source, tokenizer, where=key, error=MixtureConfigError)


def config_stores(spec: RunSpec) -> dict[str, md.TokenStore]:
    """The stores of the config's evaluation sets (what the trainer evaluates, same names):
    each mixture component's `validation` source, then every `data.validation_files` entry."""
    stores = {}
    if spec.data.mixture is not None:
        for c in spec.data.mixture.components:
            if c.validation is not None:
                key = f"data.components.{c.name}.validation"
                stores[c.name] = source_store(spec, key, c.validation, spec.tokenizer)
    for name, source in spec.data.validation:
        where = f"data.validation_files ({name!r})"
        stores[name] = cached_store(spec.data.cache_dir, source, spec.tokenizer, where=where)
    return stores


def file_store(
    name: str, path: str, tokenizer: md.Tokenizer, cache_dir: pathlib.Path
) -> md.TokenStore:
    """A token store of one `--eval_files` entry (built once, cached by content and tokenizer)."""
    source = md.Files(name, (path,))
    where = f"--eval_files: {name}={path!r}"
    store = cached_store(cache_dir, source, tokenizer, where=where, error=EvalError)
    if store.num_tokens == 0:
        raise EvalError(f"--eval_files: {name}={path!r} holds no text to evaluate.")
    return store
