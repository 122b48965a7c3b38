"""The generation bench's quick mode: both `transformers` baselines and the engine measured,
tokens agree, roofline fractions reported against the bound computed from the counted weights.

The static-cache baseline compiles `forward` with `torch.compile(backend="eager")` here: the
same static cache, dynamo capture (`fullgraph=True`) and graphs per shape as the bench's
inductor run, without inductor's minutes of C++ compilation on a loaded 2-core machine.
"""

import pathlib
import sys

_bench = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
if _bench.is_dir() and str(_bench) not in sys.path:
    sys.path.append(str(_bench))

import generate_bench  # noqa: E402
import pytest  # noqa: E402

BASELINES = ("transformers_eager", "transformers_static_compile")


@pytest.fixture(scope="module")
def quick() -> dict:
    return generate_bench.measure(quick=True, compile_backend="eager")


def test_quick_mode_measures_both_baselines_at_each_batch(quick):
    shape = quick["generate_shapes"]["quick"]
    for batch in generate_bench.BATCHES:
        for side in BASELINES:
            assert shape[f"{side}_tokens_per_s_bs{batch}"] > 0
            ratio = shape[f"generate_vs_{side}_bs{batch}"]
            assert shape[f"generate_vs_{side}_bs{batch}_iqr"] == [ratio, ratio]  # one round
            assert shape[f"{side}_first_call_s_bs{batch}"] > 0
        assert shape["compile_backend"] == "eager"


def test_greedy_tokens_of_all_three_sides_agree(quick):
    shape = quick["generate_shapes"]["quick"]
    for batch in generate_bench.BATCHES:
        for side in BASELINES:
            assert shape[f"greedy_tokens_equal_{side}_bs{batch}"] is True, (side, batch)


def test_headline_is_the_ratio_against_the_strongest_baseline(quick):
    shape = quick["generate_shapes"]["quick"]
    assert quick["generate_headline_shape"] == "quick"
    for batch in generate_bench.BATCHES:
        b = f"_bs{batch}"
        # The strongest baseline is the one our paired ratio is lowest against.
        fastest = min(BASELINES, key=lambda s: shape[f"generate_vs_{s}{b}"])
        assert quick[f"fastest_transformers{b}"] == fastest
        assert quick[f"generate_vs_fastest_transformers{b}"] == min(
            shape[f"generate_vs_{s}{b}"] for s in BASELINES
        )


def test_engine_greedy_tokens_equal_generate(quick):
    shape = quick["generate_shapes"]["quick"]
    for batch in generate_bench.BATCHES:
        for k in generate_bench.ENGINE_STEPS:
            side = f"engine_steps{k}"
            assert shape[f"greedy_tokens_equal_{side}_bs{batch}"] is True, (side, batch)
            assert shape[f"{side}_tokens_per_s_bs{batch}"] > 0


def test_roofline_counts_every_weight_but_the_untied_embedding_table(quick):
    shape = quick["generate_shapes"]["quick"]
    hf = generate_bench.QUICK_SHAPES["quick"]
    # transformers' parameter count, minus the input table (untied head), float32.
    assert shape["weight_bytes_per_token"] == 4 * (
        shape["params"] - hf["vocab_size"] * hf["hidden_size"]
    )
    assert shape["read_bandwidth_gb_s"] > 0 and shape["matmul_peak_gflop_s"] > 0


def test_roofline_fraction_is_tokens_per_s_over_the_bound(quick):
    shape = quick["generate_shapes"]["quick"]
    sides = ("generate", *(f"engine_steps{k}" for k in generate_bench.ENGINE_STEPS), *BASELINES)
    for batch in generate_bench.BATCHES:
        b = f"_bs{batch}"
        bound = shape[f"roofline_tokens_per_s{b}"]
        for side in sides:
            expected = shape[f"{side}_tokens_per_s{b}"] / bound
            # tokens/s are rounded to 0.1 (up to 0.05 / bound in the fraction), the fraction
            # and the bound's tokens/s to 4 significant digits (up to 5e-4 of it each): the
            # errors add up.
            assert shape[f"roofline_fraction_{side}{b}"] == pytest.approx(
                expected, rel=0, abs=0.05 / bound + 1e-3 * expected + 1e-12
            )
        assert quick[f"roofline_fraction_generate{b}"] == shape[f"roofline_fraction_generate{b}"]


def _bound(shape: dict, batch: int, bandwidth_gb_s: float) -> float:
    """`roofline_seconds` of a call of the quick shape at `batch` and that read bandwidth."""
    return generate_bench.roofline_seconds(
        weight_bytes=shape["weight_bytes_per_token"],
        flops=shape["flops_per_token"],
        batch=batch,
        prompt_len=generate_bench.PROMPT_LEN,
        new_tokens=shape["new_tokens"],
        bandwidth=bandwidth_gb_s * 1e9,
        peak=shape["matmul_peak_gflop_s"] * 1e9,
    )


