"""Every documented config value works: the smoke run with each boolean and enum key flipped.

Each value is flipped from its value in default.py:smoke (plus the keys the change needs to
mean something, e.g. `optimizer.adam_learning_rate` for `optimizer.name=muon`) and trained
for 2 steps (one shared token-store cache, no evaluation). Flips of different keys that
`resolve` accepts together share one run, so a few runs cover all of them; a failing run's
id lists its flips. The Hugging Face breadth families (#13) are trained the same way, one per
run, alongside flips of keys outside `model.*` (a flip of a `model.*` key is made on the
smoke model it was computed from). A guard test lists every string and boolean key of
`base_config()`, so a new enum key cannot be added untested.
"""

import importlib.util
import pathlib

import ml_collections
import numpy as np
import pytest

import meltemi.data as md
import meltemi.models as mm
from meltemi.levanter.config import ConfigError, base_config, flatten, load_config, resolve
from meltemi.levanter.config._data_spec import LOSS_AVERAGES, OVERLONG, TRAIN_ON
from meltemi.levanter.config._spec import COMPUTE_DTYPES, SOURCES, VERIFY_MODES
from meltemi.levanter.config._trainer_spec import OBJECTIVES, REFERENCES
from meltemi.levanter.optim._adamw import ADAMC_MODES
from meltemi.levanter.optim._config import MU_DTYPES, OPTIMIZERS
from meltemi.levanter.optim._muon import MUON_SCALES
from meltemi.levanter.optim._schedules import DECAY_SHAPES
from meltemi.levanter.optim._skip import SKIP_SCHEDULES
from meltemi.levanter.trainer import train

CONFIGS = pathlib.Path(__file__).parent.parent / "configs"
SMOKE = f"{CONFIGS / 'default.py'}:smoke"
CHAT = CONFIGS / "sft_data"

# Enum keys and the values they document (W&B's "online" needs the network).
ENUMS = {
    "trainer.compute_dtype": COMPUTE_DTYPES,
    "trainer.objective": OBJECTIVES,
    "trainer.reference": REFERENCES,
    "checkpoint.verify": VERIFY_MODES,
    "logging.wandb_mode": ("offline", "disabled"),
    "data.source": SOURCES,
    "data.packing": md.PACKINGS,
    "data.train_on": TRAIN_ON,
    "data.overlong": OVERLONG,
    "data.loss_average": LOSS_AVERAGES,
    # "splash" needs a TPU (its error on other platforms is tested in //models).
    "model.attention_backend": ("auto", "xla", "dot_product_attention"),
    "model.family": ("llama", "qwen3", "gpt2", "gemma"),  # the dense families
    "model.activation": mm.ACTIVATIONS,
    "model.remat": mm.REMAT_POLICIES,
    "model.sequence_parallel": mm.SEQUENCE_PARALLEL,
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
    "trainer.reference_from",
    "model.preset",
    "model.init_from_hf",
    "data.tokenizer",
    "data.bos_token",
    "data.eos_token",
    "data.cache_dir",
    "data.chat_template",
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
    # Written by the test into its tmp_path (see _files).
    "data.source=files": {"data.train_files": "<files>"},
}
# The chat keys act on chat data: the shipped chat set (levanter/configs/sft_data).
_CHAT_DATA = {
    "data.source": "chat",
    "data.train_files": repr((str(CHAT / "train.jsonl"),)),
    "data.chat_template": str(CHAT / "template.jinja"),
    "data.seq_len": "128",  # the smoke run's 32 bytes hold no conversation
}
NEEDS.update({"data.source=chat": _CHAT_DATA, "data.train_on": _CHAT_DATA,
              "data.overlong": _CHAT_DATA, "data.loss_average": _CHAT_DATA})  # fmt: skip
# data.source=mixture: components are set in a config file; test_configs.py trains
# mixture.py:smoke for 2 steps (the guard below checks that it is a mixture).
# The preference objectives and the precomputed reference need preference pairs and a
# reference run: tests/test_dpo.py trains each (dpo, ipo, simpo; live and precomputed).
ELSEWHERE = {
    ("data.source", "mixture"),
    ("trainer.objective", "dpo"),
    ("trainer.objective", "ipo"),
    ("trainer.objective", "simpo"),
    ("trainer.reference", "precomputed"),
}
# The families added for Hugging Face breadth (#13), each trained by the trainer for 2 steps.
NEW_FAMILIES = ("tiny-mistral", "tiny-gemma2", "tiny-gemma3", "tiny-qwen2", "tiny-olmo2")
# The keys a Muon run may set; other optimizer flips run under the smoke run's AdamW.
MUON_KEYS = {"optimizer.name", "optimizer.muon_scale", "optimizer.adam_learning_rate"}
# Sections whose keys interact (checkpoint.enabled=false makes the others inert, wandb_mode
# is a mode of logging.wandb): at most one flip of each per run.
ONE_PER_RUN = ("checkpoint.", "data.", "logging.")
# Every run: no evaluation, no MFU matmul (keeps each run to the compile its flips are about).
QUIET = {"eval.num_batches": "0", "trainer.peak_flops_per_device": "1e12"}


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


