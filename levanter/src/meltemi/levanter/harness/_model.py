"""`MeltemiLM`: a `meltemi.models` checkpoint as an lm-evaluation-harness model (`meltemi`).

It follows lm-eval's own `hf` model request by request: the same context/continuation
encoding (`TemplateLM`), the same left truncation to `max_length`, the same rolling windows,
requests sorted longest first and scored in batches; log-probabilities come from one jitted
forward pass per batch (padded to a few bucketed widths), continuations from
`meltemi.models.generate`.
"""

from __future__ import annotations

import json
import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs

import meltemi.models as mm
from meltemi.levanter.evaluation import EvalError, LoadedModel, load_model
from meltemi.levanter.harness._tokens import HarnessTokenizer, tokenizer_json_of
from meltemi.levanter.mesh import data_parallel_size
from meltemi.levanter.runtime import cast_floating, compute_context, global_batch

_MIN_WIDTH = 16


def _width(n: int, limit: int) -> int:
    """`n` rounded up to a power of two (at least 16, at most `limit`): few compiled shapes."""
    return min(max(_MIN_WIDTH, 1 << max(n - 1, 0).bit_length()), max(limit, n))


def _positive_int(name: str, value: Any) -> int:
    try:
        out = int(value)
    except (TypeError, ValueError):
        out = 0
    if out < 1:
        raise EvalError(f"--model_args {name}={value!r}: must be an int >= 1, e.g. {name}=8.")
    return out


