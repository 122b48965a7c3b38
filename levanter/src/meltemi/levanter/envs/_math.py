"""Math answers checked with Hugging Face's `math-verify` (symbolic equality, LaTeX aware).

The problems are given (a list, or a JSONL file of `{"question", "answer"}` lines); nothing is
downloaded. A response earns 1.0 when `math_verify.verify(gold, parse(response))` holds, e.g.
"... so the answer is $\\boxed{\\frac{1}{2}}$" against the answer "0.5".

>>> env = MathEnv([("What is 1/2 + 1/4?", "3/4"), ("2^10?", "1024"), ("7*6?", "42")],
...               test_fraction=0.34)
>>> p = env.prompt("test", 0)
>>> env.reward(p, f"The answer is $\\\\boxed{{{p.target}}}$."), env.reward(p, "$\\\\boxed{7}$")
(1.0, 0.0)
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import math_verify

from meltemi.levanter.envs._base import Environment, Prompt, split_indices

__all__ = ["MathEnv"]


class MathEnv(Environment):
    """Math problems with reference answers, graded by `math-verify`."""

    def __init__(
        self,
        problems: Sequence[tuple[str, str]],
        *,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        name: str = "math",
    ) -> None:
        problems = [tuple(p) for p in problems]
        for i, p in enumerate(problems):
            if len(p) != 2 or not all(isinstance(x, str) and x.strip() for x in p):
                raise ValueError(
                    f"problems[{i}]={p!r}: each problem is a (question, answer) pair of "
                    f"non-empty strings"
                )
        self.name = name
        self._problems = problems
        self._splits = split_indices(len(problems), test_fraction, split_seed)

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike, **kwargs: object) -> MathEnv:
        """Problems from a JSONL file, one `{"question": ..., "answer": ...}` per line."""
        problems = []
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                row = json.loads(line)
                if not isinstance(row, dict) or not {"question", "answer"} <= row.keys():
                    raise ValueError(
                        f'{path}:{n}: expected {{"question": ..., "answer": ...}}, got '
                        f"{line.strip()[:80]!r}"
                    )
                problems.append((str(row["question"]), str(row["answer"])))
        return cls(problems, **kwargs)

    def size(self, split: str) -> int:
        self.check_split(split)
        return len(self._splits[split])

    def prompt(self, split: str, index: int) -> Prompt:
        self.check_split(split, index)
        question, answer = self._problems[self._splits[split][index]]
        return Prompt(
            id=f"{self.name}/{split}/{index}", text=question, target=answer, env=self.name
        )

    def reward(self, prompt: Prompt, response: str) -> float:
        # Timeouts off: math-verify's own use SIGALRM, which works only on the main thread;
        # `score` bounds the whole call instead.
        gold = math_verify.parse(f"${prompt.target}$", parsing_timeout=None)
        answer = math_verify.parse(response, parsing_timeout=None)
        return float(math_verify.verify(gold, answer, timeout_seconds=None))
