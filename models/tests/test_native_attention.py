"""The paged attention kernels against the plain-JAX reference: the native CPU kernel
(`_native.paged_attention`, backend `"native"`) and JAX's Pallas GPU and TPU paged attention
(backends `"pallas_gpu"` and `"pallas_tpu"`, in Pallas' interpreters here); what `"auto"`
picks; the engine's tokens on each."""

import dataclasses

import jax
import jax.numpy as jnp
import model_testing as T
import numpy as np
import pytest

import meltemi.haliax as hax
import meltemi.models as mm
from meltemi.models import _native
from meltemi.models._axes import BATCH, HEAD_SIZE, KV_HEADS, POSITION, Q_HEADS_PER_GROUP
from meltemi.models.engine import (
    Engine,
    EngineConfig,
    Request,
    native_paged_attention,
    pallas_gpu_paged_attention,
    pallas_tpu_paged_attention,
    reference_paged_attention,
)
from meltemi.models.engine import _paged_attention as PA


def _case(rng, b, t, h, g, d, pages, size, width, pool_dtype=jnp.float32):
    q = hax.named(
        jnp.asarray(rng.standard_normal((b, t, h, g, d)), jnp.float32),
        (BATCH, POSITION, KV_HEADS, Q_HEADS_PER_GROUP, HEAD_SIZE),
    )
    k_pool = jnp.asarray(rng.standard_normal((h, pages, size, d)), pool_dtype)
    v_pool = jnp.asarray(rng.standard_normal((h, pages, size, d)), pool_dtype)
    table = jnp.asarray(rng.integers(0, pages, (b, width)), jnp.int32)  # shuffled, repeats
    positions = jnp.asarray(rng.integers(0, width * size, (b, t)), jnp.int32)
    return q, k_pool, v_pool, table, positions


@pytest.mark.parametrize(
    "b, t, h, g, d, size, options",
    [
        (8, 1, 12, 1, 64, 16, {}),  # decoding rows, the 162M model's heads
        (1, 12, 4, 3, 32, 8, {"window": 20}),  # a prompt chunk, grouped queries, a window
        (3, 2, 2, 2, 16, 4, {"softcap": 5.0, "scale": 0.3}),
        (2, 3, 1, 5, 8, 3, {"window": 1}),  # odd page size; each query sees only itself
    ],
)
def test_kernel_equals_reference(b, t, h, g, d, size, options):
    rng = np.random.default_rng(b * 100 + t)
    args = _case(rng, b, t, h, g, d, pages=40, size=size, width=6)
    kw = {"window": None, "softcap": None, "scale": None} | options
    want = reference_paged_attention(*args, **kw)
    got = jax.jit(lambda *a: native_paged_attention(*a, **kw))(*args)
    assert got.axes == want.axes
    np.testing.assert_allclose(got.array, want.array, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "b, h, g, d, width, options",
    [
        (3, 2, 3, 16, 4, {}),  # grouped queries
        (2, 1, 1, 8, 8, {"softcap": 5.0, "scale": 0.3}),
        (4, 2, 2, 8, 12, {}),  # a table width that is not a power of two
    ],
)
@pytest.mark.parametrize(
    "backend, pool_dtype",
    [(pallas_gpu_paged_attention, jnp.float32), (pallas_tpu_paged_attention, jnp.bfloat16)],
    ids=["gpu", "tpu"],
)
def test_pallas_kernel_equals_reference_on_decoding_rows(
    backend, pool_dtype, b, h, g, d, width, options
):
    """JAX's Pallas GPU and TPU paged attention (in Pallas' interpreters here) on decoding
    rows. The TPU kernel on bfloat16 pools: its bfloat16 rounding of what it loads is then
    exact, and it computes in float32 as the reference does from the same pools."""
    args = _case(
        np.random.default_rng(b + width), b, 1, h, g, d, pages=30, size=4, width=width,
        pool_dtype=pool_dtype,
    )  # fmt: skip
    kw = {"window": None, "softcap": None, "scale": None} | options
    want = reference_paged_attention(*args, **kw)
    got = backend(*args, **kw)
    assert got.axes == want.axes
    np.testing.assert_allclose(got.array, want.array, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "backend, module, pool_dtype",
    [
        (pallas_gpu_paged_attention, "gpu", jnp.float32),
        (pallas_tpu_paged_attention, "tpu", jnp.bfloat16),
    ],
)
def test_pallas_kernels_leave_chunks_and_windows_to_the_reference(
    backend, module, pool_dtype, monkeypatch
):
    import importlib

    pallas = importlib.import_module(f"jax.experimental.pallas.ops.{module}.paged_attention")
    called = []
    kernel = pallas.paged_attention
    monkeypatch.setattr(
        pallas, "paged_attention", lambda *a, **k: called.append(1) or kernel(*a, **k)
    )
    rng = np.random.default_rng(4)
    for t, window in ((3, None), (1, 5)):
        args = _case(rng, 2, t, 2, 1, 8, pages=20, size=4, width=4, pool_dtype=pool_dtype)
        kw = {"window": window, "softcap": None, "scale": None}
        got = backend(*args, **kw).array
        np.testing.assert_allclose(got, reference_paged_attention(*args, **kw).array, atol=1e-6)
    assert not called
    backend(*_case(rng, 2, 1, 2, 1, 8, pages=20, size=4, width=4, pool_dtype=pool_dtype), **kw
            | {"window": None})  # fmt: skip
    assert called


