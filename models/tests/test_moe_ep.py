"""Expert parallelism with all-to-all on 8 fake CPU devices: exact, and local communication.

The ragged exchange (`ep_exchange="ragged"`) runs here with `ragged_all_to_all` lowered by
`meltemi.models.testing`'s emulator (XLA:CPU cannot compile the real op), checked against the
op's documented semantics; the real op is only lowered.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

import ast  # noqa: E402
import collections  # noqa: E402
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
from meltemi.models import testing  # noqa: E402
from meltemi.models.moe import _ep as _moe_ep  # noqa: E402
from meltemi.models.moe import _kernels as _moe_kernels  # noqa: E402
from meltemi.models.moe import _ragged  # noqa: E402

BASE = mm.get_preset("tiny-mixtral")
BATCH, SEQ = 8, 13
TOKENS = np.random.default_rng(0).integers(0, 67, (BATCH, SEQ)).astype(np.int32)
EP_MAPPING = {"batch": ("data", "expert"), "experts": "expert"}


def _config(dispatch, exchange="auto"):
    moe = BASE.moe.replace(
        num_experts=8, dispatch=dispatch, capacity_factor=1.0, ep_exchange=exchange
    )
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


# The ragged exchange.


def _documented_example():
    """The per-device arguments and results of the worked example in the installed
    `jax.lax.ragged_all_to_all` docstring (axis size 2), read from the docstring itself."""
    doc = jax.lax.ragged_all_to_all.__doc__
    example = doc[doc.index("For example, if we apply") : doc.index("Args:")]
    devices = re.split(r"axis index \d:", example)[1:]
    values = [dict(re.findall(r"(\w+) = (\[[-0-9, ]*\])", d)) for d in devices]
    assert len(values) == 4 and all(values), values  # arguments of 2 devices, then results
    return [{k: ast.literal_eval(v) for k, v in d.items()} for d in values]


ARGS = ("operand", "output", "input_offsets", "send_sizes", "output_offsets", "recv_sizes")


def _over_devices(n, fn):
    """`fn` under `shard_map` over n devices, each argument split along its leading axis."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:n]), ("x",))
    spec = jax.sharding.PartitionSpec("x")
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec))


def _ragged_all_to_all(*args):
    return jax.lax.ragged_all_to_all(*args, axis_name="x")


def _stack(per_device):
    """Concatenated per-device arguments (data float32, offsets and sizes int32)."""
    return [
        np.concatenate([np.asarray(d[a], np.float32 if i < 2 else np.int32) for d in per_device])
        for i, a in enumerate(ARGS)
    ]


def _pseudocode(per_device):
    """The docstring's SEND / RECEIVE loops, in numpy: each device's result."""
    n = len(per_device)
    results = [np.array(d["output"], np.float32) for d in per_device]
    per = len(per_device[0]["send_sizes"]) // n
    for src, d in enumerate(per_device):
        for i in range(len(d["send_sizes"])):
            dst, j = i // per, src * per + i % per  # j: the chunk's index on its receiver
            start, size = d["input_offsets"][i], per_device[dst]["recv_sizes"][j]
            at = d["output_offsets"][i]
            results[dst][at : at + size] = np.asarray(d["operand"], np.float32)[
                start : start + size
            ]
    return results


def test_emulated_ragged_all_to_all_gives_the_documented_example():
    example = _documented_example()
    args, results = example[:2], [r["result"] for r in example[2:]]
    with testing.ragged_all_to_all_on_cpu():
        got = _over_devices(2, _ragged_all_to_all)(*_stack(args))
    assert np.asarray(got).reshape(2, -1).tolist() == results
    assert [r.tolist() for r in _pseudocode(args)] == results  # the reference used below


