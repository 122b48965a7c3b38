"""`//levanter:elastic_bench`'s report: the README's figures (`elastic_shrink_s`,
`elastic_grow_s`) with when, where and under what load, and a failing status when either was
not measured. The timed runs are replaced by recorded results (tests/test_elastic.py runs the
real job); what is checked is what the bench prints and returns."""

import importlib.util
import json
import os
import pathlib

import pytest

BENCH = pathlib.Path(__file__).parent.parent / "bin" / "elastic_bench.py"
STEPS = 7
HASHES = [101, 202, 303, 404, 505, 606, 707]


@pytest.fixture
def bench(monkeypatch):
    spec = importlib.util.spec_from_file_location("elastic_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for key in ("XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR"):  # main() sets them; undo after
        monkeypatch.setenv(key, os.environ.get(key, ""))
    monkeypatch.setattr(module, "_reference_hashes", lambda root, args: list(HASHES))
    return module


def _run(shrink_s, grow_s, slices=(3, 3, 2, 2, 2, 3, 3)):
    records = [
        {"step": s + 1, "data/batch_hash": h, "mesh/num_slices": n}
        for s, (h, n) in enumerate(zip(HASHES, slices, strict=True))
    ]

    def fake(root, args, standby=True):
        return {
            "exit_status": 0,
            "elastic_shrink_s": shrink_s if standby else 2 * shrink_s if shrink_s else None,
            "elastic_grow_s": grow_s,
            "reference_start_s": 9.0,
            "records": list(records),
        }

    return fake


def _main(bench, tmp_path, capsys):
    status = bench.main([f"--steps={STEPS}", "--kill_at=2", f"--dir={tmp_path}"])
    return status, json.loads(capsys.readouterr().out)


def test_the_report_carries_the_readme_figures_and_where_they_were_measured(
    bench, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(bench, "_elastic_run", _run(3.25, 2.5))
    status, out = _main(bench, tmp_path, capsys)
    assert status == 0
    assert out["elastic_shrink_s"] == 3.25 and out["elastic_grow_s"] == 2.5
    assert out["elastic_shrink_cold_s"] == 6.5 and out["shrink_speedup"] == 2.0
    assert out["steps_once"] and out["hashes_equal"]
    assert out["num_slices_by_step"] == [3, 3, 2, 2, 2, 3, 3]
    assert out["machine"]["cpus"] == os.cpu_count() and out["machine"]["platform"]
    assert out["date_utc"].endswith(" UTC") and out["date_utc"][:2] == "20"
    assert len(out["load_avg_1m"]) == 2


@pytest.mark.parametrize("shrink_s, grow_s", [(None, 2.5), (3.25, None)])
def test_a_figure_that_was_not_measured_fails_the_bench(
    bench, tmp_path, capsys, monkeypatch, shrink_s, grow_s
):
    monkeypatch.setattr(bench, "_elastic_run", _run(shrink_s, grow_s))
    status, out = _main(bench, tmp_path, capsys)
    assert status == 1
    assert out["elastic_shrink_s"] == shrink_s and out["elastic_grow_s"] == grow_s


def test_a_lost_step_fails_the_bench(bench, tmp_path, capsys, monkeypatch):
    fake = _run(3.25, 2.5)

    def lossy(root, args, standby=True):
        result = fake(root, args, standby)
        del result["records"][3]
        return result

    monkeypatch.setattr(bench, "_elastic_run", lossy)
    status, out = _main(bench, tmp_path, capsys)
    assert status == 1 and not out["steps_once"] and not out["hashes_equal"]
