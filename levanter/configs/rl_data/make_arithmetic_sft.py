"""Writes the SFT set of rl_arithmetic.py: the answer format on the training split only.

    python levanter/configs/rl_data/make_arithmetic_sft.py

`arithmetic_train.jsonl` holds `{"text": "3+4=7"}` for every problem of the arithmetic
environment's training split (`ArithmeticEnv(max_operand=9, ops="+-")`, 180 problems);
`arithmetic_test.jsonl` the 20 held-out ones (evaluation loss only; RL never trains on them).
The output is deterministic (`tests/test_rl_buffer.py` checks the shipped files are it).
"""

from __future__ import annotations

import json
import pathlib

from meltemi.levanter.envs import ArithmeticEnv

HERE = pathlib.Path(__file__).parent
MAX_OPERAND, OPS = 9, "+-"


def lines(split: str) -> list[str]:
    """One JSON line per problem of `split`: the prompt followed by its answer."""
    env = ArithmeticEnv(max_operand=MAX_OPERAND, ops=OPS)
    out = []
    for i in range(env.size(split)):
        p = env.prompt(split, i)
        out.append(json.dumps({"text": p.text + p.target}))
    return out


def main() -> None:
    for split in ("train", "test"):
        (HERE / f"arithmetic_{split}.jsonl").write_text("\n".join(lines(split)) + "\n")


if __name__ == "__main__":
    main()
