"""From a `RunSpec` to run parts: token stores, model, loss and optimizer."""

from __future__ import annotations

import meltemi.models as mm
from meltemi.levanter import optim
from meltemi.levanter.config import RunSpec, as_spec
from meltemi.levanter.trainer._data import (
    build_mixture,
    build_stores,
    eval_sets,
    fraction_metrics,
    packed,
    padding_line,
    padding_metrics,
)
from meltemi.levanter.trainer._lora import lora_init, lora_loss
from meltemi.levanter.trainer._parts import RunParts
from meltemi.levanter.trainer._plan import batch_fields, build_optimizer, make_loss_fns
from meltemi.levanter.trainer._warm_start import make_warm_start


def build_parts(spec: RunSpec) -> RunParts:
    """Everything a run needs: the stores are built (or reopened from the cache) here.

    Args:
        spec: the checked config (a `ResolvedConfig` or `ConfigDict` is resolved first).
    """
    spec = as_spec(spec)
    optimizer = build_optimizer(spec)  # its errors before any store is built
    data = spec.data
    data_metrics = None
    if data.mixture is not None:
        train, val_stores = build_mixture(spec)
        data_metrics = fraction_metrics(train)
    else:
        train_store, val_stores = build_stores(spec)
        train = packed(spec, train_store)
        if data.packing != "stream":
            print(padding_line("train", train), flush=True)
            data_metrics = padding_metrics(train)
    loss_fn, eval_loss_fn = make_loss_fns(spec.trainer.z_loss)
    mcfg = spec.model
    params = mm.param_count(mcfg)
    return RunParts(
        init_model=lora_init(spec, lambda key: mm.Transformer.init(mcfg, key=key)),
        loss_fn=lora_loss(spec, loss_fn),
        eval_loss_fn=eval_loss_fn,
        optimizer=optimizer,
        metrics_fn=optim.metrics,
        train_data=train,
        seq_len=data.seq_len,
        eval_sets=eval_sets(spec, val_stores),
        describe=f"{spec.preset} ({mcfg.family}, {params / 1e6:.2f}M params)",
        flops_per_token=mm.flops_per_token(mcfg, data.seq_len),
        warm_start=make_warm_start(),
        data_metrics=data_metrics,
        batch_fields=batch_fields(spec),
    )
