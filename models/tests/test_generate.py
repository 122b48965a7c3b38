"""KV-cache generation: cache == recompute, padding invariance, eos stop, sampling."""

import jax
import jax.numpy as jnp
import model_testing as T
import numpy as np
import pytest

import meltemi.models as mm
from meltemi.models._sampling import argmax, filter_logits, sample

PROMPTS = [[5, 6, 7, 9, 11, 3, 2], [8], [3, 4, 60]]  # lengths 7, 1, 3


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-gpt2", "tiny-qwen3-moe"])
def model(request):
    return T.random_model(mm.get_preset(request.param), seed=3)


@pytest.fixture(scope="module")
def greedy(model):
    return mm.generate(model, PROMPTS, max_new_tokens=6, eos_token_id=None)


def test_cached_greedy_decoding_matches_recomputing_the_full_sequence(model, greedy):
    full = mm.generate(model, PROMPTS, max_new_tokens=6, eos_token_id=None, use_cache=False)
    assert greedy == full
    assert [len(g) for g in greedy] == [6, 6, 6]


def test_a_prompt_continues_the_same_alone_or_batched_with_longer_ones(model, greedy):
    alone = mm.generate(model, [PROMPTS[1]], max_new_tokens=6, eos_token_id=None)
    assert alone[0] == greedy[1]


def test_rows_stop_after_their_eos_token(model, greedy):
    eos = greedy[0][2]  # the third token row 0 emits
    out = mm.generate(model, PROMPTS, max_new_tokens=6, eos_token_id=eos)
    for row, ref in zip(out, greedy, strict=True):
        cut = ref.index(eos) + 1 if eos in ref else len(ref)
        assert row == ref[:cut]


def test_top_k_one_sampling_is_greedy():
    model = T.random_model(mm.get_preset("tiny-llama"), seed=3)
    sampling = mm.SamplingConfig(temperature=0.8, top_k=1)
    out = mm.generate(
        model,
        PROMPTS,
        max_new_tokens=4,
        sampling=sampling,
        key=jax.random.key(1),
        eos_token_id=None,
    )
    assert out == [g[:4] for g in mm.generate(model, PROMPTS, max_new_tokens=4, eos_token_id=None)]


def test_greedy_argmax_equals_jnp_argmax_with_ties_and_nans():
    rng = np.random.default_rng(0)
    logits = rng.integers(0, 4, (64, 1000)).astype(np.float32)  # many ties per row
    logits[3, [7, 500]] = np.nan  # the first NaN wins, as in jnp.argmax
    logits[5] = -np.inf
    expected = np.asarray(jnp.argmax(logits, axis=-1))
    assert expected[3] == 7 and expected[5] == 0
    assert np.asarray(jax.jit(argmax)(logits)).tolist() == expected.tolist()


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = jnp.log(jnp.array([[0.05, 0.5, 0.15, 0.3], [0.25, 0.25, 0.25, 0.25]]))
    kept = np.isfinite(np.asarray(filter_logits(logits, top_k=None, top_p=0.7)))
    assert kept.tolist() == [[False, True, False, True], [True, True, True, False]]


def test_sampling_draws_only_allowed_tokens():
    logits = jnp.tile(jnp.log(jnp.array([0.05, 0.5, 0.15, 0.3])), (101, 1))
    draws = sample(logits, jax.random.key(0), mm.SamplingConfig(temperature=1.0, top_k=2))
    assert set(np.asarray(draws).tolist()) == {1, 3}


def test_sampling_without_a_key_is_an_error():
    model = T.random_model(mm.get_preset("tiny-llama"), seed=3)
    with pytest.raises(mm.ConfigError, match=r"needs key=\.\.\."):
        mm.generate(model, PROMPTS, max_new_tokens=2, sampling=mm.SamplingConfig(temperature=1.0))


def test_too_long_generation_names_max_seq_len():
    model = T.random_model(mm.get_preset("tiny-gpt2"), seed=3)
    with pytest.raises(mm.ConfigError, match="max_seq_len=64"):
        mm.generate(model, PROMPTS, max_new_tokens=60)


def test_empty_prompt_is_rejected():
    model = T.random_model(mm.get_preset("tiny-llama"), seed=3)
    with pytest.raises(mm.ConfigError, match="at least one token"):
        mm.generate(model, [[1], []], max_new_tokens=2)


# -- one compiled program ------------------------------------------------------------------


