"""meltemi.levanter.envs: environments with verifiable rewards, for reinforcement learning.

An `Environment` is a prompt source, a reward function and an optional next turn; `score`
calls the reward and turns any failure (an exception, a hang, NaN, a crashed subprocess) into
a zero reward with a counted reason, never an exception. Three ship: `ArithmeticEnv`
(exact-match arithmetic a tiny model learns), `MathEnv` (answers checked by `math-verify`) and
`CodeEnv` (unit tests run in a sandboxed subprocess). This package does not import JAX, so a
rollout worker scores in any process.
"""

from meltemi.levanter.envs._arithmetic import ArithmeticEnv
from meltemi.levanter.envs._base import (
    FAILURES,
    SPLITS,
    Environment,
    Prompt,
    PromptSource,
    Score,
    failure_counts,
    score,
    score_many,
    split_indices,
)
from meltemi.levanter.envs._code import (
    CodeEnv,
    SandboxResult,
    extract_code,
    namespace_available,
    run_sandboxed,
)
from meltemi.levanter.envs._math import MathEnv

__all__ = [
    "FAILURES",
    "SPLITS",
    "ArithmeticEnv",
    "CodeEnv",
    "Environment",
    "MathEnv",
    "Prompt",
    "PromptSource",
    "SandboxResult",
    "Score",
    "extract_code",
    "failure_counts",
    "namespace_available",
    "run_sandboxed",
    "score",
    "score_many",
    "split_indices",
]
