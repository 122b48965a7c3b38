"""The environment interface, guarded scoring, and a deterministic, resumable prompt order.

An environment is a prompt source (`size`, `prompt` per split and index), a reward function,
and an optional next turn (`step`). `reward` is the environment's own code and may raise, hang,
return NaN or crash a subprocess; `score` is what a rollout worker calls, and it never raises:
each such failure becomes `Score(0.0, failure=reason)`, counted by `failure_counts`.

Nothing here imports JAX, so a worker process scores without it.

>>> class Echo(Environment):
...     name = "echo"
...     def size(self, split): return 3
...     def prompt(self, split, index): return Prompt(f"echo/{index}", str(index), str(index), "e")
...     def reward(self, prompt, response): return float(response == prompt.target)
>>> env = Echo()
>>> score(env, env.prompt("train", 1), "1")
Score(reward=1.0, failure=None)
>>> [p.text for p in PromptSource(env, seed=0).batch(0, 5)]
['2', '0', '1', '2', '0']
"""

from __future__ import annotations

import abc
import concurrent.futures
import dataclasses
import math
import threading
from collections.abc import Sequence

import numpy as np

__all__ = [
    "FAILURES",
    "SPLITS",
    "Environment",
    "Prompt",
    "PromptSource",
    "Score",
    "failure_counts",
    "score",
    "score_many",
    "split_indices",
]

SPLITS = ("train", "test")
"""Every environment has a training split and a held-out one."""

FAILURES = ("raised", "timeout", "nan", "bad_type", "crashed", "memory")
"""Why a reward could not be computed (each scores 0.0):

- "raised": the reward function raised an exception;
- "timeout": it did not return within the time limit (or the code under test ran too long);
- "nan": it returned NaN or an infinity;
- "bad_type": it returned something that is not a number or a `Score`;
- "crashed": the subprocess it ran was killed by a signal;
- "memory": the subprocess ran out of its memory limit.
"""


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One task.

    Attributes:
        id: stable across runs, e.g. "arithmetic/train/17" (logs name prompts by it).
        text: what the model is given.
        target: the reference answer, or the unit tests for code.
        env: the environment's name.
    """

    id: str
    text: str
    target: str
    env: str


@dataclasses.dataclass(frozen=True)
class Score:
    """A reward and, when it could not be computed, why (one of `FAILURES`; reward is 0.0)."""

    reward: float
    failure: str | None = None


class Environment(abc.ABC):
    """A prompt source, a reward function and an optional next turn. Subclass it."""

    name: str

    @abc.abstractmethod
    def size(self, split: str) -> int:
        """The number of prompts in `split` ("train" or "test")."""

    @abc.abstractmethod
    def prompt(self, split: str, index: int) -> Prompt:
        """Prompt `index` (0 <= index < size) of `split`; the same prompt on every call."""

    @abc.abstractmethod
    def reward(self, prompt: Prompt, response: str) -> float | Score:
        """The model's `response` to `prompt` scored; `score` guards it against failures."""

    def step(self, prompt: Prompt, responses: Sequence[str]) -> str | None:
        """Multi-turn: the environment's next message after the model's `responses` so far.

        None ends the episode (the default: one turn); `reward` then scores the last response.
        """
        del prompt, responses
        return None

    def check_split(self, split: str, index: int | None = None) -> None:
        """Raise a `ValueError` naming the fix for an unknown split or an out-of-range index."""
        if split not in SPLITS:
            raise ValueError(f"split={split!r}: unknown; use one of {SPLITS}")
        if index is not None and not 0 <= index < self.size(split):
            raise ValueError(
                f"index={index!r}: {self.name} has {self.size(split)} {split} prompts; "
                f"use 0 <= index < {self.size(split)} (PromptSource wraps a global cursor)"
            )


def split_indices(count: int, test_fraction: float, seed: int) -> dict[str, list[int]]:
    """A fixed shuffle of `range(count)`: the last `test_fraction` of it is held out ("test")."""
    if not 0 < test_fraction < 1:
        raise ValueError(
            f"test_fraction={test_fraction!r}: must be in (0, 1), e.g. test_fraction=0.1"
        )
    order = np.random.default_rng(seed).permutation(count).tolist()
    n_test = max(1, round(count * test_fraction))
    if n_test >= count:
        raise ValueError(
            f"test_fraction={test_fraction!r} of {count} items leaves no training prompt; "
            f"give more items or a smaller test_fraction"
        )
    return {"train": order[: count - n_test], "test": order[count - n_test :]}


