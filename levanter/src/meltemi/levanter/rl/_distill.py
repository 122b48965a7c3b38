"""On-policy distillation: the teacher's weights, and the held-out reverse KL to it.

The student samples (the same rollout workers as RL); the trainer scores the samples with the
teacher and minimises the per-token reverse KL(student || teacher) on them
(`distill_loss`, sampled-token estimator). The held-out measure is the exact per-position KL
over the vocabulary (`full_vocab_reverse_kl`) on the student's samples of held-out prompts.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax

import meltemi.models as mm
from meltemi.levanter.config import ConfigError, RLSpec, RunSpec
from meltemi.levanter.rl._batch import step_batch
from meltemi.levanter.rl._objectives import full_vocab_reverse_kl
from meltemi.levanter.rl._rollout import Group
from meltemi.levanter.trainer import make_warm_start
from meltemi.models import chat as mchat

_PROBE = "Teach: 12+34=46. The quick brown fox; naïve café ☃\n"
"""Text both tokenizers encode when the teacher brings its own (they must agree on it)."""


def load_teacher(spec: RunSpec, path: str, params: Any, static: Any) -> tuple[Any, Any]:
    """The teacher's arrays and static part (`eqx.partition`) from `path`.

    A Hugging Face checkpoint directory (`config.json`: e.g. a larger model's `--export_hf`)
    may be any architecture of the student's vocabulary: its tokenizer, when it has a
    `tokenizer.json`, must encode text as the student's `data.tokenizer` does. A run
    directory or one Meltemi checkpoint holds arrays only: the teacher then has the
    student's architecture (`static`), and its arrays are shaped as `params`.

    Raises:
        ConfigError: a different vocabulary or tokenizer, or a checkpoint that lacks some of
            the student's arrays.
    """
    directory = pathlib.Path(path).expanduser()
    if mchat.is_hf_checkpoint(directory):
        return _hf_teacher(spec, path, directory)
    teacher, report = make_warm_start()(params, path)
    missing = [line for line in report if line.startswith("initialised")]
    if missing:
        raise ConfigError(
            f"rl.teacher={path!r}: the checkpoint is not a model of this architecture "
            f"({missing[0]}); point rl.teacher at a checkpoint of the same model.* settings, "
            "or at a Hugging Face export of the teacher (--export_hf), which may be any size."
        )
    return teacher, static


def _hf_teacher(spec: RunSpec, path: str, directory: pathlib.Path) -> tuple[Any, Any]:
    model, config = mm.hf.load(directory)
    if config.vocab_size != spec.model.vocab_size:
        raise ConfigError(
            f"rl.teacher={path!r}: its vocabulary has {config.vocab_size} tokens, the "
            f"student's {spec.model.vocab_size}; distillation compares the two token by token, "
            "so the teacher must use the student's tokenizer (data.tokenizer)."
        )
    if (directory / "tokenizer.json").is_file():
        theirs = mchat.load_tokenizer(directory).encode(_PROBE).tolist()
        ours = spec.tokenizer.encode(_PROBE).tolist()
        if theirs != ours:
            raise ConfigError(
                f"rl.teacher={path!r}: its tokenizer.json encodes text differently from the "
                f"student's data.tokenizer={spec.data.tokenizer!r} ({_PROBE!r}: {theirs[:8]}... "
                f"vs {ours[:8]}...); distill from a teacher trained with the same tokenizer."
            )
    return eqx.partition(model, eqx.is_array)


def reverse_kl(
    spec: RunSpec,
    rl: RLSpec,
    params: Any,
    teacher: Any,
    groups: Sequence[Group],
    static: Any,
    teacher_static: Any,
) -> float:
    """Mean over response tokens of KL(student || teacher) at each position (exact, full
    vocabulary), on the student's samples `groups`.

    Args:
        spec: the run's config (`data.seq_len`).
        rl: the `rl` section (the samples per prompt).
        params: the student's arrays.
        teacher: the teacher's arrays.
        groups: the student's samples of held-out prompts.
        static: the model's non-array part (`eqx.partition`).
        teacher_static: the teacher's (`load_teacher`).
    """
    n = len(groups[0].responses)
    batch = step_batch(groups, [0] * len(groups), prompts=len(groups), n=n,
                       length=spec.data.seq_len)  # fmt: skip
    return float(_kl(params, teacher, static, teacher_static, batch.tokens, batch.mask))


@eqx.filter_jit
def _kl(params, teacher, static, teacher_static, tokens, mask):
    student = eqx.combine(params, static)(tokens).array[:, :-1]
    teach = eqx.combine(teacher, teacher_static)(tokens).array[:, :-1]
    return full_vocab_reverse_kl(student, jax.lax.stop_gradient(teach), mask)[0]
