"""meltemi.levanter.rl: reinforcement learning with verifiable rewards.

Advantages (GRPO, RLOO), the clipped policy loss with an optional k3 KL penalty, truncated
importance weights for stale rollouts, and on-policy distillation losses: pure JAX on per-token
log-probabilities (`docs/design/levanter.md`, "RL objectives"). The environments that produce
the rewards live in `meltemi.levanter.envs`, which imports without JAX.
"""

from meltemi.levanter.rl._advantages import (
    ADVANTAGE_ESTIMATORS,
    advantages,
    grpo_advantages,
    rloo_advantages,
)
from meltemi.levanter.rl._buffer import STALENESS_KINDS, BufferFullError, RolloutBuffer, Taken
from meltemi.levanter.rl._loop import RLResult, RLTrainer, make_cluster, make_env
from meltemi.levanter.rl._objectives import (
    AGGREGATIONS,
    aggregate,
    distill_loss,
    full_vocab_reverse_kl,
    policy_loss,
    truncated_is_weights,
)
from meltemi.levanter.rl._plan import rl_dry_run
from meltemi.levanter.rl._pool import RolloutError, RolloutPool
from meltemi.levanter.rl._rollout import (
    Group,
    RolloutWorker,
    WorkerSpec,
    payload_bytes,
    weight_payload,
)

__all__ = [
    "STALENESS_KINDS",
    "BufferFullError",
    "Group",
    "RLResult",
    "RLTrainer",
    "RolloutBuffer",
    "RolloutError",
    "RolloutPool",
    "RolloutWorker",
    "Taken",
    "WorkerSpec",
    "make_cluster",
    "make_env",
    "payload_bytes",
    "rl_dry_run",
    "weight_payload",
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "advantages",
    "aggregate",
    "distill_loss",
    "full_vocab_reverse_kl",
    "grpo_advantages",
    "policy_loss",
    "rloo_advantages",
    "truncated_is_weights",
]