def _as_score(value: object) -> Score:
    if isinstance(value, Score):
        if value.failure is not None:
            return Score(0.0, value.failure)
        value = value.reward
    if not isinstance(value, int | float | np.number | np.bool_):  # bool is an int: 0 or 1
        return Score(0.0, "bad_type")
    if not math.isfinite(float(value)):
        return Score(0.0, "nan")
    return Score(float(value))


def score(env: Environment, prompt: Prompt, response: str, *, timeout_s: float = 10.0) -> Score:
    """`env.reward(prompt, response)` as a `Score`; never raises.

    The reward runs in a daemon thread: if it does not return within `timeout_s` it is
    abandoned (a thread cannot be killed; code that may hang for good belongs in a subprocess,
    as `CodeEnv` does) and the score is `Score(0.0, "timeout")`.
    """
    result: list[object] = []

    def run() -> None:
        try:
            result.append(env.reward(prompt, response))
        except BaseException:  # noqa: BLE001 - any verifier failure is a counted zero
            result.append(Score(0.0, "raised"))

    thread = threading.Thread(target=run, name=f"reward-{env.name}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not result:
        return Score(0.0, "timeout")
    return _as_score(result[0])


def score_many(
    env: Environment,
    prompts: Sequence[Prompt],
    responses: Sequence[str],
    *,
    timeout_s: float = 10.0,
    max_workers: int = 1,
) -> list[Score]:
    """`score` of each (prompt, response) pair, in order.

    Args:
        env: the environment.
        prompts: one per response (a prompt repeated for its n samples).
        responses: the model's responses.
        timeout_s: the limit of each `score`.
        max_workers: how many to score at once (threads; worth it when the verifier waits on a
            subprocess, as `CodeEnv` does).
    """
    if len(prompts) != len(responses):
        raise ValueError(
            f"{len(prompts)} prompts but {len(responses)} responses: pass one response per "
            f"prompt (repeat a prompt n times for its n samples)"
        )
    if max_workers < 1:
        raise ValueError(f"max_workers={max_workers!r}: must be >= 1, e.g. max_workers=4")
    pairs = list(zip(prompts, responses))
    if max_workers == 1 or len(pairs) < 2:
        return [score(env, p, r, timeout_s=timeout_s) for p, r in pairs]
    with concurrent.futures.ThreadPoolExecutor(min(max_workers, len(pairs))) as pool:
        return list(pool.map(lambda pr: score(env, *pr, timeout_s=timeout_s), pairs))


def failure_counts(scores: Sequence[Score]) -> dict[str, int]:
    """How many scores failed for each reason in `FAILURES` (zeros included, for logging)."""
    counts = dict.fromkeys(FAILURES, 0)
    for s in scores:
        if s.failure is not None:
            counts[s.failure] = counts.get(s.failure, 0) + 1
    return counts


class PromptSource:
    """An endless, deterministic order over one split: the prompt at a global cursor.

    Epoch `e = index // size` visits the split in the order of a permutation seeded by
    `(seed, e)`, so a resumed run that restores its cursor sees the same prompts in the same
    order, and no prompt repeats within an epoch.
    """

    def __init__(self, env: Environment, split: str = "train", *, seed: int = 0) -> None:
        env.check_split(split)
        if env.size(split) < 1:
            raise ValueError(f"{env.name} has no {split} prompts")
        if seed < 0:
            raise ValueError(f"seed={seed!r}: must be >= 0")
        self.env = env
        self.split = split
        self.seed = seed
        self._order: tuple[int, np.ndarray] | None = None

    def __len__(self) -> int:
        return self.env.size(self.split)

    def index_of(self, index: int) -> int:
        """The split index of the prompt at global cursor `index`."""
        if index < 0:
            raise ValueError(f"index={index!r}: the prompt cursor counts from 0")
        epoch, offset = divmod(index, len(self))
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng([self.seed, epoch]).permutation(len(self)))
        return int(self._order[1][offset])

    def __getitem__(self, index: int) -> Prompt:
        return self.env.prompt(self.split, self.index_of(index))

    def batch(self, start: int, count: int) -> list[Prompt]:
        """Prompts at cursors `start, ..., start + count - 1`."""
        return [self[i] for i in range(start, start + count)]
