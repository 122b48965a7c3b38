"""From groups to the fixed-shape arrays of one RL step, and the log-probs of sampled tokens."""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from meltemi.levanter.rl._rollout import Group


@dataclasses.dataclass(frozen=True)
class StepBatch:
    """The arrays of one step: `B = prompts * n` rows of `L` tokens, targets at `t + 1`.

    Attributes:
        tokens: [B, L] prompt then response, padded with 0.
        mask: [B, L - 1] 1.0 where position t predicts a response token the policy sampled
            (trained); 0.0 for an environment's message in a multi-turn episode.
        behaviour: [B, L - 1] the sampling policy's log-prob of that token.
        stale: [B] 1.0 for rows of a corrected (stale) group.
        rewards: [P, n] (0 for the rows of a missing group).
        present: [P] 1.0 for a group that is trained (not dropped).
    """

    tokens: np.ndarray
    mask: np.ndarray
    behaviour: np.ndarray
    stale: np.ndarray
    rewards: np.ndarray
    present: np.ndarray

    def as_dict(self) -> dict[str, np.ndarray]:
        return dataclasses.asdict(self)

    def fingerprint(self) -> np.ndarray:
        """Two uint32 lanes naming the batch's tokens (for `data/batch_hash`)."""
        a = zlib.crc32(self.tokens.tobytes())
        b = zlib.crc32((self.tokens * self.mask.sum(1, keepdims=True).astype(np.int32)).tobytes())
        return np.array([a, b], np.uint32)


def step_batch(
    groups: Sequence[Group], staleness: Sequence[int], *, prompts: int, n: int, length: int
) -> StepBatch:
    """Lays out `groups` (at most `prompts`, each with `n` samples) in `length` tokens a row.

    Rows of missing groups (dropped as too stale) are all padding: they carry no loss.

    Raises:
        ValueError: a prompt plus its response is longer than `length`.
    """
    rows = prompts * n
    tokens = np.zeros((rows, length), np.int32)
    mask = np.zeros((rows, length - 1), np.float32)
    behaviour = np.zeros((rows, length - 1), np.float32)
    stale = np.zeros((rows,), np.float32)
    rewards = np.zeros((prompts, n), np.float32)
    present = np.zeros((prompts,), np.float32)
    for g, (group, lag) in enumerate(zip(groups, staleness, strict=True)):
        if len(group.responses) != n:
            raise ValueError(f"group {group.index} has {len(group.responses)} samples, not {n}")
        present[g] = 1.0
        rewards[g] = group.rewards
        p = len(group.prompt_ids)
        for s, (resp, lps) in enumerate(zip(group.responses, group.logprobs, strict=True)):
            r = g * n + s
            total = p + len(resp)
            if total > length:
                raise ValueError(
                    f"prompt {group.prompt.id!r}: {p} prompt + {len(resp)} response tokens > "
                    f"data.seq_len={length}; raise data.seq_len or lower rl.max_tokens"
                )
            tokens[r, :p] = group.prompt_ids
            tokens[r, p:total] = resp
            mask[r, p - 1 : total - 1] = group.trained[s] if group.trained else 1.0
            behaviour[r, p - 1 : total - 1] = lps
            stale[r] = float(lag > 0)
    return StepBatch(tokens, mask, behaviour, stale, rewards, present)


def sampled_logps(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """[B, L - 1]: log-softmax of `logits[:, t]` at `tokens[:, t + 1]` (float32)."""
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
