"""The dashboard's JSON API on a runs folder made by the tiny default config (trained once).

Every number is compared with the files on disk, read here with `json` independently of the
server's pyarrow/columns path; data provenance is checked against the trainer's own record of
each batch (`data/batch_hash`, recomputed here in numpy from the tokens the API names).
"""

import json
import math
import shutil
import threading
import time
import types

import _fake_gcs
import _subprocess
import dashboard_testing
import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from meltemi.levanter.dashboard import (
    DashboardServer,
    MetricsLog,
    RunsRoot,
    _metrics,
    _runs,
    create_app,
    downsample,
    free_port,
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The tiny run, trained by the binary with --dashboard_port, and what that dashboard
    answered while the binary ran."""
    base = tmp_path_factory.mktemp("binary")
    port = free_port()
    proc = _subprocess.start(
        base / "runs" / "tiny",
        base / "cache",
        "--config.name=tiny",
        f"--config.trainer.num_train_steps={dashboard_testing.TINY_STEPS}",
        "--config.eval.every_steps=3",
        "--config.checkpoint.save_every_steps=6",
        f"--dashboard_port={port}",
    )
    output: list[str] = []
    drain = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
    drain.start()
    seen = []
    while proc.poll() is None:
        try:
            rows = httpx.get(f"http://127.0.0.1:{port}/api/runs", timeout=5).json()["runs"]
            seen.extend((r["id"], r["state"], r["step"]) for r in rows)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    drain.join(10)
    assert proc.returncode == 0, "".join(output)
    return base / "runs" / "tiny", seen, "".join(output), port


@pytest.fixture(scope="module")
def folder(tmp_path_factory, trained):
    root = tmp_path_factory.mktemp("dash") / "runs"
    return dashboard_testing.build_runs_folder(root, tiny_run=trained[0])


@pytest.fixture(scope="module")
def client(folder):
    return TestClient(create_app(folder.root))


def lines(folder, run_id):
    out = []
    for raw in (folder.root / run_id / "metrics.jsonl").read_text().splitlines():
        try:
            row = json.loads(raw)
        except ValueError:
            continue
        out.append(row)
    return out


# -- runs list and one run


def test_the_trainer_flag_serves_the_dashboard_while_the_run_trains(trained):
    run_dir, seen, output, port = trained
    assert f"dashboard: http://127.0.0.1:{port}/" in output
    assert seen and {rid for rid, _, _ in seen} == {"tiny"}
    steps = [step for _, _, step in seen]
    assert steps == sorted(steps) and max(steps) <= dashboard_testing.TINY_STEPS
    assert any(state == "running" for _, state, _ in seen)


def test_runs_list_shows_each_run_state_and_its_last_numbers(folder, client):
    rows = {r["id"]: r for r in client.get("/api/runs").json()["runs"]}
    assert {
        rid: rows[rid]["state"] for rid in ("tiny", "failed", "live", "elastic", "mixture")
    } == {
        "tiny": "finished",
        "failed": "failed",
        "live": "running",
        "elastic": "degraded",
        "mixture": "finished",
    }
    for rid in ("tiny", "live", "mixture", *folder.sweep_runs):
        last = lines(folder, rid)[-1]
        assert rows[rid]["step"] == last["step"]
        assert rows[rid]["loss"] == last["train/loss"]
        assert rows[rid]["tokens_per_s"] == last["throughput/tokens_per_second"]
        assert rows[rid]["mfu"] == last["throughput/mfu"]
    config = json.loads((folder.root / "tiny" / "config.json").read_text())
    assert rows["tiny"]["total_steps"] == config["config"]["trainer"]["num_train_steps"] == 6
    assert rows["tiny"]["config_name"] == config["spec"]
    assert rows["sweep/runs/" + folder.sweep_runs[0].rsplit("/", 1)[1]]["sweep"] == "sweep"


def test_a_run_whose_metrics_stopped_changing_is_stopped_not_running(folder):
    later = TestClient(create_app(folder.root, clock=lambda: time.time() + 3600))
    rows = {r["id"]: r for r in later.get("/api/runs").json()["runs"]}
    assert rows["live"]["state"] == "stopped"
    assert rows["elastic"]["state"] == "stopped"  # status.json not rewritten for an hour
    assert rows["tiny"]["state"] == "finished"


def test_eta_is_remaining_steps_times_seconds_per_step(folder, client):
    row = next(r for r in client.get("/api/runs").json()["runs"] if r["id"] == "live")
    last = lines(folder, "live")[-1]
    seq_len = json.loads((folder.root / "live" / "config.json").read_text())["config"]["data"][
        "seq_len"
    ]
    expected = (
        (1000 - last["step"]) * last["batch_size"] * seq_len / last["throughput/tokens_per_second"]
    )
    assert row["eta_s"] == pytest.approx(expected, rel=1e-9)


def test_metrics_series_equal_the_file(folder, client):
    got = client.get("/api/runs/tiny/metrics").json()
    rows = lines(folder, "tiny")
    assert got["lines"] == len(rows) == 6 and got["skipped_lines"] == 0 and not got["downsampled"]
    for key in ("train/loss", "optim/grad_norm", "optim/learning_rate", "eval/stdlib/bpb"):
        want = [(r["step"], r[key]) for r in rows if key in r]
        series = got["series"][key]
        assert list(zip(series["steps"], series["values"], strict=True)) == want
    assert set(got["keys"]) == {k for r in rows for k in r if k != "step"}


def test_one_run_lists_checkpoints_evals_and_config_with_provenance(folder, client):
    d = client.get("/api/runs/tiny").json()
    manifest = json.loads(
        (folder.root / "tiny" / "checkpoints" / "step_00000006" / "meltemi.json").read_text()
    )
    assert d["checkpoints"] == [
        {
            "step": 6,
            "path": "checkpoints/step_00000006",
            "kind": manifest["kind"],
            "time": manifest["time"],
            "checksum_state": "checksums",
            "eval": None,
        }
    ]
    evals = [
        (r["step"], r["eval/stdlib/loss"]) for r in lines(folder, "tiny") if "eval/stdlib/loss" in r
    ]
    table = d["eval"][0]
    col = table["columns"].index("stdlib/loss")
    assert [(row[0], row[col]) for row in table["rows"]] == evals and len(evals) == 2
    saved = json.loads((folder.root / "tiny" / "config.json").read_text())
    assert d["config"]["trainer.num_train_steps"] == 6
    assert d["config"]["model.hidden_dim"] == saved["config"]["model"]["hidden_dim"]
    assert d["provenance"]["model.hidden_dim"] == "variant"
    assert d["provenance"]["trainer.num_train_steps"] == "flag"


def test_checksum_state_tells_sizes_and_incomplete_checkpoints(folder, client, tmp_path):
    root = tmp_path / "runs"
    run = root / "r"
    (run / "checkpoints" / "step_00000002").mkdir(parents=True)  # no manifest: incomplete
    (run / "checkpoints" / "step_00000004").mkdir()
    (run / "checkpoints" / "step_00000004" / "meltemi.json").write_text(
        json.dumps({"kind": "temporary", "step": 4, "time": 1.0, "files": {"a": {"size": 3}}})
    )
    (run / "metrics.jsonl").write_text('{"step": 1, "train/loss": 1.0}\n')
    got = TestClient(create_app(root)).get("/api/runs/r").json()["checkpoints"]
    assert [(c["step"], c["checksum_state"], c["kind"]) for c in got] == [
        (2, "incomplete", None),
        (4, "sizes", "temporary"),
    ]


def test_mixture_fractions_skip_events_and_harness_follow_the_file(folder, client):
    d = client.get("/api/runs/mixture").json()
    rows = lines(folder, "mixture")
    code = [r["data/code/fraction"] for r in rows]
    after = [r["data/code/fraction"] for r in rows if r["step"] - 1 >= 10]
    mix = {m["component"]: m for m in d["mixture"]}
    assert mix["code"]["weight"] == 0.5 and mix["prose"]["weight"] == 0.5
    assert mix["code"]["fraction"] == pytest.approx(np.mean(after), abs=1e-12)
    assert mix["code"]["fraction_all"] == pytest.approx(np.mean(code), abs=1e-12)
    assert d["mixture_stages"] == [
        {"step": 0, "weights": {"code": 0.75, "prose": 0.25}},
        {"step": 10, "weights": {"code": 0.5, "prose": 0.5}},
    ]
    skipped = [r["step"] for r in rows if r["optim/skipped"] == 1.0]
    assert [e["step"] for e in d["skip_events"]] == skipped == [7, 12]
    assert d["skip_events"][1]["reasons"] == ["loss_not_finite", "grad_norm_spike"]  # 9 = 1 | 8
    harness = d["harness"][0]
    assert harness["rows"] == [
        [r["step"], r["harness/arc_easy/acc"]] for r in rows if "harness/arc_easy/acc" in r
    ]


def test_slices_are_the_status_file(folder, client):
    status = json.loads((folder.root / "elastic" / "status.json").read_text())
    got = client.get("/api/runs/elastic/slices").json()
    assert [
        (s["index"], s["state"], s["restarts"], s["last_exit"], s["peak_rss_mb"])
        for s in got["slices"]
    ] == [
        (s["index"], s["state"], s["restarts"], s["last_exit"], s["peak_rss_mb"])
        for s in status["slices"]
    ]
    assert got["slices"][0]["peak_memory_bytes"] == int(status["slices"][0]["peak_rss_mb"] * 2**20)
    # each slice's current step: the running one at the job's, the lost one where it left
    assert [s["step"] for s in got["slices"]] == [s["step"] for s in status["slices"]] == [8, 5]
    assert [e["kind"] for e in got["events"]] == [e["kind"] for e in status["events"]]
    assert got["job"]["num_slices"] == 1 and got["job"]["target_slices"] == 2


def test_the_launcher_writes_each_slice_current_step(tmp_path):
    from meltemi.levanter.multislice._launch import _ElasticJob

    mesh = types.SimpleNamespace(num_slices=2, min_slices=1, fixed_devices=None)
    spec = types.SimpleNamespace(mesh=mesh, run_dir=tmp_path)
    job = _ElasticJob(spec, None, max_restarts=1, available=None, backoff_s=0.1, standby=False)
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(f'{{"step": {s}}}\n' for s in range(1, 6)))
    job.write_status()
    job.slices[1].state = "lost"
    metrics.write_text("".join(f'{{"step": {s}}}\n' for s in range(1, 10)))
    job.write_status()
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["step"] == 9
    assert [s["step"] for s in status["slices"]] == [9, 5]
    got = TestClient(create_app(tmp_path.parent)).get(f"/api/runs/{tmp_path.name}/slices").json()
    assert [s["step"] for s in got["slices"]] == [9, 5]


def test_compare_lists_differing_keys_with_their_sources(client):
    got = client.get("/api/compare?runs=tiny,live").json()
    diff = {d["key"]: d for d in got["diff"]}
    assert diff["trainer.num_train_steps"]["values"] == [6, 1000]
    assert diff["trainer.num_train_steps"]["sources"] == ["flag", "flag"]
    assert "model.hidden_dim" not in diff  # equal keys are left out
    every = client.get("/api/compare?runs=tiny,live&all=1").json()
    assert len(every["diff"]) == len(got["diff"]) + got["same"]
    bad = client.get("/api/compare?runs=tiny")
    assert bad.status_code == 400 and "at least two run ids" in bad.json()["error"]


# -- data provenance


def _mix(h):
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def fingerprint(tokens: np.ndarray) -> int:
    """`data/batch_hash` in numpy (the trainer computes it on device with jax)."""
    x = tokens.astype(np.uint32)
    pos = np.arange(x.size, dtype=np.uint32).reshape(x.shape)
    with np.errstate(over="ignore"):
        a = np.sum(_mix(x * np.uint32(0x9E3779B1) + pos), dtype=np.uint32)
        b = np.sum(_mix((x ^ np.uint32(0x5BD1E995)) + pos * np.uint32(0x27D4EB2F)), dtype=np.uint32)
    return (int(a) << 32) | int(b)


@pytest.mark.parametrize("step", [2, 5])
def test_provenance_names_the_tokens_the_trainer_trained_on(folder, client, step):
    rows = []
    for row in range(4):
        got = client.get(f"/api/runs/tiny/provenance?step={step}&row={row}").json()
        tokens = np.zeros(32, np.int64)
        for doc in got["documents"]:
            tokens[doc["row_offset"] : doc["row_offset"] + doc["tokens"]] = doc["token_ids"]
            assert doc["path"].endswith(".py") and doc["source"] == "stdlib"
        assert got["text"] == "".join(d["text"] for d in got["documents"])
        rows.append(tokens)
    recorded = next(r for r in lines(folder, "tiny") if r["step"] == step)["data/batch_hash"]
    assert fingerprint(np.stack(rows)) == recorded


def test_provenance_refuses_a_step_or_row_outside_the_run(client):
    bad_step = client.get("/api/runs/tiny/provenance?step=7&row=0")
    assert bad_step.status_code == 400
    assert (
        bad_step.json()["error"]
        == "step=7: outside the run's steps 1..6; pick a step in that range."
    )
    bad_row = client.get("/api/runs/tiny/provenance?step=1&row=4")
    assert bad_row.status_code == 400 and "row=4: step 1 has 4 rows" in bad_row.json()["error"]
    not_int = client.get("/api/runs/tiny/provenance?step=one&row=0")
    assert not_int.status_code == 400 and "step='one'" in not_int.json()["error"]


# -- sweeps


def test_sweep_points_fits_and_prediction_equal_its_files(folder, client):
    assert [s["id"] for s in client.get("/api/sweeps").json()["sweeps"]] == ["sweep"]
    got = client.get("/api/sweeps/sweep").json()
    iso = json.loads((folder.root / "sweep" / "isoflop.json").read_text())
    assert [(p["budget"], p["n_params"], p["loss"]) for p in got["points"]] == [
        (r["budget"], r["n_params"], r["loss"]) for r in iso["runs"]
    ]
    assert {p["run"] for p in got["points"]} == set(folder.sweep_runs)
    for fitted, parabola in zip(got["fits"], iso["fit"]["parabolas"], strict=True):
        n, loss = np.array(fitted["curve"]["n"]), np.array(fitted["curve"]["loss"])
        x = np.log10(n)  # the parabola in log10 N, evaluated here independently
        np.testing.assert_allclose(
            loss, parabola["a"] * x**2 + parabola["b"] * x + parabola["c"], rtol=1e-12
        )
        assert loss.min() >= parabola["l_opt"] - 1e-9  # the vertex is the curve's minimum
    law = iso["fit"]["loss_law"]
    c = np.array(got["laws"]["curve"]["budget"])
    np.testing.assert_allclose(
        got["laws"]["curve"]["loss"],
        law["E"] + law["A"] * (c / law["C0"]) ** -law["alpha"],
        rtol=1e-12,
    )
    verification = json.loads((folder.root / "sweep" / "verification.json").read_text())
    assert got["verification"]["actual"] == verification["actual"]
    assert (
        got["prediction"]["loss"]
        == json.loads((folder.root / "sweep" / "prediction.json").read_text())["model"]["loss"]
    )


# -- metrics: corrupt lines, incremental reads, downsampling, live


def test_corrupt_and_half_written_lines_are_skipped_and_counted(folder, client):
    got = client.get("/api/runs/failed/metrics?keys=train/loss").json()
    assert got["skipped_lines"] == 2 and got["lines"] == 4
    assert got["series"]["train/loss"]["steps"] == [1, 2, 3, 4]
    assert (
        next(r for r in client.get("/api/runs").json()["runs"] if r["id"] == "failed")[
            "skipped_lines"
        ]
        == 2
    )


def test_every_kind_of_bad_line_is_counted_never_a_500(tmp_path):
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(
        '{"step": 1, "train/loss": 2.0}\n'
        "not json\n"
        "[1, 2]\n"
        '{"train/loss": 3.0}\n'  # no step
        '{"step": "2", "train/loss": 3.0}\n'  # a string step
        '{"step": 2, "train/loss": NaN, "note": "text"}\n'  # NaN is a value: sent as null
        "\xff\xfe\n"
        '{"step": 3, "train/loss": 1.5}\n'
    )
    got = TestClient(create_app(tmp_path / "runs")).get("/api/runs/r/metrics").json()
    assert got["skipped_lines"] == 5 and got["lines"] == 3
    assert got["series"]["train/loss"] == {"steps": [1, 2, 3], "values": [2.0, None, 1.5]}
    assert "note" not in got["keys"]


def test_a_live_run_is_read_incrementally(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": float(s)}) + "\n" for s in range(1, 6)))
    log = MetricsLog(RunsRoot(tmp_path), str(path))
    parsed = []
    for name in ("_parse", "_parse_lines"):
        original = getattr(log, name)

        def spy(data, _original=original):
            data = list(data) if not isinstance(data, bytes) else data
            parsed.append(b"".join(data) if isinstance(data, list) else data)
            return _original(data)

        setattr(log, name, spy)
    assert log.refresh() and log.lines == 5
    first = path.stat().st_size
    with open(path, "a") as f:
        f.write('{"step": 6, "loss": 6.0}\n{"step": 7, "lo')  # the last line is being written
    parsed.clear()
    assert log.refresh()
    assert parsed == [b'{"step": 6, "loss": 6.0}\n']  # only the new complete line
    assert log.offset == first + len(parsed[0]) and log.skipped == 1  # the half line, for now
    with open(path, "a") as f:
        f.write('ss": 7.0}\n')
    assert log.refresh() and log.lines == 7 and log.skipped == 0
    assert log.series("loss")[1].tolist() == [float(s) for s in range(1, 8)]


def test_a_step_logged_again_after_a_resume_keeps_its_last_value(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        "".join(
            json.dumps({"step": s, "loss": v}) + "\n" for s, v in [(1, 1.0), (2, 2.0), (3, 3.0)]
        )
    )
    log = MetricsLog(RunsRoot(tmp_path), str(path))
    log.refresh()
    with open(path, "a") as f:  # killed after step 3, resumed from the checkpoint of step 1
        f.write(
            "".join(
                json.dumps({"step": s, "loss": v}) + "\n"
                for s, v in [(2, 20.0), (3, 30.0), (4, 40.0)]
            )
        )
    log.refresh()
    steps, values = log.series("loss")
    assert steps.tolist() == [1, 2, 3, 4] and values.tolist() == [1.0, 20.0, 30.0, 40.0]


def test_downsampling_keeps_every_bucket_min_and_max():
    rng = np.random.default_rng(3)
    steps = np.arange(1, 100_001)
    values = rng.normal(size=steps.size)
    values[[17, 50_003, 99_998]] = [40.0, -35.0, 25.0]  # spikes
    s, v = downsample(steps, values, 2000)
    assert len(s) <= 2001 and np.all(np.diff(s) > 0)
    assert {17 + 1, 50_003 + 1, 99_998 + 1} <= set(s.tolist())
    width = steps.size // 1000
    for b in range(1000):  # an independent per-bucket loop
        chunk = values[b * width : (b + 1) * width]
        inside = (s > b * width) & (s <= (b + 1) * width)
        assert v[inside].min() == chunk.min() and v[inside].max() == chunk.max()
    assert s[-1] == steps[-1]


def test_a_million_points_are_downsampled_by_the_endpoint(tmp_path):
    run = tmp_path / "runs" / "big"
    run.mkdir(parents=True)
    n = 20_000
    run.joinpath("metrics.jsonl").write_text(
        "".join(
            f'{{"step": {s}, "train/loss": {math.sin(s / 500):.6f}}}\n' for s in range(1, n + 1)
        )
    )
    got = (
        TestClient(create_app(tmp_path / "runs")).get("/api/runs/big/metrics?max_points=500").json()
    )
    series = got["series"]["train/loss"]
    assert got["downsampled"] and got["lines"] == n and len(series["steps"]) <= 501
    assert max(series["values"]) == pytest.approx(1.0, abs=1e-5)
    assert min(series["values"]) == pytest.approx(-1.0, abs=1e-5)
    bad = TestClient(create_app(tmp_path / "runs")).get("/api/runs/big/metrics?max_points=3")
    assert bad.status_code == 400 and "max_points=3" in bad.json()["error"]


def test_a_long_run_opens_as_a_sampled_preview_then_exactly(tmp_path, monkeypatch):
    monkeypatch.setattr(_runs, "PREVIEW_ABOVE_BYTES", 16 << 10)  # this file is ~240 KB
    monkeypatch.setattr(_metrics, "PREVIEW_WINDOWS", 40)
    monkeypatch.setattr(_metrics, "PREVIEW_WINDOW_BYTES", 200)
    monkeypatch.setattr(_metrics, "PREVIEW_TAIL_BYTES", 1024)
    n, spike, corrupt_at = 5000, 2345, 3001
    loss = {s: 99.0 if s == spike else 1.0 + (s % 7) / 10 for s in range(1, n + 1)}
    text = "".join(
        json.dumps({"step": s, "train/loss": loss[s], "tps": 1e3 + s})
        + "\n"
        + ('{"step": 3001, "train/loss": 1.0\n' if s == corrupt_at else "")
        for s in range(1, n + 1)
    )
    run = tmp_path / "runs" / "long"
    run.mkdir(parents=True)
    run.joinpath("metrics.jsonl").write_text(text)
    parse_may_start = threading.Event()
    refresh = MetricsLog.refresh

    def held_refresh(self):  # the background parse waits until the preview is checked
        assert parse_may_start.wait(20)
        return refresh(self)

    monkeypatch.setattr(MetricsLog, "refresh", held_refresh)
    client = TestClient(create_app(tmp_path / "runs", index_in_background=False))
    first = client.get("/api/runs/long/metrics?keys=train/loss&max_points=100000").json()
    detail = client.get("/api/runs/long").json()
    assert first["partial"] and detail["partial"] and detail["summary"]["partial"]
    # The tail is read whole: the last step and the last values are exact.
    assert first["last_step"] == n and detail["summary"]["step"] == n
    assert detail["summary"]["loss"] == loss[n]
    # The sample: real lines from the whole file, a count estimated within 10%.
    steps, values = first["series"]["train/loss"]["steps"], first["series"]["train/loss"]["values"]
    assert 60 <= len(steps) < n // 10 and steps[0] < n // 20 and steps[-1] == n
    assert values == [loss[s] for s in steps]
    assert abs(first["lines"] - n) < n // 10
    parse_may_start.set()
    deadline = time.monotonic() + 60
    while (got := client.get("/api/runs/long/metrics?keys=train/loss&max_points=500").json())[
        "partial"
    ]:
        assert time.monotonic() < deadline, "the background parse did not finish"
        time.sleep(0.05)
    assert got["lines"] == n and got["skipped_lines"] == 1 and got["downsampled"]
    assert max(got["series"]["train/loss"]["values"]) == 99.0  # the spike the sample missed
    assert spike in got["series"]["train/loss"]["steps"]
    assert not client.get("/api/runs/long").json()["partial"]


def test_since_step_returns_only_new_lines(folder, client):
    before = client.get("/api/runs/live/metrics?keys=train/loss").json()["last_step"]
    folder.live_run.append(3)
    got = client.get(f"/api/runs/live/metrics?keys=train/loss&since_step={before}").json()
    assert got["series"]["train/loss"]["steps"] == [before + 1, before + 2, before + 3]


def test_the_event_stream_sends_a_new_step_within_two_seconds(folder):
    with DashboardServer(folder.root) as url:
        start = folder.live_run.append()
        got: dict = {}

        def read():
            with httpx.stream(
                "GET", f"{url}api/runs/live/stream?keys=train/loss&since_step={start}", timeout=10
            ) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        got.update(json.loads(line[6:]))
                        got["at"] = time.monotonic()
                        return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(0.3)
        written = time.monotonic()
        folder.live_run.append()
        reader.join(10)
    assert got["series"]["train/loss"]["steps"] == [start + 1]
    assert got["at"] - written < 10.0  # issue: 2 s; loose for a loaded CI machine


# -- MFU: its denominator


def test_the_measured_peak_is_at_least_a_timed_matmul_of_any_size():
    """MFU over 100% means the peak was read low: no matmul may beat it (the README's 154%).

    The machine's load changes from second to second, so the peak is measured just before
    and just after the matmuls are timed, and the higher of the two counts.
    """
    import jax
    import jax.numpy as jnp

    from meltemi.levanter.trainer import _trainer

    def peak() -> float:
        _trainer._PEAK_FLOPS.clear()
        return _trainer.measure_peak_flops()

    before, rates = peak(), {}
    for size in (192, 256, 512, 1024):
        a = jnp.ones((size, size), jnp.float32)
        f = jax.jit(lambda x: x @ x)
        f(a).block_until_ready()
        best, start = float("inf"), time.perf_counter()
        while time.perf_counter() - start < 0.1:
            t = time.perf_counter()
            f(a).block_until_ready()
            best = min(best, time.perf_counter() - t)
        rates[size] = 2 * size**3 / best
    measured = max(before, peak())
    # 2x: this machine's rate swings 2x within seconds (other jobs); a peak read at 1024 only
    # (the old measurement) was 2-4x below the small sizes' (see the next test).
    assert max(rates.values()) <= 2 * measured, (f"peak {measured:.3g} FLOP/s", rates)


def test_one_quiet_moment_of_the_measurement_is_the_peak(monkeypatch):
    """On a busy machine most repetitions run slow; the peak is the fastest of all sizes and
    repetitions (a fake clock: every matmul takes 10 ms but one 256x256 one takes 0.1 ms)."""
    from meltemi.levanter.trainer import _trainer

    clock, calls = [0.0], []

    class Matmul:
        def __init__(self, size):
            self.size = size

        def __call__(self, a):
            calls.append(self.size)
            quiet = self.size == 256 and calls.count(256) == 6  # the warm-up call is the 1st
            clock[0] += 1e-4 if quiet else 1e-2
            return self

        def block_until_ready(self):
            return self

    monkeypatch.setattr(_trainer.jax, "device_put", lambda a, d: a)
    monkeypatch.setattr(_trainer.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(_trainer.jnp, "ones", lambda shape, dtype: shape[0])
    monkeypatch.setattr(_trainer, "_PEAK_FLOPS", {})

    def jit(f):  # the size is the array's (jnp.ones is faked to return the size)
        return lambda a: Matmul(a)(a)

    monkeypatch.setattr(_trainer.jax, "jit", jit)
    got = _trainer.measure_peak_flops()
    assert got == pytest.approx(2 * 256**3 / 1e-4)


def test_cpu_devices_of_one_process_share_one_peak():
    import jax

    from meltemi.levanter.trainer import measure_peak_flops
    from meltemi.levanter.trainer._trainer import peak_flops

    cpu = jax.devices("cpu")[0]
    # --xla_force_host_platform_device_count=4: four devices on the same cores, not 4x the peak
    assert peak_flops([cpu] * 4) == peak_flops([cpu]) == measure_peak_flops()


# -- a bucket path


def test_a_bucket_folder_is_read_through_fsspec(folder, tmp_path):
    bucket = tmp_path / "gcs" / "bucket"
    bucket.mkdir(parents=True)
    shutil.copytree(folder.root / "failed", bucket / "runs" / "failed")
    _fake_gcs.install_filesystem(str(tmp_path / "gcs"))
    gcs = TestClient(create_app("gs://bucket/runs"))
    rows = gcs.get("/api/runs").json()["runs"]
    assert [(r["id"], r["state"], r["step"], r["skipped_lines"]) for r in rows] == [
        ("failed", "failed", 4, 2)
    ]
    assert gcs.get("/api/runs/failed/metrics?keys=train/loss").json()["series"]["train/loss"][
        "steps"
    ] == [1, 2, 3, 4]
    assert gcs.get("/api/runs/..%2f..%2fetc/metrics").status_code == 403
