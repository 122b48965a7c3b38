"""`data.*`: where the text comes from, how it is tokenized and packed."""

from __future__ import annotations

import dataclasses
import pathlib

import ml_collections

from meltemi import data as md
from meltemi.levanter.config._checks import AnyInt, AtLeast, InSection, OneOf, Paths, Text
from meltemi.levanter.config._errors import ConfigError, InertKeyError
from meltemi.levanter.config._keys import derived, key, read
from meltemi.levanter.config._mixture import MixturePlan, file_source, mixture_plan
from meltemi.levanter.config._paths import default_cache_dir

SOURCES = ("stdlib", "files", "mixture")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataSpec:
    """`data.*`: where the text comes from, how it is tokenized and packed.

    Attributes:
        source: "stdlib", "files" or "mixture".
        train: the training source (None for a mixture: `mixture` has the components).
        validation: evaluation sources by the name their metrics carry.
        mixture: the checked mixture (`data.source == "mixture"`), else None.
        cache_dir: where token stores are cached.
        packing: how documents become rows, one of `meltemi.data.PACKINGS`: "stream"
            (concatenate and cut every `seq_len` tokens; no padding) or "whole_documents"
            (a document shorter than `seq_len` never straddles two rows; pad, loss-masked).
    """

    train: md.Source | None = derived()
    validation: tuple[tuple[str, md.Source], ...] = derived()
    mixture: MixturePlan | None = derived()
    source: str = key(
        "stdlib",
        '"stdlib": the Python standard library shipped with the interpreter (validation: its '
        'held-out modules); "files": data.train_files, and one validation set per entry of '
        'data.validation_files (text, .jsonl[.gz|.zst] with a "text" field, or .parquet); '
        '"mixture": data.components, weighted, with data.weight_stages.',
        OneOf(SOURCES),
    )
    components: ml_collections.ConfigDict = key(
        {},
        'data.source="mixture": name -> mixture_component(source, weight, validation=...), set '
        "in a config file; weights (summing to 1) apply from step 0.",
        InSection(wrong={"code": {"source": "stdlib:train", "weight": 1.0, "validation": ""}}),
        keep=False,
    )
    weight_stages: tuple = key(
        (),
        "((step, {name: weight, ...}), ...): from each step on, these weights (steps increasing).",
        InSection(wrong=((0, {"code": 1.0}),)),
        keep=False,
    )
    train_files: tuple[str, ...] = key(
        (), 'data.source="files": the training files (paths or globs).', Paths()
    )
    validation_files: tuple[str, ...] = key(
        (), "Evaluation files, one evaluation set each, tagged by its file name.", Paths()
    )
    tokenizer: str = key("byte", '"byte", or the path of a tokenizer.json.', Text())
    bos_token: str | None = key(
        None,
        'A tokenizer.json\'s bos token string ("" for none); None: its usual names are tried.',
        Text(optional=True),
        kind=str,
    )
    eos_token: str | None = key(
        None,
        'A tokenizer.json\'s eos token string ("" for none); None: its usual names are tried.',
        Text(optional=True),
        kind=str,
    )
    seq_len: int = key(128, "Tokens per row.", AtLeast(2, example=128))
    cache_dir: pathlib.Path = key(
        "", "Token store cache; empty: ~/.cache/meltemi/data (or $MELTEMI_CACHE/data).", Text()
    )
    shuffle_seed: int = key(0, "Seed of the data order.", AnyInt())
    packing: str = key(
        "stream",
        'How documents become rows (meltemi.data.PACKINGS): "stream" concatenates and cuts '
        'every seq_len tokens; "whole_documents" never splits a document shorter than seq_len '
        "(rows are padded; padding is loss-masked and its share logged as "
        "data/padding_fraction).",
        OneOf(md.PACKINGS),
    )


def _validation_files(files: tuple[str, ...]) -> dict[str, md.Source]:
    """One evaluation source per `data.validation_files` entry, tagged by its file name."""
    validation = {}
    for entry in files:
        name = pathlib.Path(entry).name.split(".")[0].replace("*", "all") or "validation"
        validation[name] = file_source(name, (entry,))
    return validation


def data_spec(config: ml_collections.ConfigDict) -> DataSpec:
    """The checked `data` section (of the whole `config`: a mixture's checks read it)."""
    v = read(DataSpec, config.data, "data.")
    source = v["source"]
    plan = mixture_plan(config)  # None unless a mixture; refuses components without one
    train_files = v["train_files"]
    validation = _validation_files(v["validation_files"])
    train = None
    if source == "stdlib":
        if train_files:
            raise InertKeyError(
                f"data.train_files={train_files!r} has no effect with data.source='stdlib'; "
                "train on them with --config.data.source=files."
            )
        train = md.stdlib_corpus("train")
        validation = {"stdlib": md.stdlib_corpus("validation"), **validation}
    elif source == "files":
        if not train_files:
            raise ConfigError(
                "data.source='files' needs data.train_files: a tuple of paths or globs, e.g. "
                "--config.data.train_files=\"('corpus/*.jsonl',)\"."
            )
        train = file_source("train", train_files)
    else:
        for c_ in plan.components:
            if c_.validation is not None and c_.name in validation:
                raise ConfigError(
                    f"data.validation_files: the evaluation set {c_.name!r} (from its file name)"
                    f" has the name of a component's validation set; rename the file or the "
                    f"component."
                )
    v["cache_dir"] = default_cache_dir(v["cache_dir"])
    return DataSpec(train=train, validation=tuple(validation.items()), mixture=plan, **v)
