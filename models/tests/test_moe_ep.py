"""Expert parallelism with all-to-all on 8 fake CPU devices: exact, and local communication."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import functools  # noqa: E402
import re  # noqa: E402

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import model_testing as T  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import meltemi.haliax as hax  # noqa: E402
import meltemi.models as mm  # noqa: E402
from meltemi.haliax import partitioning  # noqa: E402
from meltemi.models import _moe_ep  # noqa: E402

BASE = mm.get_preset("tiny-mixtral")
BATCH, SEQ = 8, 13
TOKENS = np.random.default_rng(0).integers(0, 67, (BATCH, SEQ)).astype(np.int32)
EP_MAPPING = {"batch": ("data", "expert"), "experts": "expert"}


def _config(dispatch):
    moe = BASE.moe.replace(num_experts=8, dispatch=dispatch, capacity_factor=1.0)
    return BASE.replace(moe=moe)


def _skewed(model):
    """Most tokens prefer expert 0: every embedding shares a direction the router favours."""
    rng = np.random.default_rng(1)
    c = rng.standard_normal(30).astype(np.float32)
    c /= np.linalg.norm(c)
    emb = model.embed.weight
    model = eqx.tree_at(lambda m: m.embed.weight.array, model, emb.array + 2.0 * c)
    router = model.blocks.stacked.mlp.router.weight  # (layers, experts, embed)
    names = [a.name for a in router.axes]
    assert names == ["layers", "experts", "embed"], names
    return eqx.tree_at(
        lambda m: m.blocks.stacked.mlp.router.weight.array, model, router.array.at[:, 0].add(4 * c)
    )


def _loss(model, tokens):
    return model.loss_and_metrics(tokens)


_grad = eqx.filter_value_and_grad(_loss, has_aux=True)


@functools.cache
def _one_device(dispatch):
    """The skewed model and its single-device loss, metrics and gradients (computed once for
    the three EP sizes)."""
    model = _skewed(T.random_model(_config(dispatch), seed=6))
    return model, eqx.filter_jit(_grad)(model, TOKENS)


@pytest.mark.parametrize("ep", [2, 4, 8])
@pytest.mark.parametrize("dispatch", ["capacity", "dropless"])
def test_expert_parallel_loss_and_gradients_equal_one_device(ep, dispatch, monkeypatch):
    model, ((ref_loss, ref_metrics), ref_grads) = _one_device(dispatch)
    assert float(ref_metrics["load_balancing"]) > 4  # uneven: 2 is uniform routing
    if dispatch == "capacity":
        assert float(ref_metrics["dropped_fraction"]) > 0.1  # the capacity really binds
    # The all-to-all path must be the one traced (a fallback would give the same numbers);
    # the compiled program's all-to-alls are checked in the tests below.
    traced = []
    moe = _moe_ep.moe
    monkeypatch.setattr(
        _moe_ep, "moe", lambda plan, *a, **k: traced.append(plan) or moe(plan, *a, **k)
    )
    mesh = partitioning.make_mesh({"data": 8 // ep, "expert": ep})
    tokens = hax.named(TOKENS, ("batch", "position"))
    step = hax.named_jit(_grad, EP_MAPPING, mesh=mesh)
    (loss, metrics), grads = step(hax.shard(model, EP_MAPPING, mesh), tokens)
    assert traced and all(p.size == ep and p.axis == "expert" for p in traced)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    np.testing.assert_allclose(
        float(metrics["dropped_fraction"]), float(ref_metrics["dropped_fraction"]), rtol=1e-6
    )
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dispatch", ["capacity", "dropless"])
def test_expert_parallel_logits_equal_one_device(dispatch):
    model = _skewed(T.random_model(_config(dispatch), seed=6))
    expected = np.asarray(eqx.filter_jit(lambda m, t: m(t).array)(model, TOKENS))
    mesh = partitioning.make_mesh({"data": 2, "expert": 4})
    fwd = hax.named_jit(lambda m, t: m(t), EP_MAPPING, mesh=mesh)
    got = fwd(hax.shard(model, EP_MAPPING, mesh), hax.named(TOKENS, ("batch", "position")))
    np.testing.assert_allclose(np.asarray(got.array), expected, atol=1e-5)


def collectives(hlo: str) -> list[tuple[str, str]]:
    """(op, result shape or tuple of shapes) of every collective in a compiled HLO module."""
    ops = "all-to-all|all-reduce|all-gather|reduce-scatter|collective-permute"
    found = []
    for line in hlo.splitlines():
        m = re.search(rf"= (.+?) ({ops})(-start)?\(", line)
        if m:
            found.append((m.group(2), m.group(1)))
    return found


def test_compiled_program_exchanges_tokens_with_all_to_all_only():
    model = T.random_model(_config("capacity"), seed=6)
    mesh = partitioning.make_mesh({"data": 2, "expert": 4})
    fwd = hax.named_jit(lambda m, t: m(t), EP_MAPPING, mesh=mesh)
    tokens = hax.named(TOKENS, ("batch", "position"))
    hlo = fwd.lower(hax.shard(model, EP_MAPPING, mesh), tokens).lowered.compile().as_text()
    found = collectives(hlo)
    assert any(op == "all-to-all" for op, _ in found), found
    # Nothing moves the global token x embed activations (8 x 13 x 30 or 104 x 30).
    global_tokens = re.compile(r"\[(8,13,30|104,30|8,13,8,30)\]")
    assert not [f for f in found if global_tokens.search(f[1])], found


@pytest.mark.parametrize("dispatch", ["capacity", "dropless"])
def test_a_token_travels_once_per_device_when_a_device_has_more_slots_than_tokens(dispatch):
    # EP = 2: 4 experts per device with C slots each, more than the 13 tokens of a sequence, so
    # tokens travel as [n, b, S, D] (once per device) instead of [n, E/n, b, C, D] slots.
    cfg = _config(dispatch)
    capacity = SEQ if dispatch == "dropless" else cfg.moe.capacity(SEQ)
    assert SEQ < 4 * capacity
    model = T.random_model(cfg, seed=6)
    mesh = partitioning.make_mesh({"data": 4, "expert": 2})
    fwd = hax.named_jit(lambda m, t: m(t), EP_MAPPING, mesh=mesh)
    tokens = hax.named(TOKENS, ("batch", "position"))
    hlo = fwd.lower(hax.shard(model, EP_MAPPING, mesh), tokens).lowered.compile().as_text()
    d = cfg.hidden_dim
    payload = []  # values of width D per all-to-all (the tokens and their outputs)
    for op, shapes in collectives(hlo):
        dims = [[int(v) for v in m.split(",")] for m in re.findall(r"f32\[([0-9,]+)\]", shapes)]
        if op == "all-to-all" and dims and dims[0][-1] == d:
            payload.append(sum(int(np.prod(x)) for x in dims))
    b = BATCH // 8  # sequences per device
    assert payload == [2 * b * SEQ * d] * 2, payload
    assert 2 * b * SEQ * d < cfg.moe.num_experts * b * capacity * d  # less than the slots


def test_batch_not_split_over_the_expert_axis_warns_and_falls_back():
    model = T.random_model(_config("capacity"), seed=6)
    mesh = partitioning.make_mesh({"data": 2, "expert": 4})
    mapping = {"batch": "data", "experts": "expert"}
    fwd = hax.named_jit(lambda m, t: m(t), mapping, mesh=mesh)
    with pytest.warns(UserWarning, match=r"batch is split over \('data',\), not over 'expert'"):
        out = fwd(hax.shard(model, mapping, mesh), hax.named(TOKENS, ("batch", "position")))
    expected = eqx.filter_jit(lambda m, t: m(t).array)(model, TOKENS)
    np.testing.assert_allclose(np.asarray(out.array), np.asarray(expected), atol=1e-5)
    assert jnp.isfinite(out.array).all()
