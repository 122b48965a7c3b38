"""`data.*`: where the text comes from, how it is tokenized and packed."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import ml_collections

from meltemi import data as md
from meltemi.data import chat as mdc
from meltemi.levanter.config._checks import AnyInt, AtLeast, InSection, OneOf, Paths, Text
from meltemi.levanter.config._errors import ConfigError, InertKeyError
from meltemi.levanter.config._keys import derived, key, read
from meltemi.levanter.config._mixture import (
    MixturePlan,
    file_source,
    mixture_plan,
    uses_chat_components,
)
from meltemi.levanter.config._paths import default_cache_dir

SOURCES = ("stdlib", "files", "chat", "mixture")
TRAIN_ON = ("assistant", "all")
OVERLONG = ("drop", "truncate")
LOSS_AVERAGES = ("token", "conversation")
# The chat keys and their defaults: set to anything else without chat data, they are inert.
_CHAT_KEYS = {"chat_template": "", "train_on": "assistant", "overlong": "drop",
              "loss_average": "token"}  # fmt: skip
_TEMPLATE_EXAMPLE = "levanter/configs/sft_data/template.jinja"


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataSpec:
    """`data.*`: where the text comes from, how it is tokenized and packed.

    Attributes:
        source: "stdlib", "files", "chat" or "mixture".
        train: the training source (None for a mixture: `mixture` has the components).
        validation: evaluation sources by the name their metrics carry.
        mixture: the checked mixture (`data.source == "mixture"`), else None.
        cache_dir: where token stores are cached.
        packing: how documents become rows, one of `meltemi.data.PACKINGS`: "stream"
            (concatenate and cut every `seq_len` tokens; no padding) or "whole_documents"
            (a document shorter than `seq_len` never straddles two rows; pad, loss-masked).
            Chat data is always packed whole conversation by conversation.
        template: the chat template chat rows are rendered with (None without chat data).
        chat_template: the template file that replaced the tokenizer's ("" for none).
        train_on: "assistant" or "all": which tokens of a conversation carry loss.
        overlong: "drop" or "truncate": a conversation longer than `seq_len`.
        loss_average: "token" or "conversation": how the loss of a batch is averaged.
    """

    train: md.Source | None = derived()
    validation: tuple[tuple[str, md.Source], ...] = derived()
    mixture: MixturePlan | None = derived()
    template: mdc.ChatTemplate | None = derived()
    source: str = key(
        "stdlib",
        '"stdlib": the Python standard library shipped with the interpreter (validation: its '
        'held-out modules); "files": data.train_files, and one validation set per entry of '
        'data.validation_files (text, .jsonl[.gz|.zst] with a "text" field, or .parquet); '
        '"chat": conversations, data.train_files and data.validation_files being .jsonl[.gz|'
        '.zst] or .parquet rows with "messages" [{"role", "content"}, ...], rendered with the '
        'chat template; "mixture": data.components, weighted, with data.weight_stages '
        "(a component's source may be chat:PATHS).",
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
        "data/padding_fraction). Text only: chat data is always packed whole.",
        OneOf(md.PACKINGS),
    )
    chat_template: str = key(
        "",
        "Chat data: a Jinja chat template file used instead of the tokenizer's own "
        "(tokenizer_config.json's chat_template or chat_template.jinja beside the "
        'tokenizer.json); needed with data.tokenizer="byte". Empty: the tokenizer\'s.',
        Text(),
    )
    train_on: str = key(
        "assistant",
        "Chat data: \"assistant\" trains on the assistant's tokens only (the template's "
        '{% generation %} spans, else the rendered assistant messages); "all" on every token.',
        OneOf(TRAIN_ON),
    )
    overlong: str = key(
        "drop",
        'Chat data: a conversation longer than data.seq_len is dropped ("drop") or cut at its '
        'last assistant turn end that fits ("truncate"), never mid-turn; the counts are '
        "printed at start-up.",
        OneOf(OVERLONG),
    )
    loss_average: str = key(
        "token",
        'Chat data: "token" averages the loss over the batch\'s trained tokens; '
        '"conversation" takes the mean of per-conversation means (a long answer weighs as '
        "much as a short one).",
        OneOf(LOSS_AVERAGES),
    )


def _validation_files(files: tuple[str, ...], make=file_source) -> dict[str, md.Source]:
    """One evaluation source per `data.validation_files` entry, tagged by its file name."""
    validation = {}
    for entry in files:
        name = pathlib.Path(entry).name.split(".")[0].replace("*", "all") or "validation"
        validation[name] = make(name, (entry,))
    return validation


def _user_path(text: str) -> pathlib.Path:
    """A path the user typed: relative to the directory the command started from."""
    path = pathlib.Path(text).expanduser()
    if not path.is_absolute():
        path = pathlib.Path(os.environ.get("BUILD_WORKING_DIRECTORY") or os.getcwd()) / path
    return path


def special_token_ids(tokenizer_key: str, tokenizer: md.Tokenizer) -> set[int]:
    """The ids of a tokenizer's special tokens (bos/eos/pad of the byte tokenizer; the
    `"special": true` added tokens of a tokenizer.json)."""
    if isinstance(tokenizer, md.ByteTokenizer):
        return {tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id}
    path = _user_path(tokenizer_key)
    path = path / "tokenizer.json" if path.is_dir() else path
    added = json.loads(path.read_text(encoding="utf-8")).get("added_tokens", [])
    return {int(t["id"]) for t in added if t.get("special")}


def load_chat_template(tokenizer: str, template_file: str) -> mdc.ChatTemplate:
    """The chat template of `data.tokenizer`, or the file `data.chat_template`.

    Raises:
        ConfigError: the byte tokenizer without a template file, a tokenizer without a chat
            template and no file, or a file that is not a usable template (naming
            `data.chat_template`).
    """
    file = _user_path(template_file) if template_file else None
    if file is not None and not file.is_file():
        raise ConfigError(
            f"data.chat_template={template_file!r}: no such file; give the path of a Jinja "
            f"chat template, e.g. --config.data.chat_template={_TEMPLATE_EXAMPLE}"
        )
    try:
        if tokenizer == "byte":
            if file is None:
                raise ConfigError(
                    "data.tokenizer='byte' has no chat template, and chat data is rendered "
                    "through one; set data.chat_template to a Jinja template file, e.g. "
                    f"--config.data.chat_template={_TEMPLATE_EXAMPLE}"
                )
            byte = md.ByteTokenizer()
            specials = {"bos_token": byte.bos_token, "eos_token": byte.eos_token}
            return mdc.ChatTemplate(file.read_text(encoding="utf-8"), name=file.name,
                                    special_tokens=specials)  # fmt: skip
        directory = _user_path(tokenizer)
        directory = directory if directory.is_dir() else directory.parent
        return mdc.ChatTemplate.from_pretrained(directory, template_file=file)
    except mdc.ChatTemplateError as e:
        what = f"data.chat_template={template_file!r}" if file else f"data.tokenizer={tokenizer!r}"
        message = str(e).rstrip(".")
        if "data.chat_template" not in message:
            message += (
                f"; set data.chat_template to a Jinja template file, e.g. "
                f"--config.data.chat_template={_TEMPLATE_EXAMPLE}"
            )
        raise ConfigError(f"{what}: {message}") from None


def _check_inert_chat_keys(v: dict[str, Any], source: str) -> None:
    for name, default in _CHAT_KEYS.items():
        if v[name] != default:
            raise InertKeyError(
                f"data.{name}={v[name]!r} has no effect with data.source={source!r} and no "
                f"chat component (it sets how conversations are trained); train on chat data "
                f"with --config.data.source=chat, or drop data.{name}."
            )


def data_spec(config: ml_collections.ConfigDict) -> DataSpec:
    """The checked `data` section (of the whole `config`: a mixture's checks read it)."""
    v = read(DataSpec, config.data, "data.")
    source = v["source"]
    template = None
    if source == "chat" or uses_chat_components(config):
        template = load_chat_template(v["tokenizer"], v["chat_template"])
    else:
        _check_inert_chat_keys(v, source)
    if source == "chat" and v["packing"] != "stream":
        raise InertKeyError(
            f"data.packing={v['packing']!r} has no effect with data.source='chat': "
            "conversations are always packed whole into rows (first-fit decreasing; those "
            "longer than data.seq_len follow data.overlong). Drop data.packing."
        )

    objective = config.trainer.objective
    if objective != "lm" and source not in ("chat", "mixture"):
        raise ConfigError(
            f"trainer.objective={objective!r} trains on preference pairs, read as chat data; "
            f"set --config.data.source=chat with data.train_files of "
            f'{{"prompt", "chosen", "rejected"}} rows (data.source={source!r} has none).'
        )

    def chat(name: str, paths: tuple[str, ...]) -> md.Source:
        if objective != "lm":  # a preference objective: the rows are chosen/rejected pairs
            return mdc.PreferenceFiles(name, paths, template=template)
        return mdc.ChatFiles(name, paths, template=template, train_on=v["train_on"])

    # None unless a mixture; refuses components without one
    plan = mixture_plan(config, chat=chat if template is not None else None)
    train_files = v["train_files"]
    validation = _validation_files(v["validation_files"], chat if source == "chat" else file_source)
    train = None
    if source == "stdlib":
        if train_files:
            raise InertKeyError(
                f"data.train_files={train_files!r} has no effect with data.source='stdlib'; "
                "train on them with --config.data.source=files."
            )
        train = md.stdlib_corpus("train")
        validation = {"stdlib": md.stdlib_corpus("validation"), **validation}
    elif source in ("files", "chat"):
        if not train_files:
            example = "chat/*.jsonl" if source == "chat" else "corpus/*.jsonl"
            raise ConfigError(
                f"data.source={source!r} needs data.train_files: a tuple of paths or globs, "
                f"e.g. --config.data.train_files=\"('{example}',)\"."
            )
        train = (chat if source == "chat" else file_source)("train", train_files)
    else:
        for c_ in plan.components:
            if c_.validation is not None and c_.name in validation:
                raise ConfigError(
                    f"data.validation_files: the evaluation set {c_.name!r} (from its file name)"
                    f" has the name of a component's validation set; rename the file or the "
                    f"component."
                )
    v["cache_dir"] = default_cache_dir(v["cache_dir"])
    return DataSpec(
        train=train, validation=tuple(validation.items()), mixture=plan, template=template, **v
    )
