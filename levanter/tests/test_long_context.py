"""The `sequence` mesh axis in the trainer: `levanter/configs/long_context.py:smoke` (a tiny
Llama, 256-token rows of packed documents, YaRN) on 8 fake CPU devices.

Split over `sequence` (ring with FSDP, all-gather alone), a run gives the unsplit run's
losses and the same `data/batch_hash`; the compiled step exchanges keys over the split; a
split run killed and resumed equals the run straight through bit for bit; bad splits are
one `error:` line before any work.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import pathlib  # noqa: E402
import subprocess  # noqa: E402

import _subprocess  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from _one_error import one_error_line  # noqa: E402

import meltemi.haliax as hax  # noqa: E402
import meltemi.models as mm  # noqa: E402
from meltemi.levanter.config import ConfigError, as_spec, load_config  # noqa: E402
from meltemi.levanter.mesh import COMPUTE_RULES, PARAMETER_RULES, make_mesh  # noqa: E402
from meltemi.levanter.tracking import read_metrics  # noqa: E402
from meltemi.levanter.trainer import Trainer, build_parts, plan  # noqa: E402

CONFIG = pathlib.Path(__file__).parent.parent / "configs" / "long_context.py"
STEPS = 4
SPLITS = {  # name -> (mesh.ici, model.sequence_parallel)
    "ring_fsdp2_x_sequence4": ({"data": 1, "fsdp": 2, "sequence": 4}, "ring"),
    "all_gather_sequence8": ({"data": 1, "sequence": 8}, "all_gather"),
}


def _config(root, name, **overrides):
    pairs = [
        ("run_dir", str(root / name)),
        ("data.cache_dir", str(root / "cache")),
        ("trainer.num_train_steps", str(STEPS)),
        ("eval.num_batches", "0"),
        *((k, str(v)) for k, v in overrides.items()),
    ]
    return load_config(f"{CONFIG}:smoke", pairs)


def _hashes(run_dir):
    records = read_metrics(pathlib.Path(run_dir) / "metrics.jsonl")
    return {r["step"]: r["data/batch_hash"] for r in records if "data/batch_hash" in r}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("long_context")


@pytest.fixture(scope="module")
def reference(root):
    """The unsplit run: one device."""
    resolved = _config(root, "reference", **{"checkpoint.enabled": "false"})
    one = make_mesh({"data": 1}, devices=jax.devices()[:1])
    trainer = Trainer(resolved, build_parts(resolved), one)
    return trainer.run(), trainer


@pytest.fixture(scope="module")
def straight(root, reference):
    """The ring split with FSDP, straight through (checkpoints every step)."""
    ici, strategy = SPLITS["ring_fsdp2_x_sequence4"]
    resolved = _config(root, "straight", **{"model.sequence_parallel": strategy})
    trainer = Trainer(resolved, build_parts(resolved), make_mesh(ici))
    return trainer.run(), trainer


@pytest.mark.parametrize("name", sorted(SPLITS))
def test_split_gives_the_unsplit_losses_and_batch_hashes(root, reference, straight, name):
    ici, strategy = SPLITS[name]
    if strategy == "ring":
        result, trainer = straight
    else:
        resolved = _config(
            root, name, **{"model.sequence_parallel": strategy, "checkpoint.enabled": "false"}
        )
        # Parts of this config: the model's strategy is part of the model.
        trainer = Trainer(resolved, build_parts(resolved), make_mesh(ici))
        result = trainer.run()
    ref = reference[0]
    steps = sorted(ref.losses)
    assert steps == list(range(1, STEPS + 1))
    np.testing.assert_allclose(
        [result.losses[s] for s in steps], [ref.losses[s] for s in steps], rtol=1e-5, atol=1e-5
    )
    hashes = _hashes(trainer.run_dir)
    assert hashes == _hashes(root / "reference") and len(set(hashes.values())) == STEPS
    # The split is real: the compiled step exchanges keys and values over the `sequence` axis.
    # (the reference's model has the same strategy but one device: no split, no collectives).
    ops = {"ring": ("collective_permute",), "all_gather": ("all_gather", "reduce_scatter")}
    hlo = trainer.plan.lower(2).as_text()
    for op in ops[strategy]:
        assert f"stablehlo.{op}" in hlo, f"no {op} in the {name} step"
    assert "stablehlo.collective_permute" not in reference[1].plan.lower(2).as_text()


def test_split_run_resumes_bit_for_bit(root, reference, straight):
    result, trainer = straight
    ici, strategy = SPLITS["ring_fsdp2_x_sequence4"]
    resolved = _config(root, "resumed", **{"model.sequence_parallel": strategy})
    parts = build_parts(resolved)
    first = Trainer(resolved, parts, make_mesh(ici)).run(stop_after=2)
    assert sorted(first.losses) == [1, 2]
    again = Trainer(resolved, parts, make_mesh(ici))
    resumed = again.run()
    assert resumed.start_step == 2 and sorted(resumed.losses) == [3, 4]
    assert [resumed.losses[s] for s in (3, 4)] == [result.losses[s] for s in (3, 4)]
    for a, b in zip(jax.tree.leaves(again.state), jax.tree.leaves(trainer.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_generation_prefills_a_long_prompt_across_the_split():
    # Under the trainer's mesh and rules the prompt's positions are split 8 ways during the
    # prefill (the keys and values are gathered into the cache, which is not split); decoding
    # one position at a time is replicated over the sequence devices.
    config = mm.get_preset("tiny-llama").replace(
        vocab_size=68, hidden_dim=32, num_heads=4, num_kv_heads=2, head_dim=8,
        max_seq_len=512, sequence_parallel="ring",
    )  # fmt: skip
    model = mm.Transformer.init(config, key=jax.random.key(3))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 68, n).tolist() for n in (203, 37)]
    expected = mm.generate(model, prompts, max_new_tokens=6, eos_token_id=None)
    mesh = make_mesh({"data": 1, "sequence": 8})
    sharded = hax.shard(model, PARAMETER_RULES, mesh)
    with jax.set_mesh(mesh), hax.axis_mapping(COMPUTE_RULES, uneven="replicate"):
        out = mm.generate(sharded, prompts, max_new_tokens=6, eos_token_id=None)
    assert out == expected


def test_length_the_filled_split_does_not_divide_is_an_error_before_any_work(root):
    # mesh.ici.sequence=-1 fills 8 devices: two chunks each need a multiple of 16.
    spec = as_spec(_config(root, "bad", **{"data.seq_len": 200}))
    with pytest.raises(ConfigError, match=r"data.seq_len=200 .* use --config.data.seq_len=208"):
        plan(spec, jax.devices())


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ("--config.mesh.ici.sequence=4", "--config.data.seq_len=250"),
            "error: data.seq_len=250 does not split over the mesh sequence axis of 4 devices "
            "in two chunks each (causal load balancing); use --config.data.seq_len=256",
        ),
        (
            ("--config.mesh.ici.sequence=2", "--config.model.sequence_parallel=none"),
            "error: mesh sequence axis of 2 devices (mesh.ici.sequence x mesh.dcn.sequence) "
            "with model.sequence_parallel='none'",
        ),
        (
            ("--config.model.attention_backend=splash",),
            "error: model.attention_backend='splash': sequence_parallel='ring' runs its own "
            "blockwise XLA kernel",
        ),
    ],
    ids=["length", "no_strategy", "backend"],
)
def test_bad_split_is_one_error_line_before_any_work(tmp_path, overrides, message):
    command = _subprocess.command(tmp_path / "run", tmp_path / "cache", *overrides)
    command[2] = f"--config={CONFIG}:smoke"
    proc = subprocess.run(
        command, env=_subprocess.env(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert one_error_line(proc.stderr).startswith(message), proc.stderr[-3000:]
    assert not (tmp_path / "cache").exists()  # refused before building any store


def test_rope_scaling_is_a_config_key_taking_the_hf_dict():
    spec = as_spec(load_config(f"{CONFIG}", []))  # the 64k plan: Marin 8B, YaRN from 4k
    assert (spec.model.rope.scaling, spec.model.rope.factor) == ("yarn", 16.0)
    assert spec.model.rope.original_max_position == 4096 and spec.model.rope.theta == 500_000.0
    assert spec.mesh.ici_sizes["fsdp"] == 8 and spec.mesh.ici_sizes["sequence"] == -1
    assert spec.data.seq_len == 65_536
    bad = '{"rope_type": "yarn", "factor": 16.0, "beta": 2}'
    with pytest.raises(ConfigError, match=r"model.rope_scaling: .*does not use \['beta'\]"):
        as_spec(load_config(f"{CONFIG}", [("model.rope_scaling", bad)]))
