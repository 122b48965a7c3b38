"""Random models without compiling an initialiser: random numpy tensors under HF names, loaded.

Norm weights and biases are random too, so a misplaced norm or bias cannot hide.
"""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np

import meltemi.models as mm
from meltemi.models.hf import _keys as _hf_keys


def random_state_dict(config: mm.ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for key, shape in _hf_keys.state_dict_shapes(config).items():
        if key.endswith("norm.weight") or key.endswith(
            ("ln_1.weight", "ln_2.weight", "ln_f.weight")
        ):
            base = 0.0 if config.norm_kind == "rms_one_plus" else 1.0
            out[key] = (base + 0.3 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[key] = (0.2 * rng.standard_normal(shape)).astype(np.float32)
    return out


def random_model(config: mm.ModelConfig, seed: int = 0) -> mm.Transformer:
    template = eqx.filter_eval_shape(mm.Transformer.init, config, key=jax.random.key(0))
    model, _, _, missing = _hf_keys.from_state_dict(template, random_state_dict(config, seed))
    assert not missing, missing
    return model


def store_tied_head(directory, changed_row: int | None = None) -> None:
    """Rewrites the tied checkpoint saved in `directory` as one `model.safetensors` that also
    stores `lm_head.weight`: a copy of the embedding, or with row `changed_row` changed."""
    from safetensors.numpy import save_file

    from meltemi.models.hf import _safetensors

    tensors = _safetensors.read_all(directory)
    head = tensors["model.embed_tokens.weight"].copy()
    if changed_row is not None:
        head[changed_row] += 1.0
    tensors["lm_head.weight"] = head
    for f in [*directory.glob("*.safetensors"), directory / "model.safetensors.index.json"]:
        f.unlink(missing_ok=True)
    save_file(tensors, str(directory / "model.safetensors"))


def count_compiles(fn) -> int:
    """How many XLA programs `fn()` compiles (backend compiles, whatever their source)."""
    count = [0]

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            count[0] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        fn()
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    return count[0]
