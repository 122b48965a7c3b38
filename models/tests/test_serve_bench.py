"""The serving bench's quick mode: the toy trace runs concurrently and one at a time, and every
figure is reported (keys and counts only; timings are not asserted)."""

import pathlib
import sys

_bench = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
if _bench.is_dir() and str(_bench) not in sys.path:
    sys.path.append(str(_bench))

import serve_bench  # noqa: E402

SIDE_KEYS = {"output_tokens", "wall_s", "tokens_per_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s",
             "itl_p99_s"}  # fmt: skip


def test_quick_mode_reports_every_side_and_the_ratios():
    # The static-cache side compiles with torch.compile's "eager" backend here (dynamo capture
    # and graphs per shape, without inductor's minutes of C++ compilation).
    out = serve_bench.measure(quick=True, compile_backend="eager")
    trace = serve_bench.make_trace(8, 20.0, (3, 17), (4, 12), 211)
    expected_tokens = sum(t for _, _, t in trace)
    for side in ("concurrent", "sequential"):
        assert set(out[side]) == SIDE_KEYS | {"steps", "step_p50_s", "step_p99_s"}
        assert 0 < out[side]["step_p50_s"] <= out[side]["step_p99_s"]
        # ignore_eos: every request yields exactly its max_tokens.
        assert out[side]["output_tokens"] == expected_tokens
    for side in ("transformers_eager_sequential", "transformers_static_compile_sequential"):
        assert set(out[side]) == SIDE_KEYS | {"threads"}
        assert out[side]["output_tokens"] == expected_tokens
        assert out[side]["threads"] >= 1
    # Prompts pad to powers of two from 16: one prefill graph each, compiled before timing.
    widths = sorted({serve_bench.prompt_bucket(len(p)) for _, p, _ in trace})
    assert out["transformers_static_compile_prompt_buckets"] == widths
    # Every graph of the trace (padded and full prompts, fresh and reused cache, the chosen
    # thread count) is compiled in the warm-up: none inside the timed trace.
    assert out["transformers_static_compile_recompiles"] == 0
    for key in ("concurrent_vs_sequential", "itl_p99_vs_sequential_itl_p50",
                "itl_p99_vs_sequential_itl_p99",
                "concurrent_vs_transformers_eager_sequential",
                "concurrent_vs_transformers_static_compile_sequential"):  # fmt: skip
        assert out[key] > 0
    fastest = out["fastest_transformers_sequential"]
    assert out["concurrent_vs_fastest_transformers_sequential"] == min(
        out[f"concurrent_vs_{side}_sequential"]
        for side in ("transformers_eager", "transformers_static_compile")
    )
    assert fastest in ("transformers_eager", "transformers_static_compile")
    # Nothing compiles after the engine's warm-up (the HTTP warm-up requests included: with
    # the KV pools left uncommitted before the first call, the first program warmed up was
    # compiled again there).
    assert out["compiles_during_trace"] == 0


def test_prompt_buckets_are_powers_of_two_from_16():
    assert [serve_bench.prompt_bucket(n) for n in (1, 16, 17, 33, 96)] == [16, 16, 32, 64, 128]


def test_prefix_bench_quick_mode_reads_the_shared_start_from_the_cache():
    """`prefix_bench --quick`: the cached side prefills the shared start once and gives the
    same greedy tokens."""
    import prefix_bench

    out = prefix_bench.measure(quick=True)
    shared, own, _, requests, _, _ = prefix_bench.WORKLOADS["quick"]
    assert out["greedy_tokens_equal"]
    u, c = out["uncached"], out["prefix_cache"]
    assert u["prompt_tokens"] == c["prompt_tokens"] == requests * (shared + own)
    assert u["cached_prompt_tokens"] == 0
    # The first request prefills the 24-token start (6 pages of 4); the others wait for its
    # pages and read them from the cache.
    assert c["cached_prompt_tokens"] == (requests - 1) * shared
    for key in ("prefix_cache_vs_uncached_wall", "prefix_cache_vs_uncached_ttft"):
        assert out[key] > 0