def test_many_prompt_lengths_and_budgets_share_a_handful_of_compiles():
    # One layer: the number of programs does not depend on the depth, the compile time does.
    cfg = mm.get_preset("tiny-llama").replace(max_seq_len=128, num_layers=1)
    model = T.random_model(cfg, seed=3)
    rng = np.random.default_rng(0)

    def sweep():
        for length in range(1, 31):  # 30 prompt lengths, 16 budgets, batches of 1-3
            prompts = [rng.integers(1, 67, length).tolist()] * (1 + length % 3)
            mm.generate(model, prompts, max_new_tokens=1 + length % 16, eos_token_id=None)

    # buckets: prompt 16/32 x budget 16 x batch 1/2/4 (3 rows pad to 4) = 6 programs, plus
    # one for the model's decoding copy (made once per model, `_decoding_model`)
    assert T.count_compiles(sweep) <= 6 + 1
    assert T.count_compiles(sweep) == 0  # the second sweep is all cache hits


def test_bucketed_output_equals_the_unpadded_recomputation():
    # Prompt lengths 7 and 17 straddle a bucket; budget 19 runs in the 32 bucket.
    model = T.random_model(mm.get_preset("tiny-llama"), seed=4)
    prompts = [list(range(3, 10)), list(range(20, 37))]
    cached = mm.generate(model, prompts, max_new_tokens=19, eos_token_id=None)
    full = mm.generate(model, prompts, max_new_tokens=19, eos_token_id=None, use_cache=False)
    assert cached == full and [len(c) for c in cached] == [19, 19]


def test_every_id_of_an_eos_list_stops_its_row(model, greedy):
    # Row r stops at the first token of `greedy[r]` that is in the list; a row whose tokens
    # avoid the list runs to the budget.
    eos = [greedy[0][1], greedy[2][3], 1000]
    out = mm.generate(model, PROMPTS, max_new_tokens=6, eos_token_id=eos)
    for row, ref in zip(out, greedy, strict=True):
        hits = [i for i, tok in enumerate(ref) if tok in eos]
        assert row == (ref[: hits[0] + 1] if hits else ref)
    assert len(out[0]) <= 2 and len(out[2]) <= 4


def test_sampling_is_reproducible_from_the_key_and_changes_with_it():
    model = T.random_model(mm.get_preset("tiny-llama"), seed=3)
    sampling = mm.SamplingConfig(temperature=1.5, top_k=40, top_p=0.95)

    def run(seed, prompts=PROMPTS):
        return mm.generate(
            model,
            prompts,
            max_new_tokens=12,
            sampling=sampling,
            key=jax.random.key(seed),
            eos_token_id=None,
        )

    assert run(7) == run(7)
    assert run(7) != run(8)
    # A row's draws depend on the key, the step and its row index only: the compiled loop
    # and the step-by-step recomputation draw the same tokens.
    recomputed = mm.generate(
        model,
        PROMPTS,
        max_new_tokens=12,
        sampling=sampling,
        key=jax.random.key(7),
        eos_token_id=None,
        use_cache=False,
    )
    assert run(7) == recomputed


def test_first_sampled_token_follows_the_filtered_softmax():
    # 4,096 copies of one prompt: the first token's frequencies match the model's own
    # next-token distribution after temperature and top-k (an independent computation).
    model = T.random_model(mm.get_preset("tiny-llama"), seed=5)
    prompt = [5, 6, 7]
    temperature, top_k = 2.0, 8
    logits = np.asarray(model(np.array([prompt])).array[0, -1], np.float64) / temperature
    kth = np.sort(logits)[-top_k]
    p = np.where(logits >= kth, np.exp(logits - logits.max()), 0.0)
    p /= p.sum()
    n = 4096
    out = mm.generate(
        model,
        [prompt] * n,
        max_new_tokens=1,
        sampling=mm.SamplingConfig(temperature=temperature, top_k=top_k),
        key=jax.random.key(0),
        eos_token_id=None,
    )
    freq = np.bincount([o[0] for o in out], minlength=p.size) / n
    assert set(np.flatnonzero(freq)) <= set(np.flatnonzero(p))
    np.testing.assert_allclose(freq, p, atol=4 * np.sqrt(0.25 / n))  # 4 sigma at worst


def test_a_bfloat16_cache_is_stored_in_bfloat16_and_decodes_the_same_tokens(model, greedy):
    from meltemi.models import _generate

    out = mm.generate(model, PROMPTS, max_new_tokens=6, eos_token_id=None, cache_dtype="bfloat16")
    assert out == greedy
    tokens = np.ones((4, 16), np.int32)
    static = (_generate.GREEDY, 16, jnp.bfloat16, None)
    args = (model, tokens, np.zeros(4, np.int32), np.int32(6), _generate._eos_ids(None))
    hlo = _generate._compiled.lower(*args, jax.random.key(0), np.int32(0), static).as_text()
    cfg = model.config
    # keys (batch, kv heads, 16+16 slots, head size); values with the slots innermost
    k_shape = f"tensor<4x{cfg.num_kv_heads}x32x{cfg.head_size}x"
    v_shape = f"tensor<4x{cfg.num_kv_heads}x{cfg.head_size}x32x"
    loop = next(line for line in hlo.splitlines() if "stablehlo.while" in line)
    # The decoding loop carries k and v of every layer in bfloat16, and nothing in float32.
    for shape in (k_shape, v_shape):
        assert loop.count(f"{shape}bf16>") >= cfg.num_layers
        assert f"{shape}f32>" not in loop


