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
        responses: the sampled tokens of each sample (a stop token included).
        logprobs: per sampled token, its log-probability under the sampling weights.
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
        ids = {}
        for index, prompt in prompts:
            tokens = self._bos + [int(t) for t in self.tokenizer.encode(prompt.text)]
            seed = (spec.seed * 1_000_003 + index) % 2**32
            rid = self.engine.submit(
                Request(tokens, max_tokens=spec.max_tokens, sampling=sampling, n=n, seed=seed)
            )
            ids[rid] = (index, prompt, tokens)
        toks = {rid: [[] for _ in range(n)] for rid in ids}
        lps = {rid: [[] for _ in range(n)] for rid in ids}
        while self.engine.has_work:
            for event in self.engine.step():
                toks[event.request_id][event.sample].append(int(event.token))
                lps[event.request_id][event.sample].append(float(event.logprob))
        generate_s = (time.perf_counter() - start) / max(len(ids), 1)
        out = []
        for rid, (index, prompt, tokens) in ids.items():
            texts = [self.tokenizer.decode(np.asarray(t, np.int32)) for t in toks[rid]]
            t0 = time.perf_counter()
            scores = score_many(spec.env, [prompt] * n, texts, timeout_s=spec.verify_timeout_s)
            out.append(
                Group(
                    index=index,
                    prompt=prompt,
                    prompt_ids=tuple(tokens),
                    responses=tuple(tuple(t) for t in toks[rid]),
                    logprobs=tuple(tuple(lp) for lp in lps[rid]),
                    rewards=tuple(float(s.reward) for s in scores),
                    failures=tuple(s.failure for s in scores),
                    version=self._version,
                    generate_s=generate_s,
                    score_s=time.perf_counter() - t0,
                )
            )
        return out


def arrays_of(model: Any) -> Any:
    """The array leaves of a model (`eqx.filter(model, eqx.is_array)`)."""
    return eqx.filter(model, eqx.is_array)
