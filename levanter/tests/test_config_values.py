"""Every documented config value works: the smoke run with each boolean and enum key flipped.

Each case trains default.py:smoke for 2 steps (one shared token-store cache, no evaluation)
with one key
changed from its value there (plus the keys the change needs to mean something, e.g.
`optimizer.adam_learning_rate` for `optimizer.name=muon`). A guard test lists every
string and boolean key of `base_config()`, so a new enum key cannot be added untested.
"""

import pathlib

import ml_collections
import numpy as np
import pytest

import meltemi.data as md
import meltemi.models as mm
from meltemi.levanter.config import base_config, flatten, load_config, resolve
from meltemi.levanter.config._spec import COMPUTE_DTYPES, SOURCES, VERIFY_MODES
from meltemi.levanter.optim._adamw import ADAMC_MODES
from meltemi.levanter.optim._config import MU_DTYPES, OPTIMIZERS
from meltemi.levanter.optim._muon import MUON_SCALES
from meltemi.levanter.optim._schedules import DECAY_SHAPES
from meltemi.levanter.optim._skip import SKIP_SCHEDULES
from meltemi.levanter.trainer import train

CONFIGS = pathlib.Path(__file__).parent.parent / "configs"
SMOKE = f"{CONFIGS / 'default.py'}:smoke"

# Enum keys and the values they document (W&B's "online" needs the network).
ENUMS = {
    "trainer.compute_dtype": COMPUTE_DTYPES,
    "checkpoint.verify": VERIFY_MODES,
    "logging.wandb_mode": ("offline", "disabled"),
    "data.source": SOURCES,
    "data.packing": md.PACKINGS,
    # "splash" needs a TPU (its error on other platforms is tested in //models).
    "model.attention_backend": ("auto", "xla", "dot_product_attention"),
    "model.family": ("llama", "qwen3", "gpt2", "gemma"),  # the dense families
    "model.activation": mm.ACTIVATIONS,
    "model.remat": mm.REMAT_POLICIES,
    "optimizer.name": OPTIMIZERS,
    "optimizer.lr_schedule": DECAY_SHAPES,
    "optimizer.adamc": ADAMC_MODES,
    "optimizer.mu_dtype": (None, *MU_DTYPES),
    "optimizer.muon_scale": MUON_SCALES,
    "optimizer.skip_step_schedule": SKIP_SCHEDULES,
}
# String keys that are not enums (names, paths, free text).
FREE_TEXT = {
    "name",
    "run_dir",
    "trainer.batch_schedule",
    "checkpoint.init_from",
    "model.preset",
    "model.init_from_hf",
    "data.tokenizer",
    "data.bos_token",
    "data.eos_token",
    "data.cache_dir",
    "logging.wandb_project",
}
# What a value needs besides itself to have an effect.
NEEDS = {
    "model.family=qwen3": {"model.qk_norm": "true"},  # Qwen3 is Llama with QK-norm
    "model.qk_norm=true": {"model.family": "qwen3"},
    "optimizer.name=muon": {"optimizer.adam_learning_rate": "1e-3"},
    "optimizer.muon_scale": {"optimizer.name": "muon", "optimizer.adam_learning_rate": "1e-3"},
    "optimizer.skip_step_schedule": {"optimizer.skip_step_window": "4"},
    "logging.wandb_mode": {"logging.wandb": "true"},
}


def _typed_keys():
    """(key, type) of every string or boolean leaf of base_config(), placeholders included."""
    config = base_config()
    out = {}
    for key in flatten(config):
        *path, leaf = key.split(".")
        node = config
        for p in path:
            node = node[p]
        kind = node.get_type(leaf) if isinstance(node, ml_collections.ConfigDict) else None
        if kind in (str, bool):
            out[key] = kind
    return out


def _cases():
    smoke = load_config(SMOKE).config
    spec = resolve(smoke)
    values = {
        **flatten(smoke),
        **{f"model.{f}": getattr(spec.model, f) for f in ("family", "activation", "remat")},
        **{f"model.{f}": getattr(spec.model, f) for f in ("tie_embeddings", "qk_norm")},
        "model.scan_layers": spec.model.scan_layers,
    }
    cases = []
    typed = _typed_keys()
    for key in sorted(set(typed) | set(ENUMS)):
        kind = typed.get(key)
        if kind is bool:
            cases.append((key, str(not values[key]).lower()))
        elif key in ENUMS:
            cases += [(key, str(v)) for v in ENUMS[key] if v != values[key]]
    return cases


CASES = _cases()


def test_every_string_and_boolean_key_is_an_enum_or_free_text():
    strings = {k for k, kind in _typed_keys().items() if kind is str}
    assert strings - set(ENUMS) - FREE_TEXT == set()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def _files(root):
    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(4):
        (corpus / f"part{i}.txt").write_text(f"def f{i}(x):\n    return x * {i}\n" * 60)
    return repr((str(corpus / "part*.txt"),))


@pytest.mark.parametrize("key, value", CASES, ids=[f"{k}={v}" for k, v in CASES])
def test_smoke_run_with_one_key_flipped(key, value, cache, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    spec = SMOKE
    overrides = {key: value}
    overrides.update(NEEDS.get(f"{key}={value}", NEEDS.get(key, {})))
    if key == "data.source" and value == "files":
        overrides["data.train_files"] = _files(tmp_path)
    if key == "data.source" and value == "mixture":  # components are set in a config file
        spec, overrides = f"{CONFIGS / 'mixture.py'}:smoke", {}
    overrides.update({"run_dir": str(tmp_path / "run"), "data.cache_dir": str(cache)})
    # Keep each run to the one compile its key is about: no evaluation, no MFU matmul.
    overrides.update({"eval.num_batches": "0", "trainer.peak_flops_per_device": "1e12"})
    result = train(load_config(spec, list(overrides.items())))
    assert result.step == 2 and sorted(result.losses) == [1, 2]
    assert np.isfinite(list(result.losses.values())).all()


# The families added for Hugging Face breadth (#13), each trained by the trainer for 2 steps.
NEW_FAMILIES = ("tiny-mistral", "tiny-gemma2", "tiny-gemma3", "tiny-qwen2", "tiny-olmo2")


@pytest.mark.parametrize("preset", NEW_FAMILIES)
def test_the_trainer_trains_each_model_family(preset, cache, tmp_path):
    overrides = {
        "model.preset": preset,
        "run_dir": str(tmp_path / "run"),
        "data.cache_dir": str(cache),
        "eval.num_batches": "0",
        "trainer.peak_flops_per_device": "1e12",
    }
    resolved = load_config(SMOKE, list(overrides.items()))
    assert resolve(resolved.config).model.family == preset.removeprefix("tiny-").replace(
        "gemma3", "gemma3_text"
    )
    result = train(resolved)
    assert result.step == 2 and sorted(result.losses) == [1, 2]
    assert np.isfinite(list(result.losses.values())).all()
