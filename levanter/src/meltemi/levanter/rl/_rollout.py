"""Rollout workers: fray actors that sample with the inference engine and score the samples.

A `RolloutWorker` holds one `meltemi.models.engine.Engine`. `generate` takes numbered prompts,
samples `n` responses of each (the samples share the prompt's KV pages), scores them with the
environment's verifier (`meltemi.levanter.envs.score_many`, which never raises) and returns one
`Group` per prompt: the tokens, the engine's log-probability of each sampled token (the policy
that sampled it, at temperature 1) and the rewards, stamped with the weight version that
sampled them. `set_weights` installs new weights in place (`Engine.update_weights`: no
restart, no recompile); with LoRA only the adapters travel and the worker merges them into its
copy of the base weights.

The worker needs no trainer state: everything it is built from is in `WorkerSpec` and the
first weights, so fray can restart it after a crash (the trainer then sends the current
weights before its next call).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import equinox as eqx
import jax
import numpy as np

import meltemi.models as mm
from meltemi.levanter.checkpoint import flatten_state, unflatten_state
from meltemi.levanter.config import make_tokenizer
from meltemi.levanter.envs import Environment, Prompt, score_many
from meltemi.models.engine import Engine, EngineConfig, Request


@dataclasses.dataclass(frozen=True)
class Group:
    """One prompt's `n` samples, as a worker returns them (plain Python values: it pickles).

    Attributes:
        index: the prompt's position in the run's prompt order (the cursor value).
        prompt: the environment's prompt.
        prompt_ids: the prompt's tokens.
        responses: the tokens of each sample after the prompt (a stop token included): its
            sampled tokens, and in a multi-turn episode the environment's messages between
            the turns.
        logprobs: per response token, its log-probability under the sampling weights (0.0
            for an environment's token).
        rewards: the verifier's reward of each sample (0.0 for a failed verification).
        failures: per sample, None or the verifier's failure reason (`envs.FAILURES`).
        version: the weight version that sampled it.
        generate_s: the worker's seconds generating its call's prompts (shared by them).
        score_s: the worker's seconds scoring this group.
    """

    index: int
    prompt: Prompt
    prompt_ids: tuple[int, ...]
    responses: tuple[tuple[int, ...], ...]
    logprobs: tuple[tuple[float, ...], ...]
    rewards: tuple[float, ...]
    failures: tuple[str | None, ...]
    version: int
    generate_s: float = 0.0
    score_s: float = 0.0
    trained: tuple[tuple[int, ...], ...] = ()
    """Per response token, 1 where the policy sampled it (trained) and 0 for an environment's
    message; empty when every token was sampled (one-turn episodes)."""


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What a rollout worker is built from (pickled once per worker start).

    Attributes:
        model: the policy's architecture.
        lora: the trainer's adapters (None: full weights travel).
        engine: the engine's settings.
        tokenizer: `data.tokenizer` ("byte" or a tokenizer.json path).
        env: the environment that scores the samples.
        samples: samples per prompt (`n`).
        max_tokens: tokens per sample at most.
        temperature: sampling temperature.
        seed: the run's seed; a prompt's samples are a function of (seed, index, weights).
        verify_timeout_s: seconds a verifier call may take before it counts as "timeout".
        max_turns: the policy's turns per episode at most; after each turn but the last the
            environment's `step` may answer, and the policy continues after its message.
    """

    model: mm.ModelConfig
    lora: Any
    engine: EngineConfig
    tokenizer: str
    env: Environment
    samples: int
    max_tokens: int
    temperature: float = 1.0
    seed: int = 0
    verify_timeout_s: float = 10.0
    max_turns: int = 1


@dataclasses.dataclass
class _Episode:
    """One sample's turns so far: the tokens after the prompt, their log-probs and flags."""

    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    trained: list[int] = dataclasses.field(default_factory=list)
    texts: list[str] = dataclasses.field(default_factory=list)  # the policy's turns, decoded


def model_template(model: mm.ModelConfig, lora: Any) -> Any:
    """The policy's structure with `ShapeDtypeStruct` leaves (adapters included with LoRA)."""

    def build(key):
        m = mm.Transformer.init(model, key=key)
        return m if lora is None else mm.lora.apply(m, lora, key=key)

    return jax.eval_shape(build, jax.random.key(0))


_ADAPTERS = {"lora_a", "lora_b"}  # `mm.lora.LoraLinear`'s trained arrays


def weight_payload(params: Any, *, adapters_only: bool) -> dict[str, np.ndarray]:
    """The arrays a weight sync sends: every array, or only the LoRA adapters.

    Args:
        params: the policy (a model or its array leaves).
        adapters_only: send `lora_a`/`lora_b` only (the base weights never change).
    """
    flat = flatten_state(params)
    if adapters_only:
        flat = {k: v for k, v in flat.items() if _ADAPTERS & set(k.split("."))}
    return {k: np.asarray(jax.device_get(v)) for k, v in flat.items()}


def payload_bytes(payload: Mapping[str, np.ndarray]) -> int:
    """Bytes of a weight payload's arrays."""
    return int(sum(v.nbytes for v in payload.values()))


class RolloutWorker:
    """A fray actor: the engine, the tokenizer and the environment of one rollout worker.

    Args:
        spec: what to build.
        weights: every array of the policy (`weight_payload(..., adapters_only=False)`).
        version: the weights' version.
    """

    def __init__(self, spec: WorkerSpec, weights: Mapping[str, np.ndarray], version: int):
        self.spec = spec
        self.tokenizer = make_tokenizer(spec.tokenizer)
        bos = self.tokenizer.bos_id  # documents start with it in training, so prompts do too
        self._bos = [] if bos is None else [int(bos)]
        self._template = model_template(spec.model, spec.lora)
        self._model = unflatten_state(self._template, dict(weights))
        self._version = int(version)
        self.engine = Engine(self._serving(), spec.engine)
        self.engine.warmup()

    def _serving(self) -> mm.Transformer:
        model = self._model
        return mm.lora.merge(model) if self.spec.lora is not None else model

    def pid(self) -> int:
        """The worker's process id (tests kill it)."""
        return os.getpid()

    def version(self) -> int:
        """The version of the weights it samples with."""
        return self._version

    def set_weights(self, weights: Mapping[str, np.ndarray], version: int) -> float:
        """Installs new weights (all arrays, or the adapters alone); returns its seconds."""
        start = time.perf_counter()
        leaves = jax.tree_util.tree_flatten_with_path(self._model)[0]
        known = {jax.tree_util.keystr(p, simple=True, separator=".") for p, _ in leaves}
        unknown = sorted(set(weights) - known)
        if unknown:
            raise ValueError(
                f"set_weights: {unknown[:3]} are not arrays of the worker's model; send "
                "weight_payload(...) of the same model"
            )
        self._model = unflatten_state(self._model, dict(weights))
        self.engine.update_weights(self._serving())
        self._version = int(version)
        return time.perf_counter() - start

    def generate(
        self, prompts: Sequence[tuple[int, Prompt]], version: int, *, greedy: bool = False
    ) -> list[Group]:
        """Samples and scores `prompts` (`(index, prompt)` pairs) with weights `version`.

        Raises:
            ValueError: the worker's weights are not `version` (send them first).
        """
        if version != self._version:
            raise ValueError(
                f"generate(version={version}): this worker holds weights version "
                f"{self._version}; call set_weights first"
            )
        spec = self.spec
        n = 1 if greedy else spec.samples
        sampling = mm.SamplingConfig() if greedy else mm.SamplingConfig(spec.temperature)
        start = time.perf_counter()
        starts = {}
        for index, prompt in prompts:
            tokens = self._bos + [int(t) for t in self.tokenizer.encode(prompt.text)]
            starts[index] = (prompt, tokens, [_Episode() for _ in range(n)])
        # Turn 1: n samples of each prompt (sharing its pages); each later turn continues the
        # episodes the environment answered, after its message.
        pending = {(index, s): tokens for index, (_, tokens, _) in starts.items() for s in range(n)}
        for turn in range(spec.max_turns):
            self._sample_turn(starts, pending, sampling, n if turn == 0 else 1, turn)
            if turn + 1 == spec.max_turns:
                break
            pending = self._next_turns(starts)
            if not pending:
                break
        generate_s = (time.perf_counter() - start) / max(len(starts), 1)
        out = []
        for index, (prompt, tokens, episodes) in starts.items():
            texts = [e.texts[-1] for e in episodes]
            t0 = time.perf_counter()
            scores = score_many(spec.env, [prompt] * n, texts, timeout_s=spec.verify_timeout_s)
            multi = any(0 in e.trained for e in episodes)
            out.append(
                Group(
                    index=index,
                    prompt=prompt,
                    prompt_ids=tuple(tokens),
                    responses=tuple(tuple(e.tokens) for e in episodes),
                    logprobs=tuple(tuple(e.logprobs) for e in episodes),
                    rewards=tuple(float(s.reward) for s in scores),
                    failures=tuple(s.failure for s in scores),
                    version=self._version,
                    generate_s=generate_s,
                    score_s=time.perf_counter() - t0,
                    trained=tuple(tuple(e.trained) for e in episodes) if multi else (),
                )
            )
        return out

    def _sample_turn(
        self, starts: dict, pending: dict[tuple[int, int], list[int]], sampling: Any,
        n: int, turn: int,
    ) -> None:  # fmt: skip
        """Samples one turn: `n` samples of each context in `pending` (n > 1 on turn 1 only,
        where the keys are `(index, s)` for s < n and the contexts the prompts)."""
        spec = self.spec
        requests = {}
        for (index, s), context in pending.items():
            if n > 1 and s > 0:
                continue  # turn 1: one request of n samples per prompt
            seed = (spec.seed * 1_000_003 + index) % 2**32
            if turn:  # a later turn of sample s: its own stream
                seed = (seed * 1_000_033 + turn * 1_009 + s) % 2**32
            rid = self.engine.submit(
                Request(context, max_tokens=spec.max_tokens, sampling=sampling, n=n, seed=seed)
            )
            requests[rid] = (index, s)
        new = {rid: [[] for _ in range(n)] for rid in requests}
        while self.engine.has_work:
            for event in self.engine.step():
                new[event.request_id][event.sample].append((int(event.token), event.logprob))
        for rid, (index, s) in requests.items():
            episodes = starts[index][2]
            for k, sampled in enumerate(new[rid]):
                e = episodes[s + k]
                e.tokens += [t for t, _ in sampled]
                e.logprobs += [float(lp) for _, lp in sampled]
                e.trained += [1] * len(sampled)
                e.texts.append(self.tokenizer.decode(np.asarray([t for t, _ in sampled], np.int32)))

    def _next_turns(self, starts: dict) -> dict[tuple[int, int], list[int]]:
        """The environment's messages after the last turn; the contexts that continue.

        An environment whose `step` raises ends that episode (its last turn is scored).
        """
        pending = {}
        for index, (prompt, tokens, episodes) in starts.items():
            for s, e in enumerate(episodes):
                try:
                    message = self.spec.env.step(prompt, list(e.texts))
                except Exception:  # noqa: BLE001 - the environment's code: end the episode
                    message = None
                if message is None:
                    continue
                ids = [int(t) for t in self.tokenizer.encode(message)]
                e.tokens += ids
                e.logprobs += [0.0] * len(ids)
                e.trained += [0] * len(ids)
                pending[(index, s)] = tokens + e.tokens
        return pending


def arrays_of(model: Any) -> Any:
    """The array leaves of a model (`eqx.filter(model, eqx.is_array)`)."""
    return eqx.filter(model, eqx.is_array)