def _overrides(key, value):
    out = {key: value}
    out.update(NEEDS.get(f"{key}={value}", NEEDS.get(key, {})))
    return out


def _placeholders(overrides):
    return {k: repr(("corpus/part*.txt",)) if v == "<files>" else v for k, v in overrides.items()}


def _fits(row, cases, key, extra):
    """Case `key` (overrides `extra`) can join a run: no key set twice differently, its
    section's keys left to it where they interact, and `resolve` accepts the union."""
    if any(row.get(k, v) != v for k, v in extra.items()):
        return False
    section = key.split(".")[0] + "."
    if section in ONE_PER_RUN and any(k.startswith(section) for k, _ in cases):
        return False
    merged = {**row, **extra}
    if "model.preset" in merged and any(
        k.startswith("model.") and k != "model.preset" for k in merged
    ):
        return False  # model flips were computed against the smoke model
    if merged.get("optimizer.name") == "muon" and any(
        k.startswith("optimizer.") and k not in MUON_KEYS for k in merged
    ):
        return False  # AdamW's own keys (adamc, mu_dtype, ...) are flipped under AdamW
    try:
        resolve(load_config(SMOKE, list(_placeholders({**merged, **QUIET}).items())).config)
    except ConfigError:
        return False
    return True


def _runs():
    """Packs the families, then every flipped case, greedily into as few runs as `_fits` allows.

    A case that fits nowhere gets a run of its own, unchecked: if it is broken, its run
    fails with the trainer's own error.
    """
    runs = [({"model.preset": p}, [("model.preset", p)]) for p in NEW_FAMILIES]
    for key, value in CASES:
        if (key, value) in ELSEWHERE:
            continue
        extra = _overrides(key, value)
        for overrides, cases in runs:
            if _fits(overrides, cases, key, extra):
                overrides.update(extra)
                cases.append((key, value))
                break
        else:
            runs.append((extra, [(key, value)]))
    return runs


RUNS = _runs()


def test_every_string_and_boolean_key_is_an_enum_or_free_text():
    strings = {k for k, kind in _typed_keys().items() if kind is str}
    assert strings - set(ENUMS) - FREE_TEXT == set()


def test_every_flip_is_set_in_a_run_as_flipped():
    in_runs = [case for _, cases in RUNS for case in cases]
    assert sorted(in_runs) == sorted(
        [c for c in CASES if c not in ELSEWHERE] + [("model.preset", p) for p in NEW_FAMILIES]
    )
    for overrides, cases in RUNS:
        for key, value in cases:
            assert overrides[key] == value, (key, value, overrides)


def test_the_mixture_source_is_trained_by_the_mixture_config():
    path = CONFIGS / "mixture.py"
    module_spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    assert "smoke" in module.VARIANTS  # test_configs.py trains every config's :smoke
    assert resolve(load_config(f"{path}:smoke").config).data.source == "mixture"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def _files(root):
    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(4):
        (corpus / f"part{i}.txt").write_text(f"def f{i}(x):\n    return x * {i}\n" * 60)
    return repr((str(corpus / "part*.txt"),))


@pytest.mark.parametrize(
    "overrides, cases", RUNS, ids=[",".join(f"{k}={v}" for k, v in c) for _, c in RUNS]
)
def test_smoke_run_with_keys_flipped(overrides, cases, cache, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    overrides = {k: _files(tmp_path) if v == "<files>" else v for k, v in overrides.items()}
    overrides.update({"run_dir": str(tmp_path / "run"), "data.cache_dir": str(cache), **QUIET})
    resolved = load_config(SMOKE, list(overrides.items()))
    if "model.preset" in overrides:
        family = overrides["model.preset"].removeprefix("tiny-").replace("gemma3", "gemma3_text")
        assert resolve(resolved.config).model.family == family
    result = train(resolved)
    assert result.step == 2 and sorted(result.losses) == [1, 2]
    assert np.isfinite(list(result.losses.values())).all()
