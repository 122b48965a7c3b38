"""`checkpoint.*`: when to save, what to keep, how to verify, where to warm start from."""

from __future__ import annotations

import dataclasses

import ml_collections

from meltemi.levanter.checkpoint import VERIFY_MODES
from meltemi.levanter.config._checks import AtLeast, Flag, Number, OneOf, Text
from meltemi.levanter.config._errors import InertKeyError
from meltemi.levanter.config._keys import key, read


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointSpec:
    """`checkpoint.*`: when to save, what to keep, how to verify, where to warm start from.

    Attributes:
        export_hf: with every checkpoint, also write the parameters as a Hugging Face
            checkpoint in `<run_dir>/hf/step_XXXXXXXX/` (`meltemi.models.hf.save`).
    """

    enabled: bool = key(True, "Save checkpoints (and resume from them).", Flag())
    save_every_steps: int = key(
        100,
        "Rolling temporary checkpoints every N steps (0: off); only the latest temporary one "
        "is kept.",
        AtLeast(0, example=100),
    )
    save_every_minutes: float = key(
        0.0, "Rolling temporary checkpoints every M minutes (0: off).", Number(30.0)
    )
    keep_every_steps: int = key(
        0,
        "Permanent checkpoints every K steps (0: none); the final checkpoint is always kept.",
        AtLeast(0, example=1000),
    )
    async_save: bool = key(True, "Write checkpoints in the background.", Flag())
    verify: str = key(
        "checksums",
        '"sizes" or "checksums": what the completion manifest of each checkpoint records and '
        "checks (checksums: every array's, computed on its devices while saving, checked after "
        'restore; "sha256" is the former name of "checksums").',
        OneOf(VERIFY_MODES, aliases={"sha256": "checksums"}),
    )
    init_from: str = key(
        "", "Warm start: a checkpoint directory whose parameters initialise a fresh run.", Text()
    )
    export_hf: bool = key(
        False,
        "With every checkpoint, also a Hugging Face checkpoint in `<run_dir>/hf/step_XXXXXXXX/` "
        "(config.json + safetensors; transformers loads it). --export_hf=DIR: the final one "
        "only.",
        Flag(),
    )


def checkpoint_spec(c: ml_collections.ConfigDict) -> CheckpointSpec:
    """The checked `checkpoint` section."""
    v = read(CheckpointSpec, c, "checkpoint.")
    if v["export_hf"] and not v["enabled"]:
        raise InertKeyError(
            "checkpoint.export_hf=True has no effect while checkpoint.enabled=False (it exports "
            "with every checkpoint); enable checkpoints, or export the final parameters with "
            "--export_hf=DIR."
        )
    return CheckpointSpec(**v)
