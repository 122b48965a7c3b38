"""From a `RunSpec` to run parts: token stores, model, loss and optimizer."""

from __future__ import annotations

import meltemi.models as mm
from meltemi.levanter.config import RunSpec, as_spec
from meltemi.levanter.runtime import make_loss_fns, make_preference_loss_fns
from meltemi.levanter.trainer._data import (
    build_mixture,
    build_stores,
    eval_sets,
    fraction_metrics,
    packed,
    packing_line,
    padding_metrics,
)
from meltemi.levanter.trainer._parts import RunParts
from meltemi.levanter.trainer._plan import model_parts
from meltemi.levanter.trainer._warm_start import make_warm_start


def build_parts(spec: RunSpec) -> RunParts:
    """Everything a run needs: the stores are built (or reopened from the cache) here.

    Args:
        spec: the checked config (a `ResolvedConfig` or `ConfigDict` is resolved first).
    """
    spec = as_spec(spec)
    step = model_parts(spec)  # the dry run's step; its optimizer errors before any store
    data = spec.data
    data_metrics = None
    if data.mixture is not None:
        train, val_stores = build_mixture(spec)
        data_metrics = fraction_metrics(train)
    else:
        train_store, val_stores = build_stores(spec)
        train = packed(spec, train_store)
        line = packing_line("train", train)
        if line is not None:
            print(line, flush=True)
            data_metrics = padding_metrics(train)
    t = spec.trainer
    if t.objective == "lm":
        _, eval_loss_fn = make_loss_fns(t.z_loss)
    else:
        _, eval_loss_fn = make_preference_loss_fns(
            t.objective, beta=t.beta, label_smoothing=t.label_smoothing, gamma=t.simpo_gamma
        )
    mcfg = spec.model
    params = mm.param_count(mcfg)
    return RunParts(
        step=step,
        train_data=train,
        seq_len=data.seq_len,
        eval_loss_fn=eval_loss_fn,
        eval_sets=eval_sets(spec, val_stores),
        describe=f"{spec.preset} ({mcfg.family}, {params / 1e6:.2f}M params)",
        flops_per_token=mm.flops_per_token(mcfg, data.seq_len),
        warm_start=make_warm_start(),
        data_metrics=data_metrics,
    )
