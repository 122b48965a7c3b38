"""Sequence parallelism: logits order, the ring's compiled program, memory per device and
the errors, on 8 fake CPU devices (loss and gradient parity: `test_context_parallel.py`)."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import dataclasses  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import model_testing as T  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import meltemi.haliax as hax  # noqa: E402
import meltemi.models as mm  # noqa: E402
from meltemi.haliax import partitioning  # noqa: E402
from meltemi.models import _context_parallel as cp  # noqa: E402

SEQ = 48
MAPPING = {"batch": "data", "position": "sequence"}
SMALL = dict(hidden_dim=24, num_heads=4, num_kv_heads=2, intermediate_dim=20, num_layers=2)
CAUSAL = mm.get_preset("tiny-llama").replace(**SMALL, attention_query_block=3)
WINDOW_SOFTCAP = mm.get_preset("tiny-gemma2").replace(
    **SMALL, sliding_window=7, attention_query_block=3
)


def _with(model: mm.Transformer, **changes) -> mm.Transformer:
    return dataclasses.replace(model, config=model.config.replace(**changes))


def _split_mesh(n: int):
    return partitioning.make_mesh({"data": 8 // n, "sequence": n})


@pytest.mark.parametrize("strategy", ["all_gather", "ring"])
def test_split_logits_in_natural_order_with_global_positions(strategy):
    """No segment ids: RoPE from global positions; the logits come back unpermuted."""
    model = T.random_model(WINDOW_SOFTCAP, seed=4)
    tokens = np.random.default_rng(5).integers(0, model.config.vocab_size, (4, SEQ))
    ref = jax.jit(lambda m, t: m(t).array)(model, tokens)
    with jax.set_mesh(_split_mesh(4)), hax.axis_mapping(MAPPING):
        got = jax.jit(lambda m, t: m(t).array)(_with(model, sequence_parallel=strategy), tokens)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)


def test_split_composes_with_tensor_parallel_heads():
    """Ring over `sequence` while `kv_heads` and `mlp` are split over `model` (2 x 2 x 2)."""
    model = T.random_model(CAUSAL, seed=6)
    tokens = np.random.default_rng(6).integers(0, CAUSAL.vocab_size, (2, SEQ))
    grad = jax.jit(jax.value_and_grad(lambda m, t: m.loss(t)))
    ref_loss, ref_grads = grad(model, tokens)
    mesh = partitioning.make_mesh({"data": 2, "sequence": 2, "model": 2})
    mapping = {**MAPPING, "kv_heads": "model", "mlp": "model"}
    with jax.set_mesh(mesh), hax.axis_mapping(mapping):
        loss, grads = grad(_with(model, sequence_parallel="ring"), tokens)
    np.testing.assert_allclose(loss, ref_loss, rtol=0, atol=1e-5)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def _compiled_grad(model, tokens, mesh, mapping):
    grad = jax.jit(jax.value_and_grad(lambda m, t: m.loss(t)))
    if mesh is None:
        return grad.lower(model, tokens).compile()
    with jax.set_mesh(mesh), hax.axis_mapping(mapping):
        return grad.lower(model, tokens).compile()


def _all_gathers(hlo: str) -> list[str]:
    ops = (" all-gather(", " all-gather-start(")
    return [line for line in hlo.splitlines() if any(op in line for op in ops)]


def test_ring_program_permutes_and_never_gathers_keys():
    model = _with(T.random_model(CAUSAL, seed=1), sequence_parallel="ring")
    tokens = np.zeros((2, SEQ), np.int32)
    mesh = partitioning.make_mesh({"data": 2, "sequence": 4})
    hlo = _compiled_grad(model, tokens, mesh, MAPPING).as_text()
    assert "collective-permute" in hlo
    floating = [g for g in _all_gathers(hlo) if "f32[" in g.split("=")[1].split("all-gather")[0]]
    assert floating == []
    # The all-gather strategy, compiled the same way, does gather them (the check can fail).
    gathered = _with(model, sequence_parallel="all_gather")
    assert _all_gathers(_compiled_grad(gathered, tokens, mesh, MAPPING).as_text())


LONG = 8192
LONG_CONFIG = CAUSAL.replace(attention_query_block=512)


@pytest.fixture(scope="module")
def unsplit_temp_bytes():
    model = T.random_model(LONG_CONFIG, seed=2)
    tokens = np.zeros((1, LONG), np.int32)
    return _compiled_grad(model, tokens, None, None).memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("strategy", ["all_gather", "ring"])
def test_split_of_4_cuts_activation_memory_per_device(unsplit_temp_bytes, strategy):
    """Compiled loss gradient at 8,192 positions: temporaries per device, no split vs 4."""
    model = _with(T.random_model(LONG_CONFIG, seed=2), sequence_parallel=strategy)
    mesh = partitioning.make_mesh({"sequence": 4})
    tokens = np.zeros((1, LONG), np.int32)
    split = _compiled_grad(model, tokens, mesh, {"position": "sequence"})
    per_device = split.memory_analysis().temp_size_in_bytes
    print(f"temp bytes per device: unsplit {unsplit_temp_bytes}, {strategy} split 4 {per_device}")
    assert unsplit_temp_bytes >= 3.5 * per_device, (unsplit_temp_bytes, per_device)


def test_length_the_split_does_not_divide_is_an_error():
    model = _with(T.random_model(CAUSAL, seed=1), sequence_parallel="ring")
    tokens = np.zeros((2, 44), np.int32)
    with jax.set_mesh(_split_mesh(4)), hax.axis_mapping(MAPPING):
        with pytest.raises(mm.ConfigError, match="multiple of 8. Fix: pad the sequence to 48"):
            jax.eval_shape(lambda m, t: m.loss(t), model, tokens)


def test_mapping_key_position_too_is_an_error():
    model = _with(T.random_model(CAUSAL, seed=1), sequence_parallel="all_gather")
    mapping = {**MAPPING, "key_position": "sequence"}
    with jax.set_mesh(_split_mesh(4)), hax.axis_mapping(mapping):
        with pytest.raises(mm.ConfigError, match="remove 'key_position' from the mapping"):
            jax.eval_shape(lambda m, t: m.loss(t), model, np.zeros((2, SEQ), np.int32))


def test_unknown_strategy_names_the_closest():
    with pytest.raises(mm.ConfigError, match='sequence_parallel="ring"'):
        CAUSAL.replace(sequence_parallel="rings")


def test_fused_backend_with_a_split_is_an_error():
    fix = r"attention_backend='splash'.*Fix: attention_backend=\"auto\""
    with pytest.raises(mm.ConfigError, match=fix):
        CAUSAL.replace(attention_backend="splash", sequence_parallel="ring")


def test_balance_gives_device_i_chunks_i_and_its_mirror():
    order = cp.balance(hax.arange(hax.Axis("position", 16)), 4).array.reshape(4, 4)
    # device i: chunk i (2 tokens) then chunk 7 - i
    want = [[2 * i, 2 * i + 1, 2 * (7 - i), 2 * (7 - i) + 1] for i in range(4)]
    assert order.tolist() == want
    x = hax.named(jnp.arange(48.0).reshape(2, 24), ("batch", "position"))
    assert cp.unbalance(cp.balance(x, 3), 3).array.tolist() == x.array.tolist()
