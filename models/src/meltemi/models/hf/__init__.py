"""Hugging Face checkpoints: `load`, `save` and cross-architecture `warm_start`.

A checkpoint directory holds `config.json`, `model.safetensors` or sharded
`model-0000k-of-0000n.safetensors` files with `model.safetensors.index.json`, and usually
`generation_config.json` and tokenizer files. `save` also writes `meltemi_config.json` (the full
`ModelConfig`, including fields Hugging Face has no place for, such as the MoE dispatch path),
which `load` prefers when it agrees with `config.json`.

>>> import jax, numpy as np, tempfile
>>> import meltemi.models as mm
>>> from meltemi.models import hf
>>> cfg = mm.get_preset("tiny-gemma")
>>> shapes = jax.eval_shape(lambda k: mm.init(cfg, key=k), jax.random.key(0))
>>> model = jax.tree.map(lambda s: np.ones(s.shape, s.dtype), shapes)  # or mm.init(cfg, key=...)
>>> d = tempfile.mkdtemp()
>>> files = hf.save(model, cfg, d)
>>> loaded, loaded_cfg = hf.load(d)
>>> loaded_cfg == cfg
True
"""

from meltemi.models.hf._checkpoints import (
    CheckpointError,
    LoadReport,
    eos_token_id_of,
    load,
    load_config,
    save,
    state_dict,
    warm_start,
)

__all__ = [
    "CheckpointError",
    "LoadReport",
    "load",
    "load_config",
    "save",
    "warm_start",
    "state_dict",
    "eos_token_id_of",
]