def _random_exchange(rng, n, per, rows, out_rows):
    """Per-device arguments of a random exchange: padded chunks in shuffled places."""
    sizes = rng.integers(0, 3, (n, n * per))  # [sender, chunk]
    devices = [
        {"operand": rng.standard_normal(rows).round(3), "output": np.zeros(out_rows)}
        for _ in range(n)
    ]
    for d in range(n):
        order = rng.permutation(n * per)
        offsets, at = np.zeros(n * per, int), 0
        for i in order:
            at += rng.integers(0, 2)  # a gap: offsets are not a cumsum of sizes
            offsets[i], at = at, at + sizes[d, i]
        devices[d].update(input_offsets=offsets, send_sizes=sizes[d])
    for g in range(n):  # receiver g places the chunks sent to it, again in shuffled places
        incoming = [(s, g * per + q) for s in range(n) for q in range(per)]
        at = 0
        for s, i in (incoming[k] for k in rng.permutation(len(incoming))):
            devices[s].setdefault("output_offsets", np.zeros(n * per, int))[i] = at
            at += sizes[s, i] + rng.integers(0, 2)
        devices[g]["recv_sizes"] = np.array([sizes[s, i] for s, i in incoming])
    return devices


def test_emulated_ragged_all_to_all_and_its_gradient_follow_the_documented_semantics():
    n, rows, out_rows = 4, 24, 32
    devices = _random_exchange(np.random.default_rng(3), n, 2, rows, out_rows)
    expected = _pseudocode(devices)
    # Where each operand row lands: send row labels 1..rows through the same exchange.
    labels = [dict(d, operand=np.arange(1, rows + 1) + 100 * s) for s, d in enumerate(devices)]
    landed = _pseudocode(labels)
    weight = np.random.default_rng(4).standard_normal((n, out_rows)).astype(np.float32)
    expected_grad = np.zeros((n, rows), np.float32)  # d sum(weight * result) / d operand
    for g in range(n):
        for at, label in enumerate(landed[g].astype(int)):
            if label:
                expected_grad[label // 100, label % 100 - 1] = weight[g, at]
    stacked = _stack(devices)
    with testing.ragged_all_to_all_on_cpu():
        got = _over_devices(n, _ragged_all_to_all)(*stacked)
        # The primitive's own transpose rule (itself a ragged_all_to_all), lowered the same way.
        grad = jax.grad(
            lambda x: jnp.sum(
                _over_devices(n, _ragged_all_to_all)(x, *stacked[1:]) * weight.ravel()
            )
        )(stacked[0])
    np.testing.assert_array_equal(np.asarray(got).reshape(n, -1), np.stack(expected))
    np.testing.assert_array_equal(np.asarray(grad).reshape(n, -1), expected_grad)
    assert (expected_grad != 0).sum() > n * 4  # the exchange moved rows


@functools.cache
def _one_device_logits(dispatch):
    model, _ = _one_device(dispatch)
    return np.asarray(eqx.filter_jit(lambda m, t: m(t).array)(model, TOKENS))


def _loss_and_logits(model, tokens):
    loss, metrics = model.loss_and_metrics(tokens)
    return loss, (metrics, model(tokens).array)


@pytest.mark.parametrize(
    "dispatch, ep", [("dropless", 2), ("dropless", 4), ("dropless", 8), ("capacity", 4)]
)
def test_ragged_exchange_loss_logits_and_gradients_equal_one_device(dispatch, ep, monkeypatch):
    model, ((ref_loss, ref_metrics), ref_grads) = _one_device(dispatch)
    ragged = _skewed(T.random_model(_config(dispatch, "ragged"), seed=6))
    sent = []  # the ragged exchange must be the one traced
    real = _ragged.dispatch
    monkeypatch.setattr(_ragged, "dispatch", lambda *a: sent.append(a[2]) or real(*a))
    mesh = partitioning.make_mesh({"data": 8 // ep, "expert": ep})
    step = hax.named_jit(
        eqx.filter_value_and_grad(_loss_and_logits, has_aux=True), EP_MAPPING, mesh=mesh
    )
    with testing.ragged_all_to_all_on_cpu():
        (loss, (metrics, logits)), grads = step(
            hax.shard(ragged, EP_MAPPING, mesh), hax.named(TOKENS, ("batch", "position"))
        )
    s, k = SEQ, BASE.moe.top_k
    capacity = s if dispatch == "dropless" else ragged.config.moe.capacity(s)
    assert sent and set(sent) == {_moe_ep.buffer_rows(ep, s, k, 8, capacity)}, sent  # b = 1
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    np.testing.assert_allclose(
        float(metrics["dropped_fraction"]), float(ref_metrics["dropped_fraction"]), rtol=1e-6
    )
    np.testing.assert_allclose(np.asarray(logits), _one_device_logits(dispatch), atol=1e-5)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)


def test_real_ragged_exchange_lowers_to_ragged_all_to_alls_of_the_local_rows(monkeypatch):
    # "auto" on a (faked) TPU picks the ragged exchange; lowering needs no TPU, compiling would.
    monkeypatch.setattr(_moe_ep, "_platform", lambda: "tpu")
    model = T.random_model(_config("dropless"), seed=6)
    mesh = partitioning.make_mesh({"data": 4, "expert": 2})
    step = hax.named_jit(_grad, EP_MAPPING, mesh=mesh)
    tokens = hax.named(TOKENS, ("batch", "position"))
    text = step.lower(hax.shard(model, EP_MAPPING, mesh), tokens).lowered.as_text()
    calls = re.findall(r"custom_call @ragged_all_to_all\(.*?: \((.*?)\) -> tensor<(\w+)>", text)
    rows, buffer = SEQ * BASE.moe.top_k, _moe_ep.buffer_rows(2, SEQ, BASE.moe.top_k, 8, SEQ)
    assert buffer == 2 * rows < BATCH * SEQ  # the worst case: every row of both devices
    there, back = f"{rows}x30xf32", f"{buffer}x30xf32"
    offsets = ", ".join(["tensor<8xi32>"] * 4)  # one chunk per expert
    dispatch = (f"tensor<{there}>, tensor<{back}>, {offsets}", back)
    give_back = (f"tensor<{back}>, tensor<{there}>, {offsets}", there)
    # The forward pass's two exchanges, the backward pass's transposes (the same two, swapped)
    # and the forward ones again where the layer scan recomputes its forward pass.
    count = collections.Counter(calls)
    assert set(count) == {dispatch, give_back} and count[dispatch] == count[give_back] >= 2, calls
    explicit = r"stablehlo\.(all_gather|all_reduce|all_to_all|reduce_scatter|collective_permute)"
    ops = [line for line in text.splitlines() if re.search(explicit + "|@ragged_all_to_all", line)]
    assert not [op for op in ops if re.search(r"tensor<(8x13x30|104x30)x", op)], ops


def test_ragged_exchange_compiles_without_collectives_of_the_global_tokens():
    model = T.random_model(_config("dropless", "ragged"), seed=6)
    mesh = partitioning.make_mesh({"data": 4, "expert": 2})
    fwd = hax.named_jit(lambda m, t: m(t), EP_MAPPING, mesh=mesh)
    tokens = hax.named(TOKENS, ("batch", "position"))
    with testing.ragged_all_to_all_on_cpu():
        hlo = fwd.lower(hax.shard(model, EP_MAPPING, mesh), tokens).lowered.compile().as_text()
    found = collectives(hlo)
    assert ("all-gather", "s32[2,8]{1,0}") in found, found  # the counts: n x E integers
    global_tokens = re.compile(r"\[(8,13,30|104,30|8,13,8,30)\]")
    assert not [f for f in found if global_tokens.search(f[1])], found


@pytest.mark.parametrize(
    "platform, chosen", [("tpu", "ragged"), ("gpu", "ragged"), ("cpu", "dense")]
)
def test_auto_exchange_is_ragged_where_xla_compiles_it(platform, chosen, monkeypatch):
    monkeypatch.setattr(_moe_ep, "_platform", lambda: platform)
    assert _moe_ep.resolve_exchange("auto") == chosen
    assert _moe_ep.resolve_exchange("dense") == "dense"


def test_ragged_exchange_on_cpu_is_an_error_naming_the_field_and_the_fix(monkeypatch):
    monkeypatch.setattr(_moe_ep, "_platform", lambda: "cpu")
    model = T.random_model(_config("dropless", "ragged"), seed=6)
    mesh = partitioning.make_mesh({"data": 4, "expert": 2})
    fwd = hax.named_jit(lambda m, t: m(t), EP_MAPPING, mesh=mesh)
    with pytest.raises(
        mm.ConfigError,
        match=r"MoeConfig.ep_exchange='ragged'.*'cpu'.*Fix: .*ep_exchange='auto'.*'dense'",
    ):
        fwd(hax.shard(model, EP_MAPPING, mesh), hax.named(TOKENS, ("batch", "position")))


def test_an_unknown_ep_exchange_is_rejected():
    with pytest.raises(mm.ConfigError, match=r"ep_exchange='ragid'.*Fix: .*ep_exchange=\"auto\""):
        mm.MoeConfig(num_experts=4, top_k=2, expert_dim=4, ep_exchange="ragid")


# The bounded ragged buffer (`MoeConfig.ep_buffer_factor`).


def _bounded(factor, skewed=False):
    """The test model with the ragged exchange and `ep_buffer_factor=factor`."""
    cfg = _config("dropless", "ragged")
    model = T.random_model(cfg.replace(moe=cfg.moe.replace(ep_buffer_factor=factor)), seed=6)
    return _skewed(model) if skewed else model


def _ragged_step(model, ep, monkeypatch):
    """Loss, metrics and gradients of `model` at EP = ep with the emulated ragged exchange,
    and the receive-buffer sizes traced."""
    sent = []
    real = _ragged.dispatch
    monkeypatch.setattr(_ragged, "dispatch", lambda *a: sent.append(a[2]) or real(*a))
    mesh = partitioning.make_mesh({"data": 8 // ep, "expert": ep})
    with testing.ragged_all_to_all_on_cpu():
        out = hax.named_jit(_grad, EP_MAPPING, mesh=mesh)(
            hax.shard(model, EP_MAPPING, mesh), hax.named(TOKENS, ("batch", "position"))
        )
    monkeypatch.setattr(_ragged, "dispatch", real)
    return out, set(sent)


def _overflow(experts, ep, bound, num_experts):
    """Which (token, expert) assignments of `experts [B, S, K]` (one sequence per device,
    device r % ep of expert group r // ep holding row r) fit device receive buffers of
    `bound` rows, each filled in (local expert, source, token) order: a numpy transcription."""
    keep = np.ones(experts.shape, bool)
    local = num_experts // ep
    for group in range(experts.shape[0] // ep):
        rows = range(group * ep, (group + 1) * ep)
        for device in range(ep):
            at = 0
            for e in range(device * local, (device + 1) * local):
                for r in rows:
                    for t, j in zip(*np.nonzero(experts[r] == e), strict=True):
                        keep[r, t, j], at = at < bound, at + 1
    return keep


def test_buffer_rows_are_the_factor_times_the_mean_load_rounded_and_never_the_worst_case():
    assert _moe_ep.buffer_rows(64, 8192, 8, 256, 8192) == 64 * 8192 * 4  # 32x the mean
    assert _moe_ep.buffer_rows(64, 8192, 8, 256, 8192, factor=2.0) == 2 * 8192 * 8
    assert _moe_ep.buffer_rows(8, 13, 2, 8, 13, factor=1.0) == 32  # 26 rows, up to 8 | 32
    assert _moe_ep.buffer_rows(8, 13, 2, 8, 13, factor=1.3) == 40  # ceil(33.8) = 34 -> 40
    assert _moe_ep.buffer_rows(2, 13, 2, 8, 13, factor=3.0) == 52  # the worst case, 2 x 26
    assert _moe_ep.buffer_rows(4, 13, 2, 8, 4, factor=2.0) == 32  # capacity path: E * b * C


@pytest.mark.parametrize("bad", [0.5, 0, float("nan"), float("inf"), True, "2"])
def test_an_invalid_ep_buffer_factor_is_rejected_naming_the_field_and_the_fix(bad):
    with pytest.raises(
        mm.ConfigError,
        match=r"MoeConfig\.ep_buffer_factor=.*: must be None .* or a finite number >= 1 .*"
        r"Fix: MoeConfig\(\.\.\., ep_buffer_factor=4\.0\) or ep_buffer_factor=None",
    ):
        mm.MoeConfig(num_experts=4, top_k=2, expert_dim=4, ep_buffer_factor=bad)
    for good in (None, 1, 2.5):
        assert mm.MoeConfig(num_experts=4, top_k=2, expert_dim=4, ep_buffer_factor=good)


def test_a_bound_that_nothing_overflows_gives_the_unbounded_results(monkeypatch):
    # Routing near uniform: no device receives twice its mean load.
    (want, grads), worst = _ragged_step(_bounded(None), 4, monkeypatch)
    (got, bounded_grads), bound = _ragged_step(_bounded(2.0), 4, monkeypatch)
    assert worst == {104} and bound == {56}, (worst, bound)  # 4 x 13 x 2 rows; 2 x 26 -> 56
    assert float(got[1]["dropped_fraction"]) == 0.0
    # Equal up to float rounding: the buffer's size changes how XLA blocks the grouped matmuls
    # (differences of ~5e-8 under the test runner's compile flags).
    for a, b in zip(jax.tree.leaves((want, grads)), jax.tree.leaves((got, bounded_grads))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)


def test_a_small_bound_drops_exactly_the_overflow_and_equals_one_device_without_it(monkeypatch):
    ep, factor, bound = 4, 1.0, 32  # 13 x 2 = 26 rows per device on average, up to 8 | 32
    (loss, metrics), grads = _ragged_step(_bounded(factor, skewed=True), ep, monkeypatch)[0]
    # Reference: one device, dropless, each layer's overflowing assignments weighted zero.
    routings = []

    def keep(experts):
        routings.append(np.asarray(experts).reshape(BATCH, SEQ, -1))
        return _overflow(routings[-1], ep, bound, 8).reshape(experts.shape)

    real = _moe_kernels.dropless

    def masked(x, weights, experts, *rest):
        shape = jax.ShapeDtypeStruct(experts.shape, jnp.bool_)
        kept = jax.pure_callback(keep, shape, jax.lax.stop_gradient(experts))
        return real(x, weights * kept.astype(weights.dtype), experts, *rest)

    monkeypatch.setattr(_moe_kernels, "dropless", masked)
    model = _skewed(T.random_model(_config("dropless"), seed=6))  # the same weights
    # A new function, so no executable traced before the patch is reused.
    (ref_loss, _), ref_grads = eqx.filter_jit(lambda m, t: _grad(m, t))(model, TOKENS)
    layers = BASE.num_layers
    assert len(routings) >= layers
    dropped = np.mean([1 - _overflow(e, ep, bound, 8).mean() for e in routings[:layers]])
    assert dropped > 0.05  # the bound binds
    np.testing.assert_allclose(float(metrics["dropped_fraction"]), dropped, rtol=1e-6)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)


def test_real_ragged_exchange_lowers_with_the_bounded_buffer(monkeypatch):
    monkeypatch.setattr(_moe_ep, "_platform", lambda: "tpu")
    model = _bounded(1.0)
    mesh = partitioning.make_mesh({"data": 4, "expert": 2})
    step = hax.named_jit(_grad, EP_MAPPING, mesh=mesh)
    tokens = hax.named(TOKENS, ("batch", "position"))
    text = step.lower(hax.shard(model, EP_MAPPING, mesh), tokens).lowered.as_text()
    calls = re.findall(r"custom_call @ragged_all_to_all\(.*?: \((.*?)\) -> tensor<(\w+)>", text)
    rows = SEQ * BASE.moe.top_k  # 26 sent; the worst case would be 52
    assert _moe_ep.buffer_rows(2, SEQ, BASE.moe.top_k, 8, SEQ) == 52
    there, back = f"{rows}x30xf32", "32x30xf32"
    assert calls and {c[1] for c in calls} == {there, back}, calls
    assert all(f"tensor<{back}>" in c[0] for c in calls), calls
