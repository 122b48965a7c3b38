"""Evaluating a checkpoint: loss and bits per byte per set, and their macro average.

`//levanter:eval` (`meltemi.levanter.main.eval`) loads a run checkpoint or a Hugging Face
directory (`load_model`), cuts the config's evaluation sets and any `--eval_files` into fixed
batches (`eval_sets`) and evaluates them with the trainer's own evaluator
(`SetEvaluator`, which the trainer's in-run evaluation uses too), so a checkpoint's numbers
here equal the ones the run logged at that step. The validation stores are the run's own:
`cached_store` keys them the same way for the trainer and here, so nothing is tokenized twice.

This floor sits below the trainer (`meltemi.levanter.runtime` < `evaluation` < `trainer`):
importing it loads no trainer or multislice module.

Example:
    >>> from meltemi.levanter.evaluation import macro_average
    >>> macro_average({"web": {"loss": 2.0, "bpb": 1.0}, "code": {"loss": 1.0, "bpb": 0.5}})
    {'loss': 1.5, 'bpb': 0.75}
"""

from __future__ import annotations

import pathlib
from typing import Any

from meltemi.levanter.evaluation._bytes import batch_bytes, span_bytes
from meltemi.levanter.evaluation._chat import (
    ChatReply,
    chat_eos_ids,
    chat_replies,
    format_rate,
    prompt_of,
)
from meltemi.levanter.evaluation._errors import EvalError
from meltemi.levanter.evaluation._evaluator import SetEvaluator, eval_line, eval_record
from meltemi.levanter.evaluation._load import (
    LoadedModel,
    eval_mesh,
    find_checkpoint,
    load_model,
    run_config,
)
from meltemi.levanter.evaluation._report import (
    MACRO,
    format_table,
    macro_average,
    report,
    write_report,
)
from meltemi.levanter.evaluation._sets import (
    EvalSet,
    SetShape,
    eval_sets,
    fixed_eval_set,
    parse_eval_files,
    set_shape,
)
from meltemi.levanter.evaluation._stores import (
    cached_store,
    config_stores,
    file_store,
    open_store,
    skipped_line,
    source_store,
)
from meltemi.levanter.runtime import make_loss_fns


def evaluate(loaded: LoadedModel, sets: list) -> dict[str, dict[str, float]]:
    """Loss and bits per byte of `loaded` on `sets`, by the trainer's evaluator."""
    _, eval_loss_fn = make_loss_fns(0.0)  # the eval loss has no z-loss term
    evaluator = SetEvaluator(loaded.mesh, loaded.static, loaded.compute_dtype, eval_loss_fn, sets)
    return evaluator.evaluate_params(loaded.params)


def evaluate_checkpoint(
    checkpoint: str,
    *,
    config: Any = None,
    eval_files: str = "",
    seq_len: int = 0,
    batch_size: int = 0,
    num_batches: int = 0,
    output: str | pathlib.Path | None = None,
) -> tuple[dict[str, Any], pathlib.Path]:
    """Evaluates a checkpoint and writes `eval.json` (default: inside the checkpoint directory).

    Args:
        checkpoint: a run checkpoint (`runs/<name>/checkpoints/step_N`), a run directory (its
            newest complete step) or a Hugging Face directory.
        config: the run's `ResolvedConfig` (default: the run directory's config.json).
        eval_files: `name=PATH,...` extra evaluation files.
        seq_len: tokens per row (0: the config's, see `set_shape`).
        batch_size: rows per batch (0: the config's).
        num_batches: batches per set (0: the config's).
        output: where to write the JSON.

    Returns:
        `(report, path of eval.json)`.

    Raises:
        EvalError: naming the argument and the fix.
    """
    files = parse_eval_files(eval_files)  # argument errors before any loading
    loaded = load_model(checkpoint, config)
    base = set_shape(loaded.spec, loaded.config.max_seq_len)
    shape = SetShape(
        seq_len or base.seq_len, batch_size or base.batch_size, num_batches or base.num_batches
    )
    if shape.seq_len > loaded.config.max_seq_len:
        raise EvalError(
            f"--seq_len={shape.seq_len} exceeds the model's max_seq_len="
            f"{loaded.config.max_seq_len}; pass a shorter --seq_len."
        )
    sets = eval_sets(loaded.spec, loaded.tokenizer, files, shape)
    results = evaluate(loaded, sets)
    data = report(
        results,
        checkpoint=loaded.path,
        kind=loaded.kind,
        step=loaded.step,
        seq_len=shape.seq_len,
        batch_size=shape.batch_size,
        num_batches=shape.num_batches,
    )
    path = pathlib.Path(output) if output else loaded.path / "eval.json"
    return data, write_report(data, path)


__all__ = [
    "MACRO",
    "ChatReply",
    "EvalError",
    "EvalSet",
    "LoadedModel",
    "SetEvaluator",
    "SetShape",
    "batch_bytes",
    "cached_store",
    "chat_eos_ids",
    "chat_replies",
    "config_stores",
    "eval_line",
    "eval_mesh",
    "eval_record",
    "eval_sets",
    "evaluate",
    "evaluate_checkpoint",
    "file_store",
    "find_checkpoint",
    "fixed_eval_set",
    "format_rate",
    "format_table",
    "load_model",
    "macro_average",
    "open_store",
    "parse_eval_files",
    "prompt_of",
    "report",
    "run_config",
    "set_shape",
    "skipped_line",
    "source_store",
    "span_bytes",
    "write_report",
]