@register_model("meltemi")
class MeltemiLM(TemplateLM):
    """A run checkpoint or Hugging Face directory, evaluated by lm-eval.

    `lm_eval --model meltemi --model_args checkpoint=DIR[,batch_size=8,max_length=2048,
    max_gen_toks=256,seed=0]` (run through `python -m meltemi.levanter.harness`, which
    registers the model), or `MeltemiLM(loaded=...)` for a model already in memory (the
    trainer's harness evaluation).

    Args:
        checkpoint: a run checkpoint, run directory or Hugging Face directory.
        batch_size: requests per forward pass ("auto" is taken as 8).
        max_length: the longest sequence scored (default: the model's `max_seq_len`);
            longer inputs keep their last tokens, as in lm-eval's `hf` model.
        max_gen_toks: default continuation length of `generate_until`.
        seed: the sampling key of `generate_until` with `do_sample`.
        loaded: a model already loaded (instead of `checkpoint`).
        **kwargs: lm-eval's generic arguments (`device`, `max_batch_size`, ...), unused.
    """

    def __init__(
        self,
        checkpoint: str | None = None,
        batch_size: int | str = 8,
        max_length: int | None = None,
        max_gen_toks: int = 256,
        seed: int = 0,
        loaded: LoadedModel | None = None,
        **kwargs: Any,
    ):
        super().__init__()
        del kwargs
        if loaded is None:
            if not checkpoint:
                raise EvalError(
                    "the meltemi model needs a checkpoint: --model_args checkpoint=DIR (a run "
                    "checkpoint or a Hugging Face directory)."
                )
            loaded = load_model(str(checkpoint))
        self.loaded = loaded
        self._batch_size = (
            8 if str(batch_size).startswith("auto") else _positive_int("batch_size", batch_size)
        )
        self._max_length = _positive_int("max_length", max_length or loaded.config.max_seq_len)
        self.max_gen_toks = _positive_int("max_gen_toks", max_gen_toks)
        self.seed = int(seed)
        path = tokenizer_json_of(loaded.path, loaded.kind, loaded.spec)
        self.tok = HarnessTokenizer(loaded.tokenizer, path)
        if self.tok.eos_id is None and self.tok.bos_id is None:
            raise EvalError(
                f"{loaded.path}: the tokenizer has neither an eos nor a bos token; lm-eval "
                f"needs one to condition on an empty context (set it in tokenizer_config.json)."
            )
        self._model = None
        self._score = None

    def set_params(self, loaded: LoadedModel) -> None:
        """Scores new parameters of the same model (the trainer, between harness runs)."""
        self.loaded = loaded
        self._model = None

    # -- what lm-eval asks ----------------------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self.tok.eos_id if self.tok.eos_id is not None else self.tok.bos_id

    @property
    def prefix_token_id(self) -> int:
        return self.tok.bos_id if self.tok.bos_id is not None else self.tok.eos_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def tokenizer_name(self) -> str:
        return str(self.loaded.path).replace("/", "__")

    def tok_encode(
        self,
        string: str,
        add_special_tokens: bool | None = None,
        left_truncate_len: int | None = None,
        **kwargs: Any,
    ) -> list[int]:
        """As lm-eval's `hf` model: the tokenizer's own special tokens unless the text already
        starts with bos (or `add_special_tokens` says otherwise)."""
        add = True if add_special_tokens is None else add_special_tokens
        if add_special_tokens is None and self.tok.bos_id is not None:
            bos = self.tok.decode([self.tok.bos_id], skip_special_tokens=False)
            if bos and string.startswith(bos):
                add = False
        ids = self.tok.encode(string, add_special_tokens=add)
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def tok_decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return self.tok.decode(tokens, skip_special_tokens=skip_special_tokens)

    # -- scoring --------------------------------------------------------------------------------

    @property
    def model(self) -> mm.Transformer:
        """The model in its compute dtype (cast once)."""
        if self._model is None:
            lm = self.loaded
            with compute_context(lm.mesh):
                params = jax.jit(lambda p: cast_floating(p, lm.compute_dtype))(lm.params)
            self._model = eqx.combine(params, lm.static)
        return self._model

    def _score_batch(self, tokens: np.ndarray, targets: np.ndarray):
        """(log p(target), target is the argmax) at every position of a padded batch."""
        if self._score is None:

            def score(model, batch):
                logits = model(batch["tokens"])
                logits = logits.rearrange(("batch", "position", "vocab")).array
                logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
                gold = jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1)[..., 0]
                return gold, jnp.argmax(logits, axis=-1) == batch["targets"]

            self._score = eqx.filter_jit(score)
        mesh = self.loaded.mesh
        with compute_context(mesh):
            batch = global_batch({"tokens": tokens, "targets": targets}, mesh)
            gold, greedy = self._score(self.model, batch)
        return np.asarray(gold), np.asarray(greedy)

    def _loglikelihood_tokens(
        self,
        requests: list[tuple[Any, list[int], list[int]]],
        disable_tqdm: bool = False,
        override_bs: int | None = None,
    ) -> list[tuple[float, bool]]:
        """(sum of log p(continuation), continuation is greedy) per `(key, context, cont)`."""
        rows = []
        for _, context, continuation in requests:
            whole = (list(context) + list(continuation))[-(self.max_length + 1) :]
            rows.append((whole[:-1], whole[1:], len(continuation)))
        # Longest first (as lm-eval's Collator): the first batch shows a memory problem early.
        order = sorted(range(len(rows)), key=lambda i: (-len(rows[i][0]), tuple(rows[i][0])))
        size = override_bs or self.batch_size
        size = math.ceil(size / data_parallel_size(self.loaded.mesh)) * data_parallel_size(
            self.loaded.mesh
        )
        out: list[tuple[float, bool] | None] = [None] * len(rows)
        for start in range(0, len(order), size):
            chunk = order[start : start + size]
            width = _width(max(len(rows[i][0]) for i in chunk), self.max_length)
            tokens = np.full((size, width), self.prefix_token_id, np.int32)
            targets = np.zeros((size, width), np.int32)
            for r, i in enumerate(chunk):
                inp, tgt, _ = rows[i]
                tokens[r, : len(inp)] = inp
                targets[r, : len(tgt)] = tgt
            gold, greedy = self._score_batch(tokens, targets)
            for r, i in enumerate(chunk):
                n, c = len(rows[i][0]), rows[i][2]
                answer = (float(gold[r, n - c : n].sum()), bool(greedy[r, n - c : n].all()))
                out[i] = answer
                key = requests[i][0]
                if key is not None:
                    self.cache_hook.add_partial("loglikelihood", key, answer)
        return out  # type: ignore[return-value]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of whole texts, in disjoint `max_length` windows (as `hf` does)."""
        windows, counts = [], []
        for (string,) in (req.args for req in requests):
            parts = [
                lm_utils.make_disjoint_window(w)
                for w in lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(string),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                )
            ]
            windows.extend((None, ctx, cont) for ctx, cont in parts)
            counts.append(len(parts))
        scores = self._loglikelihood_tokens(windows) if windows else []
        out, at = [], 0
        for req, n in zip(requests, counts, strict=True):
            total = sum(s for s, _ in scores[at : at + n])
            at += n
            out.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", (req.args[0],), total)
        return out

    # -- generation -----------------------------------------------------------------------------

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Continuations by `meltemi.models.generate` (compiled, bucketed), cut at the first
        stop sequence; requests with equal generation arguments are batched longest first."""
        out: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(i)
        eos = self.tok_decode([self.eot_token_id], skip_special_tokens=False)
        for indices in groups.values():
            kwargs = normalize_gen_kwargs(dict(requests[indices[0]].args[1]), self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            max_new = int(kwargs.pop("max_gen_toks"))
            if max_new >= self.max_length:
                raise EvalError(
                    f"generate_until: max_gen_toks={max_new} leaves no room for a prompt in "
                    f"max_length={self.max_length}; lower max_gen_toks."
                )
            sampling = mm.SamplingConfig()
            if kwargs.get("do_sample") and float(kwargs.get("temperature", 0.0)) > 0:
                sampling = mm.SamplingConfig(
                    temperature=float(kwargs["temperature"]),
                    top_k=kwargs.get("top_k"),
                    top_p=kwargs.get("top_p"),
                )
            limit = self.max_length - max_new
            prompts = {
                i: self.tok_encode(requests[i].args[0], left_truncate_len=limit)
                or [self.prefix_token_id]
                for i in indices
            }
            order = sorted(indices, key=lambda i: -len(prompts[i]))
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                with compute_context(self.loaded.mesh):
                    tokens = mm.generate(
                        self.model,
                        [prompts[i] for i in chunk],
                        max_new_tokens=max_new,
                        sampling=sampling,
                        eos_token_id=self.eot_token_id,
                        key=jax.random.key(self.seed),
                    )
                for i, continuation in zip(chunk, tokens, strict=True):
                    text = self.tok_decode(continuation)
                    for stop in until:
                        if stop:
                            text = text.split(stop)[0]
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return out  # type: ignore[return-value]
