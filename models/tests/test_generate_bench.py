"""The generation bench's quick mode: both `transformers` baselines measured, tokens agree.

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


def test_headline_shape_is_the_largest_measured(monkeypatch):
    calls = []

    def fake_shape(hf_config, *, new_tokens, repeats, compile_backend):
        calls.append((hf_config["hidden_size"], new_tokens, repeats))
        size = hf_config["hidden_size"]
        return {"params": size, "fastest_transformers_bs1": f"side{size}"}

    monkeypatch.setattr(generate_bench, "measure_shape", fake_shape)
    out = generate_bench.measure(shapes=("large", "small"))
    assert out["generate_headline_shape"] == "large"
    assert out["fastest_transformers_bs1"] == "side768"
    # The >=100M shape runs on a smaller token budget than the others.
    assert calls == [(768, 32, 5), (256, 128, 11)]
