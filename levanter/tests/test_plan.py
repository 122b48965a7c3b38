"""One plan: the dry run and the trainer lay out every config the same way.

For each config file in levanter/configs/ and each of its variants, `dry_run_plan` (what
`--dry_run` compiles) and `Trainer` (what training runs, with its real data) must give the
same shardings and step signature; for the small variants, the same lowered program.
Eight fake CPU devices.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import importlib.util  # noqa: E402
import pathlib  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

from meltemi.levanter.config import load_config, resolve  # noqa: E402
from meltemi.levanter.trainer import Trainer, dry_run_plan, mesh_of  # noqa: E402

CONFIGS = sorted((pathlib.Path(__file__).parent.parent / "configs").glob("*.py"))


def _variants(path):
    spec = importlib.util.spec_from_file_location(f"variants_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [None, *sorted(module.VARIANTS)]


CASES = [(p, v) for p in CONFIGS for v in _variants(p)]
# Recipes whose data lives elsewhere (paths or buckets named in the config): the dry run needs
# none, the trainer reads it, so here every component reads the chat set shipped in the repo.
_SHIPPED_CHAT = f"chat:{pathlib.Path(__file__).parent.parent / 'configs/sft_data/train.jsonl'}"
_LOCAL_DATA = {
    "marin_8b_instruct": lambda resolved: [
        (f"data.components.{name}.source", _SHIPPED_CHAT)
        for name in resolved.config.data.components
    ]
}


def _normalised(signature, vocabs):
    """Shapes with the planned and the trained vocabulary written alike (see dry_run)."""
    return {
        k: (tuple("vocab" if d in vocabs else d for d in shape), dtype, spec)
        for k, (shape, dtype, spec) in signature.items()
    }


@pytest.mark.parametrize("path, variant", CASES, ids=[f"{p.stem}:{v}" for p, v in CASES])
def test_dry_run_and_trainer_build_the_same_plan(path, variant, tmp_path_factory):
    root = tmp_path_factory.mktemp("plan")
    name = f"{path}:{variant}" if variant else str(path)
    overrides = [("run_dir", str(root / "run")), ("data.cache_dir", str(root.parent / "cache"))]
    if path.stem in _LOCAL_DATA and variant is None:
        overrides += _LOCAL_DATA[path.stem](load_config(name, overrides))
    spec = resolve(load_config(name, overrides))
    n = 8  # the most of the 8 devices every batch of the config splits over
    while any(
        (size // spec.trainer.microbatches) % n for _, size in spec.trainer.batch_sizes.segments
    ):
        n //= 2
    dry, notes = dry_run_plan(spec, n)
    trainer = Trainer(spec, mesh=mesh_of(spec, jax.devices()[:n]))
    assert dict(dry.mesh.shape) == dict(trainer.plan.mesh.shape)
    assert dry.batch_sizes == trainer.plan.batch_sizes
    assert dry.compute_dtype == trainer.plan.compute_dtype
    vocabs = {dry.spec.model.vocab_size, spec.model.vocab_size}
    if any("planned with the preset's vocabulary" in n for n in notes):
        assert dry.spec.model.replace(vocab_size=spec.model.vocab_size) == spec.model
    else:
        assert dry.spec.model == spec.model and len(vocabs) == 1
    for size in {s for _, s in spec.trainer.batch_sizes.segments}:
        assert _normalised(dry.signature(size), vocabs) == _normalised(
            trainer.plan.signature(size), vocabs
        )
    if variant == "smoke":  # small enough to lower twice: the same program, text for text
        size = spec.trainer.train_batch_size
        assert dry.lower(size).as_text() == trainer.plan.lower(size).as_text()
    assert not (root / "run").exists()  # planning writes nothing