def test_unknown_cache_dtype_names_the_choices():
    model = T.random_model(mm.get_preset("tiny-llama"), seed=3)
    with pytest.raises(mm.ConfigError, match="cache_dtype='float8'.*bfloat16"):
        mm.generate(model, PROMPTS, max_new_tokens=2, cache_dtype="float8")


# -- the decoding layout without the native product: few-row products run weight-first ----------
# (the path of sharded models and of machines without a C++ compiler; the native product is
# tested in test_native_matmul.py)


@pytest.fixture
def xla_product(monkeypatch):
    from meltemi.models import _generate

    monkeypatch.setattr(_generate, "_native_products", lambda: False)


def _decoding_linear(In, Out):  # noqa: N803
    import meltemi.haliax as hax
    import meltemi.haliax.nn as hnn
    from meltemi.models._generate import _weights_out_first

    layer = hnn.Linear.init(In, Out, key=jax.random.key(0), use_bias=False)
    layer = _weights_out_first(layer)
    assert [a.name for a in layer.weight.axes] == [a.name for a in hax.concat_axes(Out, In)]
    return layer


@pytest.mark.parametrize("rows", [3, 40])
def test_decoding_products_equal_the_plain_product(rows, xla_product):
    import meltemi.haliax as hax

    In = (hax.Axis("heads", 3), hax.Axis("head_size", 5))  # noqa: N806 - multi-axis, as o_proj
    Out = hax.Axis("embed", 13)  # noqa: N806
    layer = _decoding_linear(In, Out)
    Batch, Pos = hax.Axis("batch", rows), hax.Axis("position", 1)  # noqa: N806
    x = hax.random.normal(jax.random.key(1), (Batch, Pos, *In))
    got = layer(x).rearrange(("batch", "position", "embed")).array
    want = jnp.einsum("bphd,ehd->bpe", x.array, layer.weight.array)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows, weight_first", [(3, True), (40, False)])
def test_decoding_products_run_weight_first_only_for_few_rows(rows, weight_first, xla_product):
    # XLA:CPU reads a weight near its bandwidth bound only as `w[Out, In] @ x.T` when x has
    # few rows; the barrier keeps XLA from folding the transpose back into `x @ w.T`.
    import meltemi.haliax as hax

    In, Out = hax.Axis("embed", 13), hax.Axis("mlp", 11)  # noqa: N806
    layer = _decoding_linear(In, Out)
    x = hax.named(jnp.ones((rows, 13)), (hax.Axis("batch", rows), In))
    hlo = jax.jit(lambda m, x: m(x).array).lower(layer, x).compile().as_text()
    dots = [line for line in hlo.splitlines() if " dot(" in line]
    assert dots, hlo
    first = f"f32[11,{rows}]" if weight_first else f"f32[{rows},11]"
    assert all(line.split("=", 1)[1].strip().startswith(first) for line in dots), dots


# -- the decoding copy of the weights: made once per model, dropped with it ------------------------


def _models_reaching_the_loop(monkeypatch, model, calls=2):
    from meltemi.models import _generate

    seen, compiled = [], _generate._compiled

    def spy(decoding_model, *args):
        seen.append(decoding_model)
        return compiled(decoding_model, *args)

    monkeypatch.setattr(_generate, "_compiled", spy)
    for _ in range(calls):
        mm.generate(model, [[5, 6, 7]], max_new_tokens=3, eos_token_id=None)
    return seen


def test_generate_rearranges_a_models_weights_once_not_at_every_call(monkeypatch):
    # Unstacking the layers inside the compiled loop copied every block weight at each call:
    # ~0.3 s of a 1.6 s call at 162M (12 layers, 32 new tokens).
    import meltemi.haliax.nn as hnn

    model = T.random_model(mm.get_preset("tiny-llama"), seed=5)
    assert isinstance(model.blocks, hnn.Stacked)
    first, second = _models_reaching_the_loop(monkeypatch, model)
    assert isinstance(first.blocks, hnn.BlockSeq), type(first.blocks)
    a, b = jax.tree.leaves(first), jax.tree.leaves(second)
    assert len(a) == len(b) and all(x is y for x, y in zip(a, b))
    other = T.random_model(mm.get_preset("tiny-llama"), seed=6)
    (third,) = _models_reaching_the_loop(monkeypatch, other, calls=1)
    assert not np.array_equal(jax.tree.leaves(third)[-1], b[-1])  # another model, its own copy


