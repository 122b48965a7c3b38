"""Expert-sharded weights with the batch split over `data` only, on 8 fake CPU devices.

What these tests prove: `{"experts": "expert"}` stores each expert's weights on its own
devices, the forward pass is exact, and no expert weight is ever all-gathered. With the batch
*not* split over the expert axis, the all-to-all dispatch cannot run (it warns) and the
compiler moves the tokens with gathers and reductions instead; token-level expert parallelism
(all-to-all) is tested in `test_moe_ep.py`.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import re  # noqa: E402

import equinox as eqx  # noqa: E402
import model_testing as T  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import meltemi.haliax as hax  # noqa: E402
import meltemi.models as mm  # noqa: E402
from meltemi.haliax import partitioning  # noqa: E402

BASE = mm.get_preset("tiny-mixtral")
MAPPING = {"batch": "data", "experts": "expert"}
TOKENS = np.random.default_rng(0).integers(0, 67, (2, 13)).astype(np.int32)


def _config(dispatch):
    moe = BASE.moe.replace(num_experts=4, dispatch=dispatch, capacity_factor=2.0)
    return BASE.replace(moe=moe)


@pytest.fixture(scope="module")
def mesh():
    return partitioning.make_mesh({"data": 2, "expert": 4})


@pytest.mark.parametrize("dispatch", ["capacity", "dropless"])
def test_expert_sharded_weights_give_the_unsharded_logits(mesh, dispatch):
    model = T.random_model(_config(dispatch), seed=6)
    expected = np.asarray(eqx.filter_jit(lambda m, t: m(t).array)(model, TOKENS))
    sharded = hax.shard(model, MAPPING, mesh)
    spec = sharded.blocks.stacked.mlp.gate_proj.array.sharding.spec
    assert tuple(spec)[:2] == (None, "expert")  # (layers, experts, mlp, embed)
    tokens = hax.named(TOKENS, ("batch", "position"))
    fwd = hax.named_jit(lambda m, t: m(t), MAPPING, mesh=mesh)
    np.testing.assert_allclose(np.asarray(fwd(sharded, tokens).array), expected, atol=1e-5)


@pytest.mark.parametrize("dispatch", ["capacity", "dropless"])
def test_expert_weights_are_never_gathered(mesh, dispatch):
    model = hax.shard(T.random_model(_config(dispatch), seed=6), MAPPING, mesh)
    tokens = hax.named(TOKENS, ("batch", "position"))
    fwd = hax.named_jit(lambda m, t: m(t), MAPPING, mesh=mesh)
    hlo = fwd.lower(model, tokens).lowered.compile().as_text()
    # One layer's full expert weights are [4, 12, 30] / [4, 30, 12]; each device holds one expert.
    gathered = [
        line
        for line in hlo.splitlines()
        if "all-gather" in line and re.search(r"\[(3,)?4,(12,30|30,12)\]", line)
    ]
    assert not gathered, gathered[:3]