def test_pallas_tpu_leaves_float32_pools_to_the_reference(monkeypatch):
    """The TPU kernel rounds the keys and values it loads to bfloat16: on float32 pools it is
    1e-2 off (the first check shows it), so they run the reference."""
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas.ops.tpu import paged_attention as pallas_tpu

    q, k_pool, v_pool, table, positions = _case(
        np.random.default_rng(6), 3, 1, 2, 3, 16, pages=30, size=4, width=4
    )
    qa = (q.array * 16**-0.5).reshape(3, 6, 16)
    with pltpu.force_tpu_interpret_mode():
        raw = pallas_tpu.paged_attention(
            qa, k_pool, v_pool, positions[:, 0] + 1, table, pages_per_compute_block=2
        )
    kw = {"window": None, "softcap": None, "scale": None}
    want = reference_paged_attention(q, k_pool, v_pool, table, positions, **kw).array
    assert np.abs(np.asarray(raw).reshape(want.shape) - want).max() > 1e-3
    monkeypatch.setattr(pallas_tpu, "paged_attention", lambda *a, **k: 1 / 0)  # not called
    got = pallas_tpu_paged_attention(q, k_pool, v_pool, table, positions, **kw).array
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_padding_rows_read_nothing_outside_the_pool():
    """A negative position gives zeros, an out-of-range page id reads the reserved page 0:
    neither reads outside the pools (padding rows of a step carry such values)."""
    rng = np.random.default_rng(3)
    q, k_pool, v_pool, table, _ = _case(rng, 2, 1, 2, 1, 8, pages=5, size=4, width=3)
    table = jnp.asarray([[1, 2, 3], [99, -7, 4]], jnp.int32)
    positions = jnp.asarray([[-1], [11]], jnp.int32)
    out = native_paged_attention(
        q, k_pool, v_pool, table, positions, window=None, softcap=None, scale=None
    ).array
    assert not np.any(out[0]) and np.all(np.isfinite(out))
    want = reference_paged_attention(
        q, k_pool, v_pool, jnp.asarray([[1, 2, 3], [0, 0, 4]]), positions, window=None,
        softcap=None, scale=None,
    ).array  # fmt: skip
    np.testing.assert_allclose(out[1], want[1], rtol=0, atol=1e-5)


def test_auto_picks_the_platforms_kernel_on_one_device_only(monkeypatch):
    assert _native.available()  # CI machines have a compiler (see test_native_matmul)
    assert PA.resolve_paged_backend("auto") is native_paged_attention
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert PA.resolve_paged_backend("auto") is pallas_gpu_paged_attention
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert PA.resolve_paged_backend("auto") is pallas_tpu_paged_attention
    monkeypatch.setattr(jax, "device_count", lambda: 8)  # sharded pools: SPMD needs XLA's ops
    assert PA.resolve_paged_backend("auto") is reference_paged_attention


