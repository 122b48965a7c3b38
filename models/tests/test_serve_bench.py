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


def test_quick_mode_reports_both_sides_and_the_ratios():
    out = serve_bench.measure(quick=True)
    trace = serve_bench.make_trace(8, 20.0, (3, 17), (4, 12), 211)
    expected_tokens = sum(t for _, _, t in trace)
    for side in ("concurrent", "sequential"):
        assert set(out[side]) == SIDE_KEYS
        # ignore_eos: every request yields exactly its max_tokens.
        assert out[side]["output_tokens"] == expected_tokens
    assert out["transformers_eager_sequential"]["output_tokens"] == expected_tokens
    assert out["transformers_eager_sequential"]["threads"] >= 1
    for key in ("concurrent_vs_sequential", "itl_p99_vs_sequential_itl_p50",
                "concurrent_vs_transformers_eager_sequential"):  # fmt: skip
        assert out[key] > 0
    assert out["compiles_during_trace"] == 0
