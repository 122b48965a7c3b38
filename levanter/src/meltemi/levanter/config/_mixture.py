"""Data mixtures from the config: `data.source = "mixture"`, its components and weight stages.

    config.data.source = "mixture"
    config.data.components.code = mixture_component("stdlib:train", 0.75,
                                                    validation="stdlib:validation")
    config.data.components.tests = mixture_component("text:/path/test_*.py", 0.25)
    config.data.weight_stages = ((200, {"code": 0.5, "tests": 0.5}),)
    config.data.components.chat = mixture_component("chat:sets/tulu/*.jsonl", 0.1)

`mixture_plan` checks all of it and names the key, the value and the fix; `resolve` calls it,
so a bad mixture stops before any store is built. Components are ordered by name, so the rows
of a step depend on the config's values only (not on the order the file listed them in): with
the step's global rows fixed by the batch-size schedule, any batch is a pure function of
(config, seed, step).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from meltemi import data as md
from meltemi.levanter.config._errors import ConfigError

COMPONENT_KEYS = ("source", "weight", "validation")
KINDS = ("stdlib", "text", "jsonl", "parquet", "chat")
# Builds a chat source (`meltemi.data.chat.ChatFiles`) from a name and paths.
ChatSource = Callable[[str, tuple[str, ...]], md.Source]
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_EXAMPLE = (
    "config.data.components.code = mixture_component('stdlib:train', 0.7) (from "
    "meltemi.levanter.config; see levanter/configs/mixture.py)"
)


class MixtureConfigError(ConfigError):
    """`data.components` / `data.weight_stages` that do not describe a mixture."""


@dataclasses.dataclass(frozen=True)
class Component:
    """One mixture component: its training source and optional validation source."""

    name: str
    source: md.Source
    validation: md.Source | None


@dataclasses.dataclass(frozen=True)
class MixturePlan:
    """A checked mixture: components (by name) and weight stages (the first at step 0)."""

    components: tuple[Component, ...]
    stages: tuple[tuple[int, dict[str, float]], ...]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.components]


def file_source(name: str, paths: tuple[str, ...]) -> md.Source:
    """Text, JSON lines or Parquet files (and directories of them), each read by its own name."""
    return md.Files(name, paths)


def _is_chat(spec: Any) -> bool:
    return isinstance(spec, str) and spec.startswith("chat:")


def uses_chat_components(config) -> bool:
    """Whether a mixture config has a chat component (a `chat:PATHS` source or validation)."""
    if config.data.source != "mixture":
        return False
    entries = config.data.components
    return any(
        hasattr(entries[n], "items")
        and (_is_chat(entries[n].get("source")) or _is_chat(entries[n].get("validation")))
        for n in entries.keys()
    )


def parse_component_source(
    key: str, name: str, spec: Any, *, chat: ChatSource | None = None
) -> md.Source:
    """A component's `source` / `validation` text as a `meltemi.data` source.

    `chat:PATHS` (conversations, rendered with the chat template) needs `chat`, which builds
    the chat source from the name and the paths.

    Example:
        >>> parse_component_source("data.components.web.source", "web", "jsonl:a/*.jsonl").paths
        ('a/*.jsonl',)
    """
    if not isinstance(spec, str) or not spec.strip():
        raise MixtureConfigError(
            f"{key}={spec!r}: give the text as 'stdlib:train', 'KIND:PATHS' (KIND text, jsonl, "
            f"parquet or chat) or paths/globs, e.g. --config.{key}=text:corpus/*.txt"
        )
    kind, sep, rest = spec.partition(":")
    if sep and kind == "chat":
        paths = tuple(p for p in rest.split(",") if p)
        if chat is None or not paths:
            raise MixtureConfigError(
                f"{key}={spec!r}: a chat component needs its paths (chat:PATHS, comma-separated"
                f" files, globs or directories of JSONL/Parquet conversations), e.g. "
                f"--config.{key}=chat:sets/tulu/*.jsonl"
            )
        return chat(name, paths)
    if sep and kind in KINDS:
        if kind != "stdlib" and "=" not in rest:
            spec = f"{kind}:{name}={rest}"
        try:
            return md.parse_source(spec)
        except md.SourceError as e:
            raise MixtureConfigError(f"{key}={spec!r}: {e}") from None
    return file_source(name, tuple(p for p in spec.split(",") if p))


def _weight(key: str, value: Any, fix: str) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0:
        raise MixtureConfigError(
            f"{key}={value!r}: a weight is a number >= 0 (a share of the rows); e.g. {fix}"
        )
    return float(value)


def _check_sum(where: str, weights: Mapping[str, float]) -> None:
    total = sum(weights.values())
    if total <= 0:
        raise MixtureConfigError(
            f"{where}: every weight is 0 ({dict(weights)}); give at least one component a "
            f"positive weight, the weights summing to 1."
        )
    if abs(total - 1.0) > 1e-6:
        fixed = ", ".join(f"{n}={w / total:.4g}" for n, w in weights.items())
        given = ", ".join(f"{n}={w:g}" for n, w in weights.items())
        raise MixtureConfigError(
            f"{where} sum to {total:.6g} ({given}); they must sum to 1, e.g. {fixed}."
        )


def _closest(name: str, names: list[str]) -> str:
    best = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    return f" Did you mean {best[0]!r}?" if best else ""


def _components(config, chat: ChatSource | None) -> tuple[list[Component], dict[str, float]]:
    entries = config.data.components
    components, weights = [], {}
    for name in sorted(entries.keys()):
        key = f"data.components.{name}"
        entry = entries[name]
        if not _NAME.match(name):
            raise MixtureConfigError(
                f"{key}: the name {name!r} tags metrics (data/<name>/fraction, eval/<name>/...);"
                f" use letters, digits, '_', '-' or '.', e.g. data.components.web_text"
            )
        if not hasattr(entry, "items"):
            raise MixtureConfigError(
                f"{key}={entry!r}: a component is mixture_component(source, weight, "
                f"validation=...), e.g. {_EXAMPLE.replace('code', name, 1)}"
            )
        for field in entry.keys():
            if field not in COMPONENT_KEYS:
                hint = difflib.get_close_matches(field, COMPONENT_KEYS, n=1, cutoff=0.5)
                suggestion = f" Did you mean `{key}.{hint[0]}`?" if hint else ""
                raise MixtureConfigError(
                    f"`{key}.{field}`: a component has no key {field!r}.{suggestion} "
                    f"Keys: {', '.join(COMPONENT_KEYS)}."
                )
        if "weight" not in entry:
            raise MixtureConfigError(f"{key}.weight is missing; e.g. {_EXAMPLE}")
        weights[name] = _weight(f"{key}.weight", entry["weight"], f"--config.{key}.weight=0.5")
        source = parse_component_source(f"{key}.source", name, entry.get("source", ""), chat=chat)
        val = entry.get("validation", "") or ""
        validation = (
            parse_component_source(f"{key}.validation", f"{name}-validation", val, chat=chat)
            if val
            else None
        )
        components.append(Component(name, source, validation))
    return components, weights


def _stages(config, names: list[str]) -> list[tuple[int, dict[str, float]]]:
    raw = config.data.weight_stages
    example = f"((200, {{{', '.join(f'{n!r}: {1 / len(names):.2g}' for n in names)}}}),)"
    if raw is None:
        return []
    if not isinstance(raw, tuple | list):
        raise MixtureConfigError(
            f"data.weight_stages={raw!r}: a tuple of (step, {{component: weight}}) pairs, e.g. "
            f'--config.data.weight_stages="{example}"'
        )
    stages, previous = [], 0
    for i, item in enumerate(raw):
        key = f"data.weight_stages[{i}]"
        if not (isinstance(item, tuple | list) and len(item) == 2 and hasattr(item[1], "items")):
            raise MixtureConfigError(
                f"{key}={item!r}: each stage is (step, {{component: weight}}), e.g. "
                f"data.weight_stages={example}"
            )
        step, given = item
        if not isinstance(step, int) or isinstance(step, bool) or step <= 0:
            raise MixtureConfigError(
                f"{key}: step {step!r} must be an int > 0 (step 0 uses "
                f"data.components.<name>.weight); e.g. data.weight_stages={example}"
            )
        if step <= previous:
            raise MixtureConfigError(
                f"data.weight_stages: stage steps must increase, but {key} starts at step "
                f"{step} after a stage at step {previous}; list the stages in step order."
            )
        previous = step
        weights = {}
        for name, value in given.items():
            if name not in names:
                raise MixtureConfigError(
                    f"{key} (step {step}): unknown component {name!r}.{_closest(name, names)} "
                    f"Components: {', '.join(names)}."
                )
            weights[name] = _weight(f"{key}[{name!r}]", value, f"({step}, {{{name!r}: 0.5, ...}})")
        weights = {n: weights.get(n, 0.0) for n in names}
        _check_sum(f"{key} (step {step}): the weights", weights)
        stages.append((step, weights))
    return stages


def mixture_plan(config, *, chat: ChatSource | None = None) -> MixturePlan | None:
    """The checked mixture of a config (None unless `data.source == "mixture"`).

    `chat` builds the source of a `chat:PATHS` component (`data_spec` passes one with the
    run's chat template).

    Raises:
        MixtureConfigError: naming the key, the value and the fix (unknown component, a
            negative weight, weights not summing to 1, stage steps not increasing, ...).

    Example:
        >>> from meltemi.levanter.config import base_config, mixture_component
        >>> config = base_config()
        >>> config.data.source = "mixture"
        >>> config.data.components.a = mixture_component("text:x/*.txt", 0.25)
        >>> config.data.components.b = mixture_component("stdlib:train", 0.75)
        >>> config.data.weight_stages = ((10, {"a": 1.0}),)
        >>> mixture_plan(config).stages
        ((0, {'a': 0.25, 'b': 0.75}), (10, {'a': 1.0, 'b': 0.0}))
    """
    data = config.data
    names = sorted(data.components.keys())
    if data.source != "mixture":
        if names or data.weight_stages:
            what = "data.components" if names else "data.weight_stages"
            raise MixtureConfigError(
                f"{what} is set but data.source={data.source!r}, so it would be ignored; "
                f"train on the mixture with --config.data.source=mixture."
            )
        return None
    if not names:
        raise MixtureConfigError(
            f"data.source='mixture' needs data.components; in the config file: {_EXAMPLE}."
        )
    if data.train_files:
        raise MixtureConfigError(
            f"data.train_files={tuple(data.train_files)!r} is not used by data.source="
            f"'mixture' (the components are the training data); move it into a component, "
            f"e.g. data.components.files = mixture_component({data.train_files[0]!r}, 0.5)."
        )
    components, weights = _components(config, chat)
    _check_sum("data.components.*.weight: the weights", weights)
    stages = [(0, weights)] + _stages(config, names)
    return MixturePlan(tuple(components), tuple(stages))
