"""Sequence parallelism: the `position` axis split 2, 4 and 8 ways on 8 fake CPU devices.

The reference is the same model, unsplit, on one device. The batch packs documents of uneven
lengths (some crossing the chunk boundaries of every split, one row ending in padding), so
the mask, the per-document positions, the loss mask and the load-balancing permutation are
all exercised.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import dataclasses  # noqa: E402

import jax  # noqa: E402
import model_testing as T  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import meltemi.haliax as hax  # noqa: E402
import meltemi.models as mm  # noqa: E402
from meltemi.haliax import partitioning  # noqa: E402

SEQ = 48  # 2n chunks for n = 2, 4, 8: chunks of 12, 6 and 3 tokens
BATCH = 4
MAPPING = {"batch": "data", "position": "sequence"}
SMALL = dict(hidden_dim=24, num_heads=4, num_kv_heads=2, intermediate_dim=20, num_layers=2)
CONFIGS = {
    # plain causal attention, queries in blocks of 3 inside each device
    "causal": mm.get_preset("tiny-llama").replace(**SMALL, attention_query_block=3),
    # Gemma 2: a windowed layer then a global one (a traced per-layer flag), logit soft caps
    "window_softcap": mm.get_preset("tiny-gemma2").replace(
        **SMALL, sliding_window=7, attention_query_block=3
    ),
}


def _packed_batch(config: mm.ModelConfig):
    """Tokens and segment ids: uneven documents, the last row ending in padding (id -1)."""
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, config.vocab_size, (BATCH, SEQ)).astype(np.int32)
    lengths = [[5, 13, 1, 29], [48], [2, 7, 11, 17, 11], [20, 19]]
    seg = np.full((BATCH, SEQ), -1, np.int32)
    for row, docs in enumerate(lengths):
        start = 0
        for i, n in enumerate(docs):
            seg[row, start : start + n] = i
            start += n
    return tokens, seg


def _with(model: mm.Transformer, **changes) -> mm.Transformer:
    return dataclasses.replace(model, config=model.config.replace(**changes))


def _loss(model, tokens, seg):
    mask = (np.arange(SEQ) % 5 != 0).astype(np.float32)  # a loss mask on top of the segments
    return model.loss(tokens, segment_ids=seg, loss_mask=np.broadcast_to(mask, tokens.shape))


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def case(request):
    config = CONFIGS[request.param]
    model = T.random_model(config, seed=3)
    tokens, seg = _packed_batch(config)
    loss, grads = jax.jit(jax.value_and_grad(_loss))(model, tokens, seg)
    return model, tokens, seg, loss, grads


def _split_mesh(n: int):
    return partitioning.make_mesh({"data": 8 // n, "sequence": n})


@pytest.mark.parametrize("strategy", ["all_gather", "ring"])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_split_loss_and_grads_equal_unsplit(case, strategy, n):
    model, tokens, seg, ref_loss, ref_grads = case
    split = _with(model, sequence_parallel=strategy)
    with jax.set_mesh(_split_mesh(n)), hax.axis_mapping(MAPPING):
        loss, grads = jax.jit(jax.value_and_grad(_loss))(split, tokens, seg)
    np.testing.assert_allclose(loss, ref_loss, rtol=0, atol=1e-5)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