def test_the_bound_uses_the_fastest_of_the_runs_probes(quick):
    # One probe before the timed rounds and one after each batch's: the bound takes the
    # fastest read (a single probe varied 28-43 GB/s between quiet runs).
    shape = quick["generate_shapes"]["quick"]
    reads = shape["read_bandwidth_gb_s_probes"]
    assert len(reads) == 1 + len(generate_bench.BATCHES)
    assert len(shape["probe_load_averages"]) == len(reads)
    assert shape["read_bandwidth_gb_s"] == max(reads)
    assert shape["matvec_read_gb_s"] == max(shape["matvec_read_gb_s_probes"]) > 0
    for batch in generate_bench.BATCHES:
        bound = _bound(shape, batch, max(reads))
        assert shape[f"roofline_tokens_per_s_bs{batch}"] == pytest.approx(
            batch * shape["new_tokens"] / bound, rel=5e-4
        )


def test_paired_fraction_takes_each_call_against_the_bandwidth_probed_before_it(quick):
    # The machine's read bandwidth moves by 1.5x over minutes (other tenants): the paired
    # figure sets each call against the bound at a probe taken just before that call. With
    # one round: that call's bound over its time.
    shape = quick["generate_shapes"]["quick"]
    sides = ("generate", *(f"engine_steps{k}" for k in generate_bench.ENGINE_STEPS), *BASELINES)
    for batch in generate_bench.BATCHES:
        b = f"_bs{batch}"
        for side in sides:
            bound = _bound(shape, batch, shape[f"read_bandwidth_gb_s_paired_{side}{b}"])
            seconds = batch * shape["new_tokens"] / shape[f"{side}_tokens_per_s{b}"]
            paired = shape[f"roofline_fraction_paired_{side}{b}"]
            # tokens/s rounded to 0.1, bandwidth and fraction to 4 significant digits
            tol = 0.05 / shape[f"{side}_tokens_per_s{b}"] + 2e-3
            assert paired == pytest.approx(bound / seconds, rel=tol), (side, batch)
            assert shape[f"roofline_fraction_paired_{side}{b}_iqr"] == [paired, paired]


def test_combined_probes_keep_each_figures_best_and_list_every_read():
    probes = [
        {"read_bandwidth_gb_s": 9.0, "matmul_peak_gflop_s": 150.0, "matvec_read_gb_s": 7.0},
        {"read_bandwidth_gb_s": 31.0, "matmul_peak_gflop_s": 120.0, "matvec_read_gb_s": 19.0},
        {"read_bandwidth_gb_s": 28.0, "matmul_peak_gflop_s": 200.0, "matvec_read_gb_s": 21.0},
    ]
    probes = [{**p, "load": float(i)} for i, p in enumerate(probes)]
    got = generate_bench.combine_probes(probes)
    assert got["read_bandwidth_gb_s"] == 31.0
    assert got["matmul_peak_gflop_s"] == 200.0
    assert got["matvec_read_gb_s"] == 21.0
    assert got["read_bandwidth_gb_s_probes"] == [9.0, 31.0, 28.0]
    assert got["probe_load_averages"] == [0.0, 1.0, 2.0]


def test_roofline_bound_is_the_slower_of_reading_and_computing():
    common = dict(weight_bytes=8e9, batch=8, prompt_len=16, new_tokens=33, bandwidth=4e9)
    # Reading 8 GB at 4 GB/s takes 2 s; 8 rows x 1 GFLOP at 100 GFLOP/s take 0.08 s.
    assert generate_bench.roofline_seconds(flops=1e9, peak=100e9, **common) == pytest.approx(
        max(2.0, 16 * 0.08) + 32 * 2.0
    )
    # At 1 GFLOP/s computing is the bound: 8 s per step, 16x that for the prefill.
    assert generate_bench.roofline_seconds(flops=1e9, peak=1e9, **common) == pytest.approx(
        16 * 8.0 + 32 * 8.0
    )


def test_headline_shape_is_the_largest_measured(monkeypatch):
    calls = []

    def fake_shape(hf_config, *, new_tokens, repeats, compile_backend, probe):
        calls.append((hf_config["hidden_size"], new_tokens, repeats))
        size = hf_config["hidden_size"]
        return {"params": size, "fastest_transformers_bs1": f"side{size}"}

    monkeypatch.setattr(generate_bench, "measure_shape", fake_shape)
    out = generate_bench.measure(shapes=("large", "small"))
    assert out["generate_headline_shape"] == "large"
    assert out["fastest_transformers_bs1"] == "side768"
    # The >=100M shape runs on a smaller token budget than the others.
    assert calls == [(768, 32, 5), (256, 128, 11)]
