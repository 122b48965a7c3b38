"""On-policy distillation: the teacher's weights, and the held-out reverse KL to it.

The student samples (the same rollout workers as RL); the trainer scores the samples with the
teacher and minimises the per-token reverse KL(student || teacher) on them
(`distill_loss`, sampled-token estimator). The held-out measure is the exact per-position KL
over the vocabulary (`full_vocab_reverse_kl`) on the student's samples of held-out prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax

from meltemi.levanter.config import ConfigError, RLSpec, RunSpec
from meltemi.levanter.rl._batch import step_batch
from meltemi.levanter.rl._objectives import full_vocab_reverse_kl
from meltemi.levanter.rl._rollout import Group
from meltemi.levanter.trainer import make_warm_start


def load_teacher(path: str, params: Any) -> Any:
    """The teacher's arrays from checkpoint `path` (a run dir or one checkpoint), shaped as
    `params` (the teacher has the student's architecture).

    Raises:
        ConfigError: the checkpoint lacks some of the student's arrays.
    """
    teacher, report = make_warm_start()(params, path)
    missing = [line for line in report if line.startswith("initialised")]
    if missing:
        raise ConfigError(
            f"rl.teacher={path!r}: the checkpoint is not a model of this architecture "
            f"({missing[0]}); point rl.teacher at a checkpoint of the same model.* settings."
        )
    return teacher


def reverse_kl(
    spec: RunSpec, rl: RLSpec, params: Any, teacher: Any, groups: Sequence[Group], static: Any
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
    """
    n = len(groups[0].responses)
    batch = step_batch(groups, [0] * len(groups), prompts=len(groups), n=n,
                       length=spec.data.seq_len)  # fmt: skip
    return float(_kl(params, teacher, static, batch.tokens, batch.mask))


@eqx.filter_jit
def _kl(params, teacher, static, tokens, mask):
    student = eqx.combine(params, static)(tokens).array[:, :-1]
    teach = eqx.combine(teacher, static)(tokens).array[:, :-1]
    return full_vocab_reverse_kl(student, jax.lax.stop_gradient(teach), mask)[0]
