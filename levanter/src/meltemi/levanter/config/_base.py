"""The trainer's defaults and key reference, generated from the section classes' key fields."""

from __future__ import annotations

import dataclasses

import ml_collections

from meltemi.levanter.config._keys import base_section, reference_rows
from meltemi.levanter.config._model_spec import model_section, optimizer_section
from meltemi.levanter.config._sections import SECTIONS


def base_config() -> ml_collections.ConfigDict:
    """Returns the trainer's defaults, unlocked, for a config file to start from.

    Every key the trainer reads exists here, so a typo in a config file or on the command line
    is an error rather than a silently ignored field. Config files change values, never add keys.

    Example:
        >>> from meltemi.levanter.config import base_config
        >>> config = base_config()
        >>> config.trainer.num_train_steps, config.mesh.ici.data, config.model.preset
        (1000, -1, 'tiny-llama')
    """
    c = ml_collections.ConfigDict()
    for name, cls in SECTIONS:
        section = base_section(cls) if dataclasses.is_dataclass(cls) else cls()
        if name:
            c[name] = section
        else:
            for key, value in section.items(preserve_field_references=True):
                c[key] = value
    return c


def key_reference() -> str:
    """The key reference of the README (markdown), generated from the section classes.

    The README's copy sits between `<!-- config-keys:begin -->` and `<!-- config-keys:end -->`;
    a test checks that it equals this text.

    Example:
        >>> print(key_reference().splitlines()[2])
        | `name` | `'run'` | The run's name (the run directory is `runs/<name>` by default). |
    """
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for name, cls in SECTIONS:
        if not dataclasses.is_dataclass(cls):
            continue
        for key, default, help in reference_rows(cls, f"{name}." if name else ""):
            cell = help.replace("|", "\\|")  # a | inside a cell would end it
            lines.append(f"| `{key}` | `{default}` | {cell} |")
    model = ", ".join(sorted(k for k in model_section() if k != "lora"))
    lora = ", ".join(sorted(model_section().lora))
    optimizer = ", ".join(sorted(optimizer_section()))
    lines += [
        "",
        f"`model.*` (`meltemi.models.ModelConfig` fields, None: the preset's value): {model}; "
        f"`model.lora.*`: {lora}.",
        "",
        f"`optimizer.*` (`meltemi.levanter.optim.OptimizerConfig` fields): {optimizer}.",
    ]
    return "\n".join(lines) + "\n"


def mixture_component(
    source: str, weight: float, *, validation: str = ""
) -> ml_collections.ConfigDict:
    """One entry of `data.components`, for `data.source = "mixture"`.

    Args:
        source: the training text: `stdlib:train`, `KIND:PATHS` or `KIND:NAME=PATHS` with KIND
            in text, jsonl, parquet (PATHS: comma-separated files, directories or globs), or
            plain paths (the kind follows the extension); `chat:PATHS` for conversations
            (JSONL/Parquet `messages` rows, rendered with the run's chat template).
        weight: the component's share of the rows from step 0 (the weights sum to 1);
            `data.weight_stages` changes it from a later step on.
        validation: evaluation text in the same forms (empty: none); its metrics are tagged
            by the component's name (`eval/<name>/loss`, `eval/<name>/bpb`).

    Example:
        >>> from meltemi.levanter.config import base_config, mixture_component
        >>> config = base_config()
        >>> config.data.source = "mixture"
        >>> config.data.components.code = mixture_component("stdlib:train", 1.0)
        >>> config.data.components.code.weight
        1.0
    """
    return ml_collections.ConfigDict(
        {"source": str(source), "weight": float(weight), "validation": str(validation)}
    )
