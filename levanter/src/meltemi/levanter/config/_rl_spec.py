"""`rl.*`: reinforcement learning with verifiable rewards and on-policy distillation.

The section exists only in configs of `//levanter:rl` (`rl_section()` adds it to a
`base_config()`); the other keys (`model.*`, `optimizer.*`, `trainer.*`, `checkpoint.*`,
`logging.*`, `data.tokenizer`) keep their meaning.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from meltemi.levanter.config._checks import AtLeast, Flag, Number, OneOf, Text
from meltemi.levanter.config._errors import ConfigError, InertKeyError
from meltemi.levanter.config._keys import base_section, key, read, reference_rows

RL_OBJECTIVES = ("grpo", "rloo", "distill")
RL_BACKENDS = ("local", "inprocess", "ray")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RLSpec:
    """`rl.*`: what the rollout workers sample and how the trainer learns from it."""

    objective: str = key(
        "grpo",
        'The objective: "grpo" (group-relative advantages), "rloo" (leave-one-out baseline) '
        'or "distill" (per-token reverse KL to rl.teacher on the student\'s own samples).',
        OneOf(RL_OBJECTIVES),
    )
    env: str = key(
        "arithmetic",
        'The environment: "arithmetic" (exact match) or "math" (rl.problems, '
        "checked by math-verify).",
        OneOf(("arithmetic", "math")),
    )
    problems: str = key("", 'rl.env="math": a JSONL file of {"question", "answer"} lines.', Text())
    max_operand: int = key(20, "Arithmetic: operands are 0..max_operand.", AtLeast(1, example=20))
    ops: str = key("+-", 'Arithmetic: the operators ("+", "-", "*").', Text())
    carries: bool = key(
        True,
        "Arithmetic: false keeps only problems with no carry or borrow (they generalise "
        "column by column to held-out numbers; ops '+-' only).",
        Flag(),
    )
    prompts_per_step: int = key(8, "Prompts (groups) per training step.", AtLeast(1, example=8))
    samples_per_prompt: int = key(
        4,
        "Samples per prompt (the group size n; they share the prompt's KV pages).",
        AtLeast(1, example=4),
    )
    max_tokens: int = key(8, "Tokens sampled per response at most.", AtLeast(1, example=8))
    max_turns: int = key(
        1,
        "The policy's turns per episode at most: after each turn but the last the "
        "environment may answer (arithmetic: 'no, try again' after a wrong answer) and the "
        "policy continues after its message; only the policy's tokens are trained, and the "
        "reward scores the last turn.",
        AtLeast(1, example=2),
    )
    temperature: float = key(
        1.0,
        "Sampling temperature of the rollouts (1.0: the engine's log-probs are the "
        "sampling policy's).",
        Number(example=1.0),
    )
    scale_by_std: bool = key(True, "GRPO: divide advantages by the group's std + eps.", Flag())
    clip_low: float = key(0.2, "Policy ratio clipped below at 1 - clip_low.", Number(example=0.2))
    clip_high: float = key(0.2, "Policy ratio clipped above at 1 + clip_high.", Number(0.28))
    kl_beta: float = key(
        0.0,
        "Weight of the k3 KL to the initial (reference) policy; 0: no reference model.",
        Number(example=0.01),
    )
    aggregation: str = key(
        "token",
        '"token": one mean over all response tokens; "sequence": mean of per-sequence means.',
        OneOf(("token", "sequence")),
    )
    max_staleness: int = key(
        1,
        "Weight versions a rollout may lag: 0 is used as is, 1..max_staleness importance-"
        "corrected (truncated IS weight), older ones dropped.",
        AtLeast(0, example=1),
    )
    is_cap: float = key(2.0, "Cap of the truncated importance weight.", Number(example=2.0))
    steps_ahead: int = key(
        1,
        "Steps of prompts the workers generate ahead of training (0: synchronous).",
        AtLeast(0, example=1),
    )
    num_workers: int = key(1, "Rollout workers (fray actors).", AtLeast(1, example=2))
    backend: str = key(
        "local",
        '"local": one process per worker (fray.LocalCluster); "inprocess": threads '
        '(tests); "ray": fray\'s Ray backend.',
        OneOf(RL_BACKENDS),
    )
    worker_restarts: int = key(
        3, "Restarts of a lost worker before the run fails.", AtLeast(0, example=3)
    )
    worker_devices: int = key(
        1,
        "Devices per rollout worker (its engine's mesh; planned by --dry_run).",
        AtLeast(1, example=8),
    )
    kv_bytes: int = key(
        8 << 20, "KV pool bytes of each worker's engine.", AtLeast(1, example=64 << 20)
    )
    max_seqs: int = key(32, "Decode slots of each worker's engine.", AtLeast(1, example=32))
    prefix_cache: bool = key(
        False,
        "Each worker's engine keeps the KV pages of earlier turns (EngineConfig.prefix_cache): "
        "a multi-turn episode's next turn reads its context's pages instead of prefilling it "
        "again. Off by default: a cached page was computed in another step's shapes, so samples "
        "then depend in the last bits on what the worker ran before (not bitwise reproducible "
        "across a restart).",
        Flag(),
    )
    verify_timeout_s: float = key(
        10.0,
        "Seconds a verifier may take on one sample; a slower one scores 0 and is counted "
        "as a timeout.",
        Number(example=10.0),
    )
    eval_every_steps: int = key(
        0,
        "Held-out greedy exact-match reward every N steps (0: at start and end).",
        AtLeast(0, example=10),
    )
    eval_prompts: int = key(64, "Held-out prompts per evaluation.", AtLeast(0, example=64))
    teacher: str = key(
        "",
        "rl.objective=distill: the teacher's checkpoint: a Hugging Face directory (any "
        "architecture and size of the student's vocabulary and tokenizer, e.g. a larger run's "
        "--export_hf), or a run directory or checkpoint of the student's model.* settings.",
        Text(),
    )


def rl_section() -> ml_collections.ConfigDict:
    """The `rl` section with its defaults, for an RL config file:
    `config = base_config(); config.rl = rl_section()`."""
    return base_section(RLSpec)


def rl_spec(c: ml_collections.ConfigDict) -> RLSpec:
    """The checked `rl` section of a whole config (`ConfigError` naming the key and the fix)."""
    if "rl" not in c:
        raise ConfigError(
            "the config has no `rl` section; an RL config file adds it: "
            "`config = base_config(); config.rl = rl_section()`."
        )
    v = read(RLSpec, c.rl, "rl.")
    if v["objective"] == "distill" and not v["teacher"]:
        raise ConfigError(
            "rl.objective='distill' needs rl.teacher, the teacher's checkpoint, e.g. "
            "--config.rl.teacher=runs/teacher."
        )
    if v["objective"] != "distill" and v["teacher"]:
        raise InertKeyError(
            f"rl.teacher={v['teacher']!r} has no effect with rl.objective={v['objective']!r}; "
            "set --config.rl.objective=distill or drop rl.teacher."
        )
    if v["env"] == "math" and not v["problems"]:
        raise ConfigError(
            'rl.env=\'math\' needs rl.problems, a JSONL file of {"question", "answer"} '
            "lines, e.g. --config.rl.problems=data/math_train.jsonl."
        )
    if v["env"] == "arithmetic" and not v["carries"] and "*" in v["ops"]:
        raise ConfigError(
            f"rl.carries=False with rl.ops={v['ops']!r}: '*' has no carry-free form; set "
            "--config.rl.ops=+- or --config.rl.carries=True."
        )
    if v["objective"] == "rloo" and v["samples_per_prompt"] < 2:
        raise ConfigError(
            f"rl.samples_per_prompt={v['samples_per_prompt']}: RLOO's baseline is the mean of "
            "the other samples of a prompt; use --config.rl.samples_per_prompt=2 or more."
        )
    if v["max_staleness"] < v["steps_ahead"]:
        raise ConfigError(
            f"rl.max_staleness={v['max_staleness']} < rl.steps_ahead={v['steps_ahead']}: every "
            "rollout generated ahead would be dropped; set "
            f"--config.rl.max_staleness={v['steps_ahead']} or lower rl.steps_ahead."
        )
    return RLSpec(**v)


def rl_key_reference() -> str:
    """The `rl.*` rows of the key reference (markdown)."""
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for k, default, help in reference_rows(RLSpec, "rl."):
        lines.append(f"| `{k}` | `{default}` | {help.replace('|', chr(92) + '|')} |")
    return "\n".join(lines) + "\n"
