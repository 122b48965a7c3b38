"""Generation of a sharded model under the trainer's mesh and mapping, on 8 fake CPU devices.

The mesh and the rules follow `meltemi.levanter.mesh` (parameters: `embed` over `fsdp`,
`mlp`/`kv_heads`/`vocab` over `tensor`; compute: the batch over `data` x `fsdp`).
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import jax  # noqa: E402
import model_testing as T  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import meltemi.haliax as hax  # noqa: E402
import meltemi.models as mm  # noqa: E402
from meltemi.haliax import partitioning  # noqa: E402
from meltemi.models import _generate  # noqa: E402

PARAMETER_RULES = {
    "embed": "fsdp",
    "mlp": "tensor",
    "kv_heads": "tensor",
    "vocab": "tensor",
    "batch": ("data", "fsdp"),
}
COMPUTE_RULES = {**PARAMETER_RULES, "embed": None}
PROMPTS = [[5, 6, 7, 9, 11, 3, 2], [8], [3, 4, 60]]  # 3 rows: padded to 4 for data x fsdp


@pytest.fixture(scope="module")
def mesh():
    return partitioning.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})


@pytest.fixture(scope="module")
def model():
    return T.random_model(mm.get_preset("tiny-llama").replace(vocab_size=68), seed=3)


def test_a_sharded_model_generates_the_unsharded_tokens(mesh, model):
    expected = mm.generate(model, PROMPTS, max_new_tokens=9, eos_token_id=None)
    sharded = hax.shard(model, PARAMETER_RULES, mesh)
    assert tuple(sharded.embed.weight.array.sharding.spec) == ("tensor", "fsdp")
    with jax.set_mesh(mesh), hax.axis_mapping(COMPUTE_RULES):
        out = mm.generate(sharded, PROMPTS, max_new_tokens=9, eos_token_id=None)
        sampled = [
            mm.generate(
                sharded,
                PROMPTS,
                max_new_tokens=9,
                sampling=mm.SamplingConfig(temperature=1.0, top_p=0.9),
                key=jax.random.key(2),
                eos_token_id=None,
            )
            for _ in range(2)
        ]
    assert out == expected
    assert sampled[0] == sampled[1]


def test_the_kv_cache_is_split_over_batch_and_kv_heads(mesh, model):
    sharded = hax.shard(model, PARAMETER_RULES, mesh)
    with jax.set_mesh(mesh), hax.axis_mapping(COMPUTE_RULES):
        assert _generate._batch_multiple() == 4
        static = (_generate.GREEDY, 16, None, _generate._frozen_mapping())
        args = (sharded, np.ones((4, 16), np.int32), np.zeros(4, np.int32), np.int32(9))
        args += (_generate._eos_ids(None), jax.random.key(0), np.int32(0), static)
        hlo = _generate._compiled.lower(*args).lowered.compile().as_text()
    loop = next(line for line in hlo.splitlines() if " while(" in line)
    # Per device: 1 of 4 rows, 1 of 2 kv heads, all 32 slots, head size 8 (k per layer; v per
    # layer stores the slots innermost).
    assert loop.count("f32[1,1,32,8]") == model.config.num_layers
    assert loop.count("f32[1,1,8,32]") == model.config.num_layers
    assert "f32[4,2,32,8]" not in loop and "f32[4,2,8,32]" not in loop
