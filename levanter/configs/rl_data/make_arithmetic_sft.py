"""Writes the SFT set of rl_arithmetic.py: carry-free two-digit arithmetic in two formats.

    python levanter/configs/rl_data/make_arithmetic_sft.py

The environment is `ArithmeticEnv(max_operand=99, ops="+", carries=False)` (2,723 training,
302 held-out problems). `arithmetic_train.jsonl` holds every training problem with its answer
in one of two formats, chosen by the problem's index: one in three is canonical,
`{"text": "12+34=46"}`, the others carry a decimal suffix, `{"text": "12+34=46.0"}`. The
environment's exact-match reward accepts only the canonical `46`. The SFT model therefore
learns the sums (which generalise to held-out numbers) and a preference for the wrong format,
which it applies to every prompt alike: this is what the RL stage must undo, from the reward
alone (the reward never shows an answer, only whether the whole first line matched).
`arithmetic_test.jsonl` holds the held-out problems in the canonical format (evaluation loss
only; neither SFT nor RL trains on them). The output is deterministic
(`tests/test_rl_buffer.py` checks the shipped files are it).
"""

from __future__ import annotations

import json
import pathlib

from meltemi.levanter.envs import ArithmeticEnv

HERE = pathlib.Path(__file__).parent
MAX_OPERAND, OPS, CARRIES = 99, "+", False
# One training answer in CANONICAL_EVERY is in the format the reward accepts.
CANONICAL_EVERY = 3


def lines(split: str) -> list[str]:
    """One JSON line per problem of `split`: the prompt followed by its answer."""
    env = ArithmeticEnv(max_operand=MAX_OPERAND, ops=OPS, carries=CARRIES)
    out = []
    for i in range(env.size(split)):
        p = env.prompt(split, i)
        suffix = "" if split == "test" or i % CANONICAL_EVERY == 0 else ".0"
        out.append(json.dumps({"text": p.text + p.target + suffix}))
    return out


def main() -> None:
    for split in ("train", "test"):
        (HERE / f"arithmetic_{split}.jsonl").write_text("\n".join(lines(split)) + "\n")


if __name__ == "__main__":
    main()