def test_the_decoding_copy_of_the_weights_is_freed_with_its_model(monkeypatch):
    import gc
    import weakref

    model = T.random_model(mm.get_preset("tiny-llama"), seed=5)
    seen = _models_reaching_the_loop(monkeypatch, model, calls=1)
    copy = weakref.ref(jax.tree.leaves(seen.pop().blocks)[0])  # a copied block weight
    gc.collect()
    assert copy() is not None  # kept while the model lives
    del model
    gc.collect()
    assert copy() is None


def test_a_tied_head_decodes_weight_first_with_the_same_logits(xla_product):
    # `Embedding.unembed` ran `x[rows, embed] . table[vocab, embed]` in the plain order: at 8
    # rows and a 32000 x 768 table, 16.3 ms against 10.7 ms weight-first (same process).
    import meltemi.haliax as hax
    from meltemi.models._generate import _for_decoding

    cfg = mm.get_preset("tiny-llama").replace(tie_embeddings=True)
    model = T.random_model(cfg, seed=3)
    decoding = _for_decoding(model)
    assert decoding.lm_head is not None
    assert decoding.lm_head.weight.array is model.embed.weight.array  # the table, not a copy
    rows = 3
    hidden = hax.random.normal(jax.random.key(2), (hax.Axis("batch", rows), model.embed.Embed))
    logits = jax.jit(lambda m, h: m._project(h).array)
    np.testing.assert_allclose(
        logits(decoding, hidden), logits(model, hidden), rtol=1e-5, atol=1e-5
    )
    hlo = logits.lower(decoding, hidden).compile().as_text()
    dots = [line for line in hlo.splitlines() if " dot(" in line]
    assert dots and all(f"f32[{cfg.vocab_size},{rows}]" in line for line in dots), dots


def test_the_batch_one_loop_does_not_copy_its_cache_several_times_a_step():
    # With the batch axis carried, XLA:CPU duplicated each cache update into its two consumers
    # and copied every layer's cache 4 times per step (22% of a 512-token call at 162M).
    from meltemi.models import _generate

    cfg = mm.get_preset("tiny-llama")
    model = _generate._decoding_model(T.random_model(cfg, seed=3))
    tokens, pads = np.ones((1, 16), np.int32), np.zeros(1, np.int32)
    static = (_generate.GREEDY, 16, None, None)
    args = (tokens, pads, np.int32(16), _generate._eos_ids(None), jax.random.key(0), np.int32(0))
    hlo = _generate._compiled.lower(model, *args, static).compile().compiled.as_text()
    kv, slots, size = cfg.num_kv_heads, 32, cfg.head_dim
    shapes = [f"{kv},{slots},{size}]", f"{kv},{size},{slots}]"]  # keys; values position-last
    copies = [
        line for line in hlo.splitlines() if " copy(" in line and any(s in line for s in shapes)
    ]
    assert len(copies) <= 2 * cfg.num_layers, copies  # one per buffer (the old loop: 4)


def test_a_token_stream_step_does_not_copy_its_cache_several_times():
    # `TokenStream` runs `generate`'s step one call at a time; given the cache with its size-1
    # batch axis it copied every layer's cache 4 times per token, as the loop did.
    from meltemi.models import _generate

    cfg = mm.get_preset("tiny-llama")
    model = _generate._decoding_model(T.random_model(cfg, seed=3))
    tokens, pads, key = np.ones((1, 16), np.int32), np.zeros(1, np.int32), jax.random.key(0)
    token, cache, valid = _generate._stream_prefill(
        model, tokens, pads, key, (_generate.GREEDY, 16, None)
    )
    carry = _generate._CacheCarry.of(cache)
    consts = (model, key, valid, jnp.asarray([16]), _generate.GREEDY, 16, carry, token)
    step = _generate._stream_step.lower(consts, carry.arrays(cache), jnp.int32(1))
    hlo = step.compile().compiled.as_text()
    kv, slots, size = cfg.num_kv_heads, 32, cfg.head_dim
    shapes = [f"{kv},{slots},{size}]", f"{kv},{size},{slots}]"]
    copies = [
        line for line in hlo.splitlines() if " copy(" in line and any(s in line for s in shapes)
    ]
    assert len(copies) <= 2 * cfg.num_layers, copies  # one per buffer (before: 4)