def test_other_dtypes_run_the_reference():
    args = _case(np.random.default_rng(5), 2, 1, 2, 1, 8, pages=5, size=4, width=2)
    q, k_pool, v_pool = (
        args[0].astype(jnp.bfloat16), args[1].astype(jnp.bfloat16), args[2].astype(jnp.bfloat16)
    )  # fmt: skip
    kw = {"window": None, "softcap": None, "scale": None}
    fn = jax.jit(lambda *a: native_paged_attention(*a, **kw).array)
    assert _native.ATTENTION_TARGET not in fn.lower(q, k_pool, v_pool, *args[3:]).as_text()
    assert _native.ATTENTION_TARGET in fn.lower(*args).as_text()


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-gemma2"])
def test_engine_runs_the_kernel_with_the_reference_tokens(preset, monkeypatch):
    """The engine's programs call the kernel under `"auto"`; its greedy tokens and their
    logprobs equal the reference backend's (gemma2: a sliding window and soft caps)."""
    cfg = mm.get_preset(preset).replace(max_seq_len=32)
    model = T.random_model(cfg, seed=3)
    page_bytes = 2 * cfg.num_layers * 8 * cfg.num_kv_heads * cfg.head_size * 4
    config = EngineConfig(kv_bytes=12 * page_bytes, page_size=8, max_seqs=2, prefill_chunk=8)
    prompts = [[3, 17, 29, 4, 41, 8, 9, 10, 11, 12, 13], [5, 60], [7, 1, 33, 2, 9]]
    traced = []
    kernel = _native.paged_attention
    monkeypatch.setattr(
        _native, "paged_attention", lambda *a, **k: traced.append(1) or kernel(*a, **k)
    )
    out = {}
    for backend in ("auto", "reference"):
        engine = Engine(model, dataclasses.replace(config, attention_backend=backend))
        for p in prompts:
            engine.submit(Request(p, 10, stop_ids=()))
        events = []
        while engine.has_work:
            events += engine.step()
        out[backend] = [(e.request_id, e.token, e.logprob) for e in events]
        if backend == "auto":
            assert traced, "the engine did not run the native kernel"
            traced.clear()
    assert not traced  # the reference backend does not
    assert [e[:2] for e in out["auto"]] == [e[:2] for e in out["reference"]]
    np.testing.assert_allclose(
        [e[2] for e in out["auto"]], [e[2] for e in out["reference"]], atol=1e-5
    )


@pytest.mark.parametrize("platform, cache_dtype", [("gpu", "float32"), ("tpu", "bfloat16")])
def test_engine_on_a_pallas_kernel_gives_the_reference_tokens(platform, cache_dtype, monkeypatch):
    import importlib

    pallas = importlib.import_module(f"jax.experimental.pallas.ops.{platform}.paged_attention")
    traced = []
    kernel = pallas.paged_attention
    monkeypatch.setattr(
        pallas, "paged_attention", lambda *a, **k: traced.append(1) or kernel(*a, **k)
    )
    cfg = mm.get_preset("tiny-llama").replace(max_seq_len=32)
    model = T.random_model(cfg, seed=5)
    page_bytes = 2 * cfg.num_layers * 8 * cfg.num_kv_heads * cfg.head_size * 4
    config = EngineConfig(
        kv_bytes=12 * page_bytes, page_size=8, max_seqs=2, prefill_chunk=8,
        cache_dtype=cache_dtype,
    )  # fmt: skip
    prompts = [[3, 17, 29, 4, 41, 8, 9, 10, 11], [5, 60]]
    out = []
    for name in (f"pallas_{platform}", "reference"):
        engine = Engine(model, dataclasses.replace(config, attention_backend=name))
        ids = [engine.submit(Request(p, 8, stop_ids=())) for p in prompts]
        done = engine.run_until_done()
        out.append([done[i][0] for i in ids])
        assert bool(traced) == (name != "reference"), name
        traced.clear()
    assert out[0] == out[1]
