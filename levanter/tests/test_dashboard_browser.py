"""The dashboard's pages in real headless Chromium (Debian's chromium + chromedriver, which
`./bazelw` installs), on the runs folder of `dashboard_testing` (the tiny default config trained
for real, plus failed, live, elastic, mixture and sweep runs written as the trainer would).

Every number checked on a page is compared with the run's files on disk, read here with json.
Screenshots of each page go to $TEST_UNDECLARED_OUTPUTS_DIR (Bazel keeps them as test outputs).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import threading
import time

import pytest
from dashboard_testing import build_runs_folder
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from meltemi.levanter.dashboard import DashboardServer, _metrics, _runs
from meltemi.levanter.dashboard._app import STATIC_DIR

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
#: Issue #38 asks for a new step on screen within 2 s; the page follows the server's event
#: stream (measured 0.3-0.6 s, printed by the test). The deadline here is looser so a loaded
#: 2-core CI machine does not fail it; a page that polls slowly or reloads still fails.
LIVE_DEADLINE_S = 10.0


def _lines(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _good_lines(path: pathlib.Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return [r for r in out if isinstance(r, dict) and "step" in r]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory):
    return build_runs_folder(tmp_path_factory.mktemp("dash") / "runs")


@pytest.fixture(scope="module")
def url(folder):
    with DashboardServer(folder.root) as base:
        yield base


@pytest.fixture(scope="module")
def browser(url):  # quits before the server stops: no open connection holds the server up
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.path.exists(path):
            pytest.fail(
                f"{path} is missing: run `./bazelw` once (it installs Debian's chromium and "
                "chromium-driver) or `apt-get install -y chromium chromium-driver`."
            )
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--hide-scrollbars"):  # fmt: skip
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    yield driver
    driver.quit()


def _open(browser, url: str, hash_: str) -> None:
    """Loads a page and waits until its view has rendered (body[data-ready=1])."""
    browser.get("about:blank")
    browser.get(url + hash_)
    _wait(lambda: browser.execute_script("return document.body.dataset.ready") == "1", 20, hash_)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, f"{hash_}: console errors {errors}"
    shown = _all(browser, "[data-testid=error]")
    assert not shown, f"{hash_}: the page shows an error: {shown[0].text}"


def _wait(cond, timeout: float, what: str) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if cond():
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _screenshot(browser, name: str) -> pathlib.Path:
    out = pathlib.Path(os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR", "/tmp/dashboard_screenshots"))
    out.mkdir(parents=True, exist_ok=True)
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1400, min(max(height, 900), 4000))
    time.sleep(0.3)  # charts resize on the next frame
    path = out / f"dashboard_{name}.png"
    browser.save_screenshot(str(path))
    browser.set_window_size(1400, 1000)
    return path


def _all(node, css: str) -> list:
    return node.find_elements(By.CSS_SELECTOR, css)


def _one(node, css: str):
    return node.find_element(By.CSS_SELECTOR, css)


def _ids(browser, css: str, attr: str) -> list[str]:
    return [e.get_attribute(attr) for e in _all(browser, css)]


def _cell(row, col: str) -> str:
    return row.find_element(By.CSS_SELECTOR, f"[data-col='{col}']").text


def _chart(browser, name: str) -> dict:
    """The series a chart plots: {label: (steps, values)}."""
    series = browser.execute_script(
        "return window.__charts[arguments[0]].spec.series.map(s => [s.label, s.steps, s.values])",
        name,
    )
    return {label: (steps, values) for label, steps, values in series}


def test_runs_list_shows_each_run_as_on_disk(browser, url, folder):
    folder.live_run.append(1)  # written just now: running
    _open(browser, url, "#/runs")
    rows = {r.get_attribute("data-run"): r for r in _all(browser, "tr[data-run]")}
    on_disk = {
        p.parent.relative_to(folder.root).as_posix() for p in folder.root.rglob("metrics.jsonl")
    }
    assert set(rows) == on_disk
    for run_id, row in rows.items():
        lines = _good_lines(folder.root / run_id / "metrics.jsonl")
        config = json.loads((folder.root / run_id / "config.json").read_text())["config"]
        last = lines[-1]
        assert (
            _cell(row, "step") == f"{last['step']:,} / {config['trainer']['num_train_steps']:,}"
        ), run_id
        assert float(_cell(row, "loss")) == pytest.approx(last["train/loss"], abs=0.51e-4), run_id
        assert float(_cell(row, "mfu").rstrip("%")) == pytest.approx(
            100 * last["throughput/mfu"], abs=0.051
        )
    states = {r: _cell(rows[r], "state") for r in ("tiny", "failed", "live", "elastic", "mixture")}
    assert states == {"tiny": "finished", "failed": "failed", "live": "running",
                      "elastic": "degraded", "mixture": "finished"}  # fmt: skip
    # every resource came from this server: no CDN
    origins = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
    )
    assert origins and all(o.startswith(url) for o in origins), origins
    _screenshot(browser, "runs")


def test_runs_list_sorts_by_a_column_and_filters_by_name(browser, url, folder):
    _open(browser, url, "#/runs")
    _one(browser, "th[data-sort='loss']").click()
    shown = _ids(browser, "tr[data-run]", "data-run")
    loss = {r: _good_lines(folder.root / r / "metrics.jsonl")[-1]["train/loss"] for r in shown}
    assert shown == sorted(shown, key=lambda r: loss[r])
    _one(browser, "th[data-sort='loss']").click()  # again: descending
    shown = _ids(browser, "tr[data-run]", "data-run")
    assert shown == sorted(shown, key=lambda r: -loss[r])
    _one(browser, "[data-testid=filter]").send_keys("sweep/")
    shown = _ids(browser, "tr[data-run]", "data-run")
    on_disk = [f"sweep/runs/{p.name}" for p in (folder.root / "sweep" / "runs").iterdir()]
    assert len(on_disk) == 8 and sorted(shown) == sorted(on_disk)


def test_run_page_plots_the_metrics_and_evals_on_disk(browser, url, folder):
    _open(browser, url, "#/run/tiny")
    lines = _lines(folder.root / "tiny" / "metrics.jsonl")
    loss = _chart(browser, "loss")
    assert loss["train/loss"] == ([r["step"] for r in lines], [r["train/loss"] for r in lines])
    evals = [r for r in lines if "eval/stdlib/loss" in r]
    assert len(evals) == 2
    assert loss["eval/stdlib/loss"] == (
        [r["step"] for r in evals],
        [r["eval/stdlib/loss"] for r in evals],
    )
    assert _chart(browser, "lr")["optim/learning_rate"][1] == [
        r["optim/learning_rate"] for r in lines
    ]
    assert _chart(browser, "norms")["optim/grad_norm"][1] == [r["optim/grad_norm"] for r in lines]
    table = _one(browser, "table[data-table=eval]")
    shown = [[float(td.text) for td in tr.find_elements(By.TAG_NAME, "td")]
             for tr in table.find_elements(By.CSS_SELECTOR, "tbody tr")]  # fmt: skip
    assert shown == [
        [r["step"], round(r["eval/stdlib/bpb"], 4), round(r["eval/stdlib/loss"], 4)] for r in evals
    ]
    ckpts = sorted(p.name for p in (folder.root / "tiny" / "checkpoints").iterdir() if p.is_dir())
    rows = _all(browser, "tr[data-step]")
    assert [int(r.get_attribute("data-step")) for r in rows] == [
        int(c.split("_")[-1]) for c in ckpts
    ]
    assert "checksums" in _cell(rows[0], "checksum_state")
    assert _one(browser, "[data-testid=step]").text == f"{lines[-1]['step']} / 6"
    _screenshot(browser, "run")


def test_run_page_log_x_and_smoothing_change_the_plot(browser, url, folder):
    _open(browser, url, "#/run/tiny")
    raw = _chart(browser, "loss")["train/loss"][1]
    slider = _one(browser, "[data-testid=smoothing]")
    slide = "arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input'))"
    browser.execute_script(slide, slider, 0.6)
    plotted = browser.execute_script("return window.__charts.loss.spec.smoothing")
    assert plotted == 0.6
    _one(browser, "[data-testid=logx]").click()
    assert browser.execute_script("return window.__charts.loss.spec.logX") is True
    # the drawn data: uPlot's own copy, smoothed by the debiased EMA of TensorBoard
    drawn = browser.execute_script("return window.__charts.loss.plotData()[1]")
    ema, expected = 0.0, []
    for n, v in enumerate(raw, 1):
        ema = 0.6 * ema + 0.4 * v
        expected.append(ema / (1 - 0.6**n))
    assert drawn == pytest.approx(expected, rel=1e-12)
    browser.execute_script(slide, slider, 0)
    _one(browser, "[data-testid=logx]").click()


def test_mixture_run_marks_skipped_steps_and_fractions_against_weights(browser, url, folder):
    _open(browser, url, "#/run/mixture")
    lines = _lines(folder.root / "mixture" / "metrics.jsonl")
    skipped = [r["step"] for r in lines if r.get("optim/skipped") == 1]
    assert skipped == [7, 12]
    items = _all(browser, "[data-testid=skips] li")
    assert [int(i.get_attribute("data-step")) for i in items[: len(skipped)]] == skipped
    assert "loss_spike" in items[0].text and "loss_not_finite, grad_norm_spike" in items[1].text
    markers = browser.execute_script("return window.__charts.loss.spec.markers.map(m => m.step)")
    assert markers == skipped
    config = json.loads((folder.root / "mixture" / "config.json").read_text())["config"]["data"]
    last_stage_start, weights = config["weight_stages"][-1]
    for comp in ("code", "prose"):
        row = _one(browser, f"tr[data-component={comp}]")
        stage = [r[f"data/{comp}/fraction"] for r in lines if r["step"] > last_stage_start]
        assert _cell(row, "fraction").endswith(f"{100 * sum(stage) / len(stage):.1f}%")
        assert _cell(row, "weight").endswith(f"{100 * weights[comp]:.1f}%")
        every = [r[f"data/{comp}/fraction"] for r in lines]
        assert _cell(row, "fraction_all") == f"{100 * sum(every) / len(every):.1f}%"
    harness = _one(browser, "table[data-table=harness]")
    values = [
        float(td.text)
        for td in harness.find_elements(By.CSS_SELECTOR, "td[data-col='arc_easy/acc']")
    ]
    assert values == [r["harness/arc_easy/acc"] for r in lines if "harness/arc_easy/acc" in r]
    _screenshot(browser, "mixture")


def test_live_run_shows_each_new_step_within_two_seconds_without_reload(browser, url, folder):
    live = folder.live_run
    live.append(1)  # fresh mtime: the run counts as running
    _open(browser, url, "#/run/live")
    browser.execute_script("window.__same_page = true")
    step_card = _one(browser, "[data-testid=step]")
    assert step_card.text.startswith(f"{live.step} / ")
    waits = []
    for _ in range(3):
        step = live.append(1)
        shown = lambda s=step: step_card.text.startswith(f"{s:,} / ")  # noqa: E731
        waits.append(_wait(shown, LIVE_DEADLINE_S, f"step {step}"))
    assert browser.execute_script("return window.__same_page") is True  # no reload
    steps, values = _chart(browser, "loss")["train/loss"]
    lines = _lines(live.path)
    assert steps == [r["step"] for r in lines] and values == [r["train/loss"] for r in lines]
    print(f"live: new steps shown after {', '.join(f'{w:.2f}' for w in waits)} s")
    with live:  # the helper's own thread appends every 0.5 s
        start = live.step
        _wait(lambda: live.step >= start + 3, 10, "the live thread")
        shown = lambda: step_card.text.startswith(f"{live.step:,} / ")  # noqa: E731
        _wait(shown, LIVE_DEADLINE_S, "the live thread's step")
    _screenshot(browser, "live")
    browser.get("about:blank")  # closes the event stream, so the server can stop at once


def test_compare_page_overlays_runs_and_diffs_configs_with_sources(browser, url, folder):
    _open(browser, url, "#/compare?runs=tiny,mixture")
    overlay = _chart(browser, "compare")
    for run in ("tiny", "mixture"):
        lines = _lines(folder.root / run / "metrics.jsonl")
        assert overlay[run] == ([r["step"] for r in lines], [r["train/loss"] for r in lines])
    saved = {
        r: json.loads((folder.root / r / "config.json").read_text()) for r in ("tiny", "mixture")
    }
    row = _one(browser, "tr[data-key='trainer.num_train_steps']")
    cells = row.find_elements(By.CSS_SELECTOR, "td.val")
    for run, cell in zip(("tiny", "mixture"), cells, strict=True):
        steps = saved[run]["config"]["trainer"]["num_train_steps"]
        assert cell.find_element(By.CSS_SELECTOR, ".mono").text == str(steps)
        source = saved[run]["provenance"]["trainer.num_train_steps"]
        assert cell.find_element(By.CSS_SELECTOR, ".src").text == source
    assert not _all(browser, "tr[data-key='model.num_layers']")  # equal
    _screenshot(browser, "compare")


def test_slices_page_shows_each_slice_and_the_events_of_status_json(browser, url, folder):
    _open(browser, url, "#/run/elastic/slices")
    status = json.loads((folder.root / "elastic" / "status.json").read_text())
    rows = _all(browser, "tr[data-slice]")
    assert len(rows) == len(status["slices"])
    for row, s in zip(rows, status["slices"], strict=True):
        assert _cell(row, "state") == s["state"]
        assert _cell(row, "last_exit") == (s["last_exit"] or "—")
        assert _cell(row, "restarts") == str(s["restarts"])
        assert _cell(row, "step") == str(s["step"])  # each slice's own
    assert [_cell(row, "step") for row in rows] == ["8", "5"]  # not the job's 8 twice
    kinds = _ids(browser, "[data-testid=events] li", "data-kind")
    assert kinds == [e["kind"] for e in status["events"]]
    assert len(_all(browser, "[data-testid=timeline] .ev")) == len(kinds)
    _screenshot(browser, "slices")


def test_a_long_run_shows_a_sampled_preview_then_the_exact_curves(
    browser, url, folder, monkeypatch
):
    monkeypatch.setattr(_runs, "PREVIEW_ABOVE_BYTES", 16 << 10)  # this file is ~240 KB
    monkeypatch.setattr(_metrics, "PREVIEW_WINDOWS", 40)
    monkeypatch.setattr(_metrics, "PREVIEW_WINDOW_BYTES", 200)
    monkeypatch.setattr(_metrics, "PREVIEW_TAIL_BYTES", 1024)
    n, spike = 5000, 2345
    loss = {s: 99.0 if s == spike else 1.0 + (s % 7) / 10 for s in range(1, n + 1)}
    run = folder.root / "long"
    run.mkdir()
    run.joinpath("metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "train/loss": loss[s]}) + "\n" for s in loss)
    )
    parse_may_start, refresh = threading.Event(), _metrics.MetricsLog.refresh

    def held_refresh(self):  # this run's background parse waits until the preview is seen
        if self.path.endswith("/long/metrics.jsonl"):
            assert parse_may_start.wait(20)
        return refresh(self)

    monkeypatch.setattr(_metrics.MetricsLog, "refresh", held_refresh)

    def note() -> str:
        try:
            return _one(browser, "[data-testid=lines]").text
        except (NoSuchElementException, StaleElementReferenceException):  # being redrawn
            return ""

    try:
        _open(browser, url, "#/run/long")
        assert "sampled preview" in note()
        steps, values = _chart(browser, "loss")["train/loss"]
        assert 60 <= len(steps) < n // 10 and steps[-1] == n
        assert values == [loss[s] for s in steps]  # real lines of the file
        _screenshot(browser, "preview")
        parse_may_start.set()
        _wait(lambda: note() == f"{n:,} lines", 30, "the exact page after the background parse")
        steps, values = _chart(browser, "loss")["train/loss"]
        assert max(values) == 99.0 and spike in steps  # min/max downsampling of every line
        assert len(steps) <= 2001
    finally:
        parse_may_start.set()
        shutil.rmtree(run)  # the other tests' runs list stays the folder's


def test_provenance_page_shows_the_documents_and_text_of_a_row(browser, url, folder):
    _open(browser, url, "#/run/tiny/data?step=2&row=1")
    # independent of the server: the byte tokenizer's ids of each document decode to its text
    docs = browser.execute_script(
        "return fetch('api/runs/tiny/provenance?step=2&row=1').then(r => r.json())"
    )["documents"]  # fmt: skip
    text = _one(browser, "[data-testid=row-text]").get_attribute("textContent")
    assert text == "".join(bytes(d["token_ids"]).decode("utf-8", "replace") for d in docs)
    rows = _all(browser, "tr[data-document]")
    assert [int(r.get_attribute("data-document")) for r in rows] == [d["document"] for d in docs]
    assert [_cell(r, "path") for r in rows] == [d["path"] for d in docs]
    config = json.loads((folder.root / "tiny" / "config.json").read_text())["config"]
    assert sum(d["tokens"] for d in docs) == config["data"]["seq_len"]
    _screenshot(browser, "provenance")


def test_sweep_page_plots_the_points_fits_and_verified_prediction(browser, url, folder):
    _open(browser, url, "#/sweep/sweep")
    iso = json.loads((folder.root / "sweep" / "isoflop.json").read_text())
    verified = json.loads((folder.root / "sweep" / "verification.json").read_text())
    points = browser.execute_script(
        "return window.__charts.isoflop.spec.points.filter(p => p.label.endsWith('runs'))"
        ".flatMap(p => p.x.map((x, i) => [x, p.y[i]]))"
    )  # fmt: skip
    assert sorted(map(tuple, points)) == sorted((r["n_params"], r["loss"]) for r in iso["runs"])
    shown = _one(browser, "[data-testid=actual-loss]").text
    assert float(shown) == pytest.approx(verified["actual"], abs=0.51e-4)
    inside = _one(browser, "[data-testid=inside]").text
    assert inside == ("yes" if verified["inside_interval"] else "no")
    _screenshot(browser, "sweep")


def test_index_html_maps_every_module_for_token_mode():
    static = pathlib.Path(STATIC_DIR)
    modules = sorted(p.relative_to(static).as_posix() for p in static.rglob("*.js"))
    listed = re.search(r"const MODULES = \[(.*?)\];", (static / "index.html").read_text(), re.S)
    assert listed is not None
    assert sorted(re.findall(r'"([^"]+)"', listed.group(1))) == modules


def test_pages_load_with_a_token_when_served_beyond_loopback(browser, folder):
    token = "t0ken-for-the-browser-test"
    with DashboardServer(folder.root, token=token) as base:
        browser.get("about:blank")
        browser.get(f"{base}#/runs")  # without the token: the server refuses the page itself
        assert "token is required" in browser.find_element(By.TAG_NAME, "body").text
        browser.get_log("browser")  # drops that page's expected 401s
        _open(browser, f"{base}?token={token}", "#/run/mixture")
        assert _one(browser, "[data-testid=step]").text == "20 / 20"
        assert _chart(browser, "loss")["train/loss"][0] == list(range(1, 21))
        browser.get("about:blank")
