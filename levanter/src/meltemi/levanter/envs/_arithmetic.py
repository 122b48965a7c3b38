"""Exact-match arithmetic: a toy task a tiny model learns on CPU.

Every problem `a op b` with `0 <= a, b <= max_operand` and `op` in `ops` ("+", "-", "*"),
shuffled once by `split_seed`; the last `test_fraction` of them is the held-out split. The
prompt is `"12+7="`, the answer `"19"` (`"3-9="` -> `"-6"`); a response earns 1.0 when its
first line, stripped, is exactly the answer.

With `carries=False` only the problems that need no carry (each column's digits of an addition
sum to at most 9) or borrow (each digit of `a` is at least `b`'s, so `a >= b`) are kept, and
multiplication is refused. Multi-digit problems of that kind are solved column by column from
the same single-digit facts, so a model that learns the columns solves held-out problems too:
the split holds out new numbers, not new facts.

With `retries=k` the environment is multi-turn: after a wrong answer it replies
`"\nno, try again: 12+7="` (at most k times) and the policy answers again; the reward scores
the last answer.

>>> env = ArithmeticEnv(max_operand=9, ops="+")
>>> env.size("train"), env.size("test")
(90, 10)
>>> p = env.prompt("train", 0)
>>> p.text, p.target, env.reward(p, p.target + "\\nmore"), env.reward(p, "x")
('8+2=', '10', 1.0, 0.0)
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

from meltemi.levanter.envs._base import Environment, Prompt, split_indices

__all__ = ["ArithmeticEnv"]

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
#: What the environment says after a wrong answer when it allows retries (then the problem).
RETRY = "\nno, try again: "


def _carry_free(a: int, op: str, b: int) -> bool:
    """No column of `a op b` carries (+) or borrows (-)."""
    while a or b:
        da, db = a % 10, b % 10
        if (op == "+" and da + db > 9) or (op == "-" and da < db):
            return False
        a, b = a // 10, b // 10
    return True


class ArithmeticEnv(Environment):
    """Exact-match arithmetic over small operands, with a held-out split."""

    def __init__(
        self,
        *,
        max_operand: int = 20,
        ops: str = "+-",
        test_fraction: float = 0.1,
        split_seed: int = 0,
        carries: bool = True,
        retries: int = 0,
        name: str = "arithmetic",
    ) -> None:
        if max_operand < 1:
            raise ValueError(f"max_operand={max_operand!r}: must be >= 1, e.g. max_operand=20")
        bad = sorted(set(ops) - set(_OPS)) or ([] if ops else ["(empty)"])
        if bad:
            raise ValueError(
                f"ops={ops!r}: {bad[0]!r} is not one of {''.join(_OPS)}; e.g. ops='+-'"
            )
        if retries < 0:
            raise ValueError(f"retries={retries!r}: must be >= 0 (0: one turn), e.g. retries=1")
        if not carries and "*" in ops:
            raise ValueError(
                f"ops={ops!r} with carries=False: '*' has no carry-free form; use ops='+-'"
            )
        self.name = name
        self.max_operand = max_operand
        self.ops = ops
        self.carries = carries
        self.retries = retries
        self._problems = [
            (a, op, b)
            for op in ops
            for a in range(max_operand + 1)
            for b in range(max_operand + 1)
            if carries or _carry_free(a, op, b)
        ]
        self._splits = split_indices(len(self._problems), test_fraction, split_seed)

    def size(self, split: str) -> int:
        self.check_split(split)
        return len(self._splits[split])

    def prompt(self, split: str, index: int) -> Prompt:
        self.check_split(split, index)
        a, op, b = self._problems[self._splits[split][index]]
        return Prompt(
            id=f"{self.name}/{split}/{index}",
            text=f"{a}{op}{b}=",
            target=str(_OPS[op](a, b)),
            env=self.name,
        )

    def reward(self, prompt: Prompt, response: str) -> float:
        lines = response.split("\n")
        return float(lines[0].strip() == prompt.target)

    def step(self, prompt: Prompt, responses: Sequence[str]) -> str | None:
        """Multi-turn with `retries`: after a wrong answer, `RETRY` and the problem again
        (at most `retries` times); None after a right one."""
        if len(responses) > self.retries or self.reward(prompt, responses[-1]):
            return None
        return RETRY + prompt.text
